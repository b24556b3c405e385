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
import errno
import fcntl
import os
import shlex
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from t4patch.environment.target import InstalledDistribution
from t4patch.errors import LockBusyError, TargetEnvironmentError
from t4patch.fileio.atomic import create_temp, existing_stat, fsync_dir
from t4patch.fileio.hashing import sha256_bytes
from t4patch.output import note
from t4patch.patching import journal as jr
from t4patch.patching.journal import NEW_SUFFIX, OLD_SUFFIX, Entry, Journal, Recovery
from t4patch.patching.journal_check import check_journal
from t4patch.patching.manifest import PatchSet
from t4patch.patching.plan import Operation, Plan, make_plan
from t4patch.patching.signals import Held, held_signals
from t4patch.patching.state import record_bytes, record_path

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
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise TargetEnvironmentError(f"cannot open {root} to lock it ({exc.strerror or exc})") from None
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
            except OSError as exc:  # e.g. ENOLCK on a filesystem without flock
                raise TargetEnvironmentError(
                    f"cannot lock {root} ({exc.strerror or exc}); t4patch writes only under an exclusive lock",
                    hint="target a site-packages on a local filesystem",
                ) from None
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

    def recover(self) -> list[Recovery]:
        """Finish or undo every set a dead run left half committed in the locked roots (see journal)."""
        if not self._active:
            raise RuntimeError("the lease has ended: recovery must run while the lock is held")
        done = []
        for path in jr.journal_paths(sorted(self._roots)):
            done.append(recover_journal(path))  # each journal names only the site-packages it lies in
        strays = jr.sweep_strays((root, jr.JOURNAL_NAME) for root in sorted(self._roots))
        if strays:
            note(f"removed {len(strays)} temp file(s) of an intent journal a killed run was writing (it had "
                 f"changed nothing yet): {_describe_paths(strays)}")
        return done

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


def recover_journal(path: Path) -> Recovery:
    """Recover the journal at ``path`` (lock held), turning a failure into a message about what is on disk.

    The journal is input: it is read, then checked against the site and the patch-set tree in use
    (:func:`~t4patch.patching.journal_check.check_journal`) before anything is touched.
    """
    journal = jr.read_journal(path)
    sets = check_journal(journal, path)
    reinstall = " && ".join(c.distribution.reinstall_command(c.patch_set.version) for c in sets)
    try:
        recovery = jr.recover(journal, path, reinstall)
    except OSError as exc:
        raise TargetEnvironmentError(
            f"finishing the interrupted commit in {path} failed ({exc.strerror or exc}: {exc.filename}); the "
            "journal is kept and every file it names is in its old or its new state, so no file is torn",
            hint=f"fix the cause (free space, permissions), then run: t4patch status --site-packages {shlex.quote(str(path.parent))}",
        ) from None
    # temp files of these targets the journal does not name (its run's own, or older runs') go as a commit's do
    jr.sweep_strays((e.path.parent, e.path.name) for e in journal.entries)
    note(recovery.line)
    return recovery


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


def check_record_dir(dist: InstalledDistribution) -> None:
    """Refuse a dist-info that resolves outside the site-packages (a directory symlink), as a target directory
    is refused: the state record written there would land outside the target."""
    if not jr.resolves_inside(dist.dist_info, dist.root):
        raise TargetEnvironmentError(
            f"{dist.dist_info} lies outside the target: it resolves to {os.path.realpath(dist.dist_info)}, which "
            f"is not under {os.path.realpath(dist.root)} (a directory symlink); t4patch writes its state record "
            "only inside the target, so nothing was written",
            hint=f"replace the symlinked directory with the real one ({dist.reinstall_command()})",
        )


def _refuse_non_file(path: Path, what: str) -> None:
    if os.path.lexists(path) and not path.is_symlink() and not path.is_file():
        raise TargetEnvironmentError(
            f"{path}: expected {what} to be a regular file or absent, found "
            f"{'a directory' if path.is_dir() else 'a special file'}; nothing was written",
            hint=f"move {path} away, then run the command again",
        )


