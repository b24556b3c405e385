"""Carry out plans under the environment lock: the only module that writes into a target environment.

Planning and writing are tied together here: :func:`locked` takes the lock on every site-packages involved and
yields a :class:`Lease`, and only plans made through that lease (``lease.plan(...)``) can be committed
(:func:`commit` refuses any other plan). So no plan made before the lock — when another run could still change
the files between the hash check and the write — can ever be written.

Each file is replaced atomically (:mod:`t4patch.fileio.atomic`: temp file in the same directory, fsync,
``os.replace``, mode and owner kept, directory fsync), so a crash leaves every file either fully old or fully
new, and both states are recognised by hash. Stale bytecode of the patched modules is removed once every file
is written, so Python cannot keep running the old code from ``__pycache__``. An flock on the site-packages
directory itself serialises concurrent runs without leaving a lock file behind, and the state record is
written last.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from t4patch.environment.target import InstalledDistribution
from t4patch.errors import LockBusyError, TargetEnvironmentError
from t4patch.fileio.atomic import write_bytes_atomic
from t4patch.patching.manifest import PatchSet
from t4patch.patching.plan import FileChange, Operation, Plan, make_plan
from t4patch.patching.state import remove_record, write_record

LOCK_TIMEOUT_S = 60.0


@contextlib.contextmanager
def environment_lock(root: Path, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold an exclusive lock on ``root`` (a site-packages dir) while planning and writing."""
    if not os.access(root, os.W_OK):
        raise TargetEnvironmentError(
            f"cannot write in {root}; expected a site-packages directory this user may change",
            hint="run as the owner of that environment, or target a venv with --python",
        )
    # flock on the directory itself: Linux supports it, and no lock file is left in the environment.
    fd = os.open(root, os.O_RDONLY)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LockBusyError(
                        f"another t4patch run has held the lock on {root} for over {timeout_s:.0f} s",
                        hint="wait for it to finish, then run the command again",
                    ) from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # closing releases the flock


@contextlib.contextmanager
def environment_locks(roots: Sequence[Path]) -> Iterator[None]:
    """Lock several site-packages dirs (sorted, so two runs never wait on each other in a cycle)."""
    with contextlib.ExitStack() as stack:
        for root in sorted(set(roots)):
            stack.enter_context(environment_lock(root))
        yield


class Lease:
    """Proof that this process holds the lock on ``roots``; the only source of plans that may be written."""

    def __init__(self, roots: frozenset[Path]) -> None:
        self._roots = roots
        self._issued: list[Plan] = []
        self._active = True

    def plan(self, patch_set: PatchSet, dist: InstalledDistribution, operation: Operation) -> Plan:
        """Read and hash ``dist``'s files now, under the lock, and plan ``operation`` (nothing is written)."""
        if not self._active:
            raise RuntimeError("the lease has ended: plans for writing must be made while the lock is held")
        if dist.root not in self._roots:
            raise RuntimeError(f"{dist.root} is not locked by this lease ({sorted(map(str, self._roots))})")
        plan = make_plan(patch_set, dist, operation)
        self._issued.append(plan)
        return plan

    def vouches_for(self, plan: Plan) -> bool:
        return self._active and any(p is plan for p in self._issued)

    def end(self) -> None:
        self._active = False


@contextlib.contextmanager
def locked(roots: Sequence[Path]) -> Iterator[Lease]:
    """Lock every site-packages dir in ``roots`` and yield the lease that plans (and so writes) under it."""
    with environment_locks(roots):
        lease = Lease(frozenset(roots))
        try:
            yield lease
        finally:
            lease.end()


def remove_bytecode(source: Path) -> list[Path]:
    """Delete cached bytecode of ``source`` (``__pycache__/<stem>.*.pyc`` and a legacy ``<name>c``)."""
    removed: list[Path] = []
    if source.suffix != ".py":
        return removed
    candidates = list((source.parent / "__pycache__").glob(f"{source.stem}.*.pyc"))
    candidates.append(source.with_suffix(".pyc"))
    for pyc in candidates:
        if pyc.exists():
            pyc.unlink()
            removed.append(pyc)
    return removed


def check_writable(plans: Sequence[Plan]) -> None:
    """Refuse before writing anything if any directory a plan writes into is not writable."""
    for plan in plans:
        for change in plan.changes:
            directory = change.status.absolute.parent
            if not os.access(directory, os.W_OK):
                raise TargetEnvironmentError(
                    f"cannot write in {directory}: expected every directory holding a patched file to be "
                    f"writable by this user; nothing was written",
                    hint="run as the owner of that environment, or target a venv you own with --python",
                )
        if not os.access(plan.distribution.dist_info, os.W_OK):
            raise TargetEnvironmentError(
                f"cannot write the state record in {plan.distribution.dist_info}; nothing was written",
                hint="run as the owner of that environment, or target a venv you own with --python",
            )


def commit(lease: Lease, plans: Sequence[Plan]) -> list[Path]:
    """Write every change of ``plans`` and update their state records; return the files written.

    Only plans made by ``lease`` while it holds the lock are accepted, so no other run can have changed a
    file between its hash check and its replacement. If a write fails midway (disk full, a read-only mount
    inside site-packages), the files already written get their old bytes back, so the command fails as a
    whole instead of leaving an engine half patched.
    """
    for plan in plans:
        if not lease.vouches_for(plan):
            raise RuntimeError(f"{plan.patch_set.spec}: plan was not made under this lease; refusing to write it")
    check_writable(plans)
    done: list[FileChange] = []
    try:
        for plan in plans:
            for change in plan.changes:
                write_bytes_atomic(change.status.absolute, change.new_bytes)
                done.append(change)
    except OSError as exc:
        failed = f"{exc.filename or 'a target file'} ({exc.strerror or exc})"
        for change in reversed(done):
            write_bytes_atomic(change.status.absolute, change.old_bytes)
        raise TargetEnvironmentError(
            f"writing {failed} failed; the {len(done)} file(s) already written were restored, nothing changed",
            hint="fix the cause (free space, permissions, read-only mounts), then run the command again",
        ) from None
    for change in done:
        remove_bytecode(change.status.absolute)
    for plan in plans:
        if plan.is_noop:
            continue  # nothing changed: leave the record (and its date) as it was
        if plan.operation == "apply":
            write_record(plan.patch_set, plan.distribution)
        else:
            remove_record(plan.distribution)
    return [change.status.absolute for change in done]
