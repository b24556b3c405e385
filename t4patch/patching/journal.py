"""The intent journal: what a commit is about to do, on disk before its first rename, gone after its last.

Each file of a patch set is replaced atomically, but a set of ten files is not: a process killed between the
third and the fourth rename would leave a mixed engine that a serving process could import. So a commit first
writes (and fsyncs) this journal into every site-packages directory it touches, naming each file it will
change, the hash it has now and the hash it will have, the staged temp file holding the new bytes and the hard
link keeping the old ones. Then it renames; then it removes the links and the journal. A journal found later
under the lock belongs to a run that died (the lock dies with its holder), and :func:`recover` finishes that
run's set (every new file is still staged) or puts every old file back (every old file is still linked):
it finishes once any file has its new bytes (the run had started renaming) and undoes otherwise. Both directions are renames only, so they need no free space.

A journal is data found on disk, so it is input, not a command. Each site-packages a commit touches gets its
own journal naming that directory alone and the entries inside it. :func:`read_journal` checks the form: one
root, the directory it was found in; every path textually inside it; every temp name a sibling of its target
with t4patch's token and suffix. :mod:`t4patch.patching.journal_check` then checks it against the site and the
patch-set tree (symlinks resolved, pinned targets and hashes, the state record's content). Anything else is
refused (:class:`~t4patch.errors.JournalRefusedError`) and nothing is touched.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import secrets
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from t4patch.errors import JournalRefusedError, TargetEnvironmentError
from t4patch.fileio.atomic import TEMP_SUFFIX, fsync_dir, write_bytes_atomic
from t4patch.fileio.hashing import sha256_file

JOURNAL_NAME = ".t4patch-journal.json"
JOURNAL_SCHEMA = 1
JOURNAL_MAX_BYTES = 4 << 20  # ~500 bytes per file: a set of thousands of files; a planted giant is never read
NEW_SUFFIX = ".t4patch-new"  # a staged file: the bytes a target will get
OLD_SUFFIX = ".t4patch-old"  # a hard link to the bytes a target had
LEGACY_RECORD_NAME = "t4patch.json"  # t4patch <= 0.x wrote its state record through a fixed "t4patch.json.tmp"


def _stray_pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"^\.{re.escape(name)}\.[A-Za-z0-9_]+\.t4patch-(?:new|old|tmp)$")


@dataclass(frozen=True)
class Entry:
    """One file of a commit: where it is, what it hashes to before and after (None: absent), and its stand-ins."""

    path: Path
    old_sha256: str | None
    new_sha256: str | None
    staged: Path | None  # the new bytes, staged beside the target (None when the target is to be removed)
    kept: Path | None  # a hard link to the old bytes (None when the target did not exist)
    soft: bool = False  # the state record: informational, never blocks a recovery
    bytecode: bool = False  # a Python module whose __pycache__ must go once the set is in place
    patch_set: str | None = None  # the spec of the set this file belongs to (None in journals before issue 22)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "old_sha256": self.old_sha256,
            "new_sha256": self.new_sha256,
            "staged": str(self.staged) if self.staged else None,
            "kept": str(self.kept) if self.kept else None,
            "soft": self.soft,
            "bytecode": self.bytecode,
            "patch_set": self.patch_set,
        }


def stand_in(path: Path, token: str, suffix: str) -> Path:
    return path.with_name(f".{path.name}.{token}{suffix}")


def new_token() -> str:
    return secrets.token_hex(8)


@dataclass(frozen=True)
class Journal:
    token: str
    operation: str
    patch_sets: tuple[str, ...]
    roots: tuple[Path, ...]
    entries: tuple[Entry, ...]
    started_at: str
    pid: int

    @classmethod
    def create(cls, operation: str, patch_sets: Sequence[str], roots: Iterable[Path],
               entries: Sequence[Entry], token: str) -> Journal:
        return cls(token, operation, tuple(patch_sets), tuple(sorted(set(roots))), tuple(entries),
                   dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), os.getpid())

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": JOURNAL_SCHEMA,
            "kind": "t4patch intent journal",
            "token": self.token,
            "operation": self.operation,
            "patch_sets": list(self.patch_sets),
            "roots": [str(r) for r in self.roots],
            "started_at": self.started_at,
            "pid": self.pid,
            "entries": [e.to_json() for e in self.entries],
        }

    @property
    def description(self) -> str:
        return f"{self.operation} of {', '.join(self.patch_sets)} (pid {self.pid}, started {self.started_at})"

    def owner(self, entry: Entry) -> Path:
        """The root ``entry`` lies in (the deepest, should one root hold another)."""
        return max((r for r in self.roots if entry.path.is_relative_to(r)), key=lambda r: len(r.parts))

    def part(self, root: Path) -> Journal:
        """The journal written into ``root``: that root alone, its entries and the sets they belong to."""
        entries = tuple(e for e in self.entries if self.owner(e) == root)
        specs = {e.patch_set for e in entries}
        sets = tuple(s for s in self.patch_sets if s in specs) if None not in specs else self.patch_sets
        return Journal(self.token, self.operation, sets, (root,), entries, self.started_at, self.pid)

    def write(self) -> None:
        """Write (atomically, fsynced) each root's own part into it; on any failure remove every copy again.

        The caller holds the lock and has recovered every earlier journal, so none was there before: one
        found at a root's name after a failure (its directory fsync failed after the rename) is this run's.
        """
        try:
            for root in self.roots:
                data = (json.dumps(self.part(root).to_json(), indent=2) + "\n").encode("utf-8")
                write_bytes_atomic(root / JOURNAL_NAME, data)
        except BaseException:
            for root in self.roots:
                with contextlib.suppress(OSError):
                    (root / JOURNAL_NAME).unlink(missing_ok=True)
            raise

    def remove(self) -> None:
        """Remove every copy (the commit is over, one way or the other)."""
        for root in self.roots:
            (root / JOURNAL_NAME).unlink(missing_ok=True)
            fsync_dir(root)


def journal_leftovers(root: Path) -> list[Path]:
    """Temp files of a journal whose writing was interrupted (the journal itself never appeared)."""
    pattern = _stray_pattern(JOURNAL_NAME)
    try:
        return [root / n for n in os.listdir(root) if n.startswith(f".{JOURNAL_NAME}.") and pattern.match(n)]
    except OSError:
        return []


def journal_paths(roots: Iterable[Path]) -> list[Path]:
    """The journals present in ``roots`` (a cheap stat per directory; nothing is read)."""
    found = []
    for root in roots:
        path = root / JOURNAL_NAME
        if os.path.lexists(path):
            found.append(path)
    return found


def way_out(path: Path) -> str:
    """The pasteable way past a journal recovery will not act on: move it out of the site, then look."""
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return (f"if no t4patch run is active, move it out of the site-packages and see what is installed: mv "
            f"{shlex.quote(str(path))} ~/t4patch-refused-journal-{stamp}.json && t4patch status "
            f"--site-packages {shlex.quote(str(path.parent))}")


def refuse(path: Path, problem: str) -> JournalRefusedError:
    """The one-line refusal of the journal at ``path``: what is wrong, that nothing changed, the way out."""
    return JournalRefusedError(
        f"{path}: expected an intent journal written by t4patch for this site-packages, found {problem}; "
        "recovery acts only on pinned files of a shipped set inside the site-packages the journal is in, so "
        "nothing was changed",
        hint=way_out(path),
    )


def _absolute_inside(path: Path, root: Path) -> bool:
    return path.is_absolute() and ".." not in path.parts and path.is_relative_to(root)


def _rebase(path: Path | None, root: Path, here: Path) -> Path | None:
    return None if path is None else here / path.relative_to(root)


def read_journal(path: Path) -> Journal:
    """Parse the journal at ``path`` and check its form; its paths come back based on ``path.parent``.

    A journal names one root, the site-packages it was found in (the same directory, however spelled: a
    ``lib64`` link to ``lib``); every path lies textually inside that root and every stand-in is t4patch's
    name for its target. What the paths resolve to and which files they are is
    :func:`t4patch.patching.journal_check.check_journal`'s to say.
    """
    if path.is_symlink() or not path.is_file():
        raise refuse(path, "something that is not a regular file")
    try:
        size = path.stat().st_size
        if size > JOURNAL_MAX_BYTES:
            raise refuse(path, f"{size:,} bytes, more than a journal of any shipped set holds "
                         f"({JOURNAL_MAX_BYTES:,})")
        raw = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: thousands of nested brackets
        raise refuse(path, f"unreadable content ({exc})") from None
    if not isinstance(raw, dict) or raw.get("schema") != JOURNAL_SCHEMA:
        raise refuse(path, f"a document without schema {JOURNAL_SCHEMA}")
    try:
        roots = tuple(Path(str(r)) for r in raw["roots"])
        token = str(raw["token"])
        entries = []
        for e in raw["entries"]:
            entries.append(Entry(
                Path(e["path"]), e["old_sha256"], e["new_sha256"],
                Path(e["staged"]) if e["staged"] else None, Path(e["kept"]) if e["kept"] else None,
                bool(e.get("soft", False)), bool(e.get("bytecode", False)),
                str(e["patch_set"]) if e.get("patch_set") is not None else None,
            ))
        journal = Journal(token, str(raw["operation"]), tuple(str(p) for p in raw["patch_sets"]), roots,
                          tuple(entries), str(raw["started_at"]), int(raw["pid"]))
    except (KeyError, TypeError, ValueError, OverflowError) as exc:  # OverflowError: a pid of 1e400
        raise refuse(path, f"a malformed document ({type(exc).__name__}: {exc})") from None
    here = path.parent
    if not re.fullmatch(r"[0-9a-f]{16}", token):
        raise refuse(path, f"a malformed token {token!r}")
    if len(roots) != 1:
        raise refuse(path, f"a journal naming {len(roots)} site-packages ({', '.join(map(str, roots)) or 'none'}); "
                   "each journal names the one it was found in")
    root = roots[0]
    if not root.is_absolute() or os.path.realpath(root) != os.path.realpath(here):
        raise refuse(path, f"a journal for another directory ({root}, not the {here} it was found in)")
    rebased = []
    for entry in journal.entries:
        if "\0" in str(entry.path):
            raise refuse(path, f"a path with a NUL byte ({str(entry.path)!r})")
        if not _absolute_inside(entry.path, root) or entry.path == root:
            raise refuse(path, f"a path outside its site-packages ({entry.path})")
        for candidate, suffix in ((entry.staged, NEW_SUFFIX), (entry.kept, OLD_SUFFIX)):
            if candidate is not None and candidate != stand_in(entry.path, token, suffix):
                raise refuse(path, f"a stand-in {candidate} that is not t4patch's for {entry.path}")
        for digest in (entry.old_sha256, entry.new_sha256):
            if digest is not None and not re.fullmatch(r"[0-9a-f]{64}", str(digest)):
                raise refuse(path, f"a malformed sha256 {digest!r}")
        rebased.append(Entry(here / entry.path.relative_to(root), entry.old_sha256, entry.new_sha256,
                             _rebase(entry.staged, root, here), _rebase(entry.kept, root, here), entry.soft,
                             entry.bytecode, entry.patch_set))
    return Journal(token, journal.operation, journal.patch_sets, (here,), tuple(rebased), journal.started_at,
                   journal.pid)


def _digest(path: Path) -> str | None:
    """sha256 of the regular file at ``path`` (not following a symlink); None if absent or not a file."""
    try:
        if not path.is_file() or path.is_symlink():
            return None if not os.path.lexists(path) else "not-a-regular-file"
        return sha256_file(path)
    except OSError:
        return "unreadable"


def _present(path: Path) -> bool:
    return os.path.lexists(path)


def _holds(path: Path, digest: str | None) -> bool:
    """Whether ``path`` is in the state ``digest`` names (None: absent)."""
    if digest is None:
        return not _present(path)
    if path.is_symlink():
        # a file symlink the commit replaces: its target's bytes were what was hashed
        try:
            return sha256_file(path) == digest
        except OSError:
            return False
    return _digest(path) == digest


def can_finish(entry: Entry) -> bool:
    return _holds(entry.path, entry.new_sha256) or (
        entry.staged is not None and _digest(entry.staged) == entry.new_sha256
    ) or (entry.new_sha256 is None)


def can_undo(entry: Entry) -> bool:
    return _holds(entry.path, entry.old_sha256) or (
        entry.kept is not None and _present(entry.kept) and _holds(entry.kept, entry.old_sha256)
    )


def resolves_inside(path: Path, root: Path) -> bool:
    """Whether ``path``, every symlink on the way and at its end followed, lies inside ``root`` (resolved)."""
    try:
        return Path(os.path.realpath(path, strict=False)).is_relative_to(os.path.realpath(root))
    except (OSError, ValueError):
        return False


def remove_bytecode(source: Path, root: Path) -> list[Path]:
    """Delete cached bytecode of ``source`` (``__pycache__/<stem>.*.pyc`` and a legacy ``<name>c``).

    Bytecode is a cache: one that cannot be removed (a directory in its place, a read-only mount) is left and
    never fails the command; Python checks a ``.pyc`` against its source's size and mtime anyway. A
    ``__pycache__`` that is a symlink leading out of the site-packages ``root`` is left alone: nothing outside
    the target is ever deleted.
    """
    removed: list[Path] = []
    if source.suffix != ".py":
        return removed
    cache = source.parent / "__pycache__"
    candidates = list(cache.glob(f"{source.stem}.*.pyc")) if resolves_inside(cache, root) else []
    candidates.append(source.with_suffix(".pyc"))
    for pyc in candidates:
        try:
            if pyc.is_file() and not pyc.is_symlink():
                pyc.unlink()
                removed.append(pyc)
        except OSError:
            continue
    return removed


def finish(journal: Journal) -> None:
    """Put every entry into its new state (renames and unlinks only), then drop the stand-ins and the journal."""
    dirs: set[Path] = set()
    for entry in journal.entries:
        if entry.new_sha256 is None:
            if _present(entry.path):
                entry.path.unlink()
                dirs.add(entry.path.parent)
        elif not _holds(entry.path, entry.new_sha256):
            if entry.staged is not None and _digest(entry.staged) == entry.new_sha256:
                os.replace(entry.staged, entry.path)
                dirs.add(entry.path.parent)
            elif not entry.soft:
                raise RuntimeError(f"{entry.path}: cannot be finished (checked by can_finish)")
    for directory in sorted(dirs):
        fsync_dir(directory)
    for entry in journal.entries:
        if entry.bytecode:
            remove_bytecode(entry.path, journal.owner(entry))
    discard_stand_ins(journal)
    journal.remove()


def undo(journal: Journal) -> None:
    """Put every entry back into its old state (renames and unlinks only), then drop stand-ins and journal."""
    dirs: set[Path] = set()
    for entry in journal.entries:
        if _holds(entry.path, entry.old_sha256):
            continue
        if entry.old_sha256 is None:
            entry.path.unlink(missing_ok=True)
        elif entry.kept is not None and _present(entry.kept) and (
                not entry.soft or _digest(entry.kept) == entry.old_sha256):  # a record only as it was kept
            os.replace(entry.kept, entry.path)
        elif not entry.soft:
            raise RuntimeError(f"{entry.path}: cannot be undone (checked by can_undo)")
        dirs.add(entry.path.parent)
    for directory in sorted(dirs):
        fsync_dir(directory)
    discard_stand_ins(journal)
    journal.remove()


def discard_stand_ins(journal: Journal) -> None:
    dirs: set[Path] = set()
    for entry in journal.entries:
        for path in (entry.staged, entry.kept):
            if path is not None and _present(path):
                path.unlink()
                dirs.add(path.parent)
    for directory in sorted(dirs):
        fsync_dir(directory)


@dataclass(frozen=True)
class Recovery:
    """What a recovery found and did, in words a user can act on."""

    journal: Path
    description: str
    direction: str  # "finished" | "undone"
    files: int

    @property
    def line(self) -> str:
        if self.direction == "finished":
            what = f"finished it: {self.files} more file(s) replaced, every file of the set now has its new bytes"
        elif self.files:
            what = f"undid it: {self.files} file(s) restored, every file of the set has its previous bytes again"
        else:
            what = "it had not replaced any file yet; its staged files were removed, nothing else changed"
        return f"found an interrupted {self.description} ({self.journal}); {what}"


def recover(journal: Journal, path: Path, reinstall: str) -> Recovery:
    """Finish or undo the dead run's set in ``journal`` (read from ``path`` and checked by
    :func:`t4patch.patching.journal_check.check_journal`). The caller holds the lock on its root.

    ``reinstall`` is the command that puts the released files back, for the refusal when neither is possible.
    """
    hard = [e for e in journal.entries if not e.soft]
    changed_forward = sum(1 for e in hard if not _holds(e.path, e.new_sha256))
    changed_back = sum(1 for e in hard if not _holds(e.path, e.old_sha256))
    # Before its first rename a commit has changed nothing, and its run may have said so (a failed staging):
    # undo then. Once any file has its new bytes, the run meant the set to be in place: finish it.
    started = any(_holds(e.path, e.new_sha256) and not _holds(e.path, e.old_sha256) for e in hard)
    finishable = all(can_finish(e) for e in hard)
    if started and finishable:
        finish(journal)
        return Recovery(path, journal.description, "finished", changed_forward)
    if all(can_undo(e) for e in hard):
        undo(journal)
        return Recovery(path, journal.description, "undone", changed_back)
    if finishable:
        finish(journal)
        return Recovery(path, journal.description, "finished", changed_forward)
    hint = (f"put the released files back ({reinstall}), then run: t4patch status --site-packages "
            f"{shlex.quote(str(path.parent))} (it finishes the journal)")
    stuck = [e for e in hard if not (can_finish(e) or can_undo(e))]
    if stuck:
        raise TargetEnvironmentError(
            f"an interrupted {journal.description} left {path}, but "
            + ", ".join(f"{e.path} ({_found(e.path)})" for e in stuck)
            + " match neither the old nor the new sha256 it names and no stand-in of them holds either (changed "
            "since that run died); nothing was changed",
            hint=hint,
        )
    # Every file is whole, but the set is mixed and the stand-ins one direction needs are gone.
    new = [e for e in hard if _holds(e.path, e.new_sha256)]
    old = [e for e in hard if e not in new]
    no_staged = [str(e.staged) for e in old if not can_finish(e)]
    no_kept = [str(e.kept) for e in new if not can_undo(e)]
    raise TargetEnvironmentError(
        f"an interrupted {journal.description} left {path} with the set mixed ({len(new)} file(s) with the new "
        f"bytes, {len(old)} with the previous), and the temp files it needs are missing: the staged new bytes "
        f"{', '.join(no_staged)} (to finish) and the kept previous bytes {', '.join(no_kept)} (to undo); no file "
        "is foreign, but the set can be neither finished nor undone, so nothing was changed",
        hint=hint,
    )


def _found(path: Path) -> str:
    digest = _digest(path)
    return "missing" if digest is None else digest if len(digest) == 64 else digest.replace("-", " ")


def sweep_strays(directories: Iterable[tuple[Path, str]]) -> list[Path]:
    """Remove leftover t4patch temp files for ``(directory, file name)`` pairs; return what was removed.

    Only names t4patch makes (``.<name>.<token>.t4patch-new|old|tmp``) are touched, never followed (a symlink
    is unlinked, not its target), and only while the caller holds the lock, so none of them belongs to a live
    run. Old fixed-name record temps (``t4patch.json.tmp``) are removed the same way.
    """
    removed = []
    by_dir: dict[Path, set[str]] = {}
    for directory, name in directories:
        by_dir.setdefault(directory, set()).add(name)
    for directory, names in by_dir.items():
        patterns = [_stray_pattern(n) for n in names]
        legacy = {f"{n}.tmp" for n in names if n == LEGACY_RECORD_NAME}
        try:
            listing = os.listdir(directory)
        except OSError:
            continue
        for entry in listing:
            ours = entry.endswith((NEW_SUFFIX, OLD_SUFFIX, TEMP_SUFFIX)) and any(p.match(entry) for p in patterns)
            if ours or entry in legacy:
                path = directory / entry
                try:
                    if path.is_symlink() or path.is_file():
                        path.unlink()
                        removed.append(path)
                except OSError:
                    continue
    return removed