def _entries(plans: Sequence[Plan], token: str) -> tuple[list[Entry], dict[Path, bytes]]:
    """The journal entries of ``plans`` (every changed file, then each state record) and their new bytes."""
    entries: list[Entry] = []
    data: dict[Path, bytes] = {}
    for plan in plans:
        for change in plan.changes:
            path = change.status.absolute
            entries.append(Entry(
                path, change.status.sha256, sha256_bytes(change.new_bytes),
                jr.stand_in(path, token, NEW_SUFFIX), jr.stand_in(path, token, OLD_SUFFIX),
                bytecode=path.suffix == ".py", patch_set=plan.patch_set.spec,
            ))
            data[path] = change.new_bytes
    for plan in plans:
        if plan.is_noop:
            continue  # nothing changed: leave the record (and its date) as it was
        path = record_path(plan.distribution)
        _refuse_non_file(path, "the state record")
        old = existing_stat(path) is not None or path.is_symlink()
        old_sha = _sha_or_none(path)
        if plan.operation == "apply":
            new = record_bytes(plan.patch_set)
            data[path] = new
            entries.append(Entry(path, old_sha, sha256_bytes(new), jr.stand_in(path, token, NEW_SUFFIX),
                                 jr.stand_in(path, token, OLD_SUFFIX) if old else None, soft=True,
                                 patch_set=plan.patch_set.spec))
        elif old:
            entries.append(Entry(path, old_sha, None, None, jr.stand_in(path, token, OLD_SUFFIX), soft=True,
                                 patch_set=plan.patch_set.spec))
    return entries, data


def _sha_or_none(path: Path) -> str | None:
    try:
        return sha256_bytes(path.read_bytes()) if path.is_file() and not path.is_symlink() else None
    except OSError:
        return None


def _keep_old(entry: Entry) -> None:
    """Keep the old bytes of ``entry.path`` under ``entry.kept``: a hard link (no space needed), else a copy."""
    assert entry.kept is not None
    try:
        os.link(entry.path, entry.kept, follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EXDEV, errno.ENOTSUP, errno.EMLINK, errno.EACCES):
            raise
        create_temp(entry.path, entry.path.read_bytes(), like=existing_stat(entry.path),
                    token=entry.kept.name.split(".")[-2], suffix=OLD_SUFFIX)


def _describe_paths(paths: Sequence[Path]) -> str:
    return ", ".join(str(p) for p in paths) or "none"


def _state_line(entries: Sequence[Entry]) -> str:
    """Which files hold their new and which their old bytes right now (hashed from disk)."""
    new = [e.path for e in entries if not e.soft and jr._holds(e.path, e.new_sha256)]
    old = [e.path for e in entries if not e.soft and e.path not in new]
    return f"new bytes: {_describe_paths(new)}; previous bytes: {_describe_paths(old)}"


def commit(lease: Lease, plans: Sequence[Plan]) -> list[Path]:
    """Write every change of ``plans`` and update their state records, all or nothing; return the files written.

    Only plans made by ``lease`` while it holds the lock are accepted, so no other run can have changed a
    file between its hash check and its replacement. The order makes the whole set crash consistent:
    checks → intent journal (fsynced, in every root) → stage every new file and keep every old one (fsynced)
    → rename each staged file over its target → fsync the directories → remove bytecode, the kept links and
    the journal. SIGINT/SIGTERM/SIGHUP/SIGQUIT are held from the journal to the end. An error before the
    first rename changes nothing; an error during the renames puts the replaced files back (renames only, so a
    full disk cannot stop it); if even that fails, the journal stays and the next t4patch command recovers.
    """
    for plan in plans:
        if not lease.vouches_for(plan):
            raise RuntimeError(f"{plan.patch_set.spec}: plan was not made under this lease; refusing to write it")
        check_record_dir(plan.distribution)
    strays = jr.sweep_strays(
        [(c.status.absolute.parent, c.status.absolute.name) for p in plans for c in p.changes]
        + [(s.absolute.parent, s.absolute.name) for p in plans for s in p.statuses]
        + [(p.distribution.dist_info, record_path(p.distribution).name) for p in plans]
        + [(p.distribution.root, jr.JOURNAL_NAME) for p in plans]
    )
    if strays:
        note(f"removed {len(strays)} leftover temp file(s) of an earlier, killed run: {_describe_paths(strays)}")
    check_writable(plans)
    token = jr.new_token()
    entries, data = _entries(plans, token)
    hard = [e for e in entries if not e.soft]
    if not hard:
        return []
    for entry in entries:
        _refuse_non_file(entry.path, "a patched file")
    roots = sorted({p.distribution.root for p in plans if not p.is_noop})
    for root in roots:
        _refuse_non_file(root / jr.JOURNAL_NAME, "the intent journal")
    journal = Journal.create(plans[0].operation, [p.patch_set.spec for p in plans if not p.is_noop], roots,
                             entries, token)
    with held_signals(note) as held:
        held.outcome = "nothing was changed"
        try:
            journal.write()
        except OSError as exc:
            raise TargetEnvironmentError(
                f"writing the intent journal in {_describe_paths(roots)} failed ({exc.strerror or exc}); "
                "nothing was changed",
                hint="fix the cause (free space, permissions, read-only mounts), then run the command again",
            ) from None
        _stage(journal, data)
        _rename_all(journal, held)
        held.outcome = f"the commit completed ({journal.description.split(' (')[0]}: every file has its new bytes)"
        _clean_up(journal)
    return [e.path for e in hard]


