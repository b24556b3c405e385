"""Carry out a :class:`~t4patch.patching.plan.Plan`: the only module that writes into a target environment.

Each file is replaced atomically (temp file in the same directory, fsync, ``os.replace``, mode kept), so a
crash leaves every file either fully old or fully new, and both states are recognised by hash. Stale
bytecode of the patched modules is removed so Python cannot keep running the old code from ``__pycache__``.
An flock on the site-packages directory itself serialises concurrent runs without leaving a lock file
behind, and the state record is written last.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from t4patch.errors import LockBusyError, TargetEnvironmentError
from t4patch.patching.plan import FileChange, Plan
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
def environment_locks(roots: list[Path]) -> Iterator[None]:
    """Lock several site-packages dirs (sorted, so two runs never wait on each other in a cycle)."""
    with contextlib.ExitStack() as stack:
        for root in sorted(set(roots)):
            stack.enter_context(environment_lock(root))
        yield


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically, keeping its permission bits."""
    mode = stat.S_IMODE(path.stat().st_mode)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".t4patch-tmp", dir=path.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def remove_bytecode(source: Path) -> list[Path]:
    """Delete cached bytecode of ``source`` (``__pycache__/<stem>.*.pyc`` and a legacy ``<name>c``)."""
    removed = []
    if source.suffix != ".py":
        return removed
    candidates = list((source.parent / "__pycache__").glob(f"{source.stem}.*.pyc"))
    candidates.append(source.with_suffix(".pyc"))
    for pyc in candidates:
        if pyc.exists():
            pyc.unlink()
            removed.append(pyc)
    return removed


def check_writable(plans: list[Plan]) -> None:
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


def execute(plans: list[Plan]) -> list[Path]:
    """Write every change of ``plans`` and update their state records; return the files written.

    Must run under :func:`environment_lock` for the plans' site-packages, with the plans made under the same
    lock, so no other run can change a file between its hash check and its replacement. If a write fails
    midway (disk full, a read-only mount inside site-packages), the files already written get their old
    bytes back, so the command fails as a whole instead of leaving an engine half patched.
    """
    check_writable(plans)
    done: list[FileChange] = []
    try:
        for plan in plans:
            for change in plan.changes:
                atomic_write(change.status.absolute, change.new_bytes)
                done.append(change)
                remove_bytecode(change.status.absolute)
    except OSError as exc:
        failed = f"{exc.filename or 'a target file'} ({exc.strerror or exc})"
        for change in reversed(done):
            atomic_write(change.status.absolute, change.old_bytes)
        raise TargetEnvironmentError(
            f"writing {failed} failed; the {len(done)} file(s) already written were restored, nothing changed",
            hint="fix the cause (free space, permissions, read-only mounts), then run the command again",
        ) from None
    for plan in plans:
        if plan.is_noop:
            continue  # nothing changed: leave the record (and its date) as it was
        if plan.operation == "apply":
            write_record(plan.patch_set, plan.distribution)
        else:
            remove_record(plan.distribution)
    return [change.status.absolute for change in done]