def _stage(journal: Journal, data: dict[Path, bytes]) -> None:
    """Write every staged file and keep every old one; on failure remove them all and the journal."""
    created: list[Path] = []
    current: Path | None = None
    try:
        for entry in journal.entries:
            current = entry.path
            if entry.staged is not None:
                create_temp(entry.path, data[entry.path], like=existing_stat(entry.path), token=journal.token,
                            suffix=NEW_SUFFIX)
                created.append(entry.staged)
            if entry.kept is not None:
                _keep_old(entry)
                created.append(entry.kept)
        for directory in sorted({e.path.parent for e in journal.entries}):
            current = directory
            fsync_dir(directory)
    except OSError as exc:
        cleanup = ""
        try:
            for path in created:
                path.unlink(missing_ok=True)
            journal.remove()
        except OSError as again:
            cleanup = (f"; removing the staged files failed too ({again.strerror or again}), the next t4patch "
                       "command removes them")
        raise TargetEnvironmentError(
            f"staging the new bytes of {current} failed ({exc.strerror or exc}); nothing was changed: every "
            f"target still has its previous bytes{cleanup}",
            hint="fix the cause (free space, permissions, read-only mounts), then run the command again",
        ) from None


def _rename_all(journal: Journal, held: Held) -> None:
    """Rename every staged file over its target (remove a record that goes); on failure undo the renames."""
    done: list[Entry] = []
    current: Path | None = None
    try:
        for entry in journal.entries:
            current = entry.path
            if entry.staged is not None:
                os.replace(entry.staged, entry.path)
            elif os.path.lexists(entry.path):
                entry.path.unlink()
            done.append(entry)
        for directory in sorted({e.path.parent for e in journal.entries}):
            current = directory
            fsync_dir(directory)
    except OSError as exc:
        hard_done = [e for e in done if not e.soft]
        try:
            jr.undo(journal)
        except OSError as again:
            held.outcome = (f"the commit failed midway and could not be undone; on disk now: "
                            f"{_state_line(journal.entries)}; the journal is kept for the next t4patch command")
            raise TargetEnvironmentError(
                f"replacing {current} failed ({exc.strerror or exc}) after {len(hard_done)} file(s) were "
                f"replaced, and putting them back failed too ({again.strerror or again}); on disk now: "
                f"{_state_line(journal.entries)}; the intent journal {journal.roots[0] / jr.JOURNAL_NAME} is "
                "kept, so the next t4patch command finishes or undoes the whole set",
                hint=f"fix the cause (free space, permissions), then run: t4patch status --site-packages "
                f"{shlex.quote(str(journal.roots[0]))}",
            ) from None
        held.outcome = "the commit failed and every file was put back to its previous bytes"
        raise TargetEnvironmentError(
            f"replacing {current} failed ({exc.strerror or exc}) after {len(hard_done)} of "
            f"{len([e for e in journal.entries if not e.soft])} file(s) were replaced; all of them were put "
            "back, so every file has its previous bytes (nothing changed)",
            hint="fix the cause (free space, permissions, read-only mounts), then run the command again",
        ) from None


def _clean_up(journal: Journal) -> None:
    """After the last rename: the set is in place; drop stale bytecode, the kept old bytes and the journal."""
    for entry in journal.entries:
        if entry.bytecode:
            jr.remove_bytecode(entry.path, journal.owner(entry))
    try:
        jr.discard_stand_ins(journal)
        journal.remove()
    except OSError as exc:
        note(f"the commit completed, but removing its leftovers failed ({exc.strerror or exc}: {exc.filename}); "
             "the next t4patch command removes them")
