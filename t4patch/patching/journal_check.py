"""What a journal found on disk may make recovery do: finish or undo a shipped set in its own site-packages.

A journal is input, not a command (issue 22). Anyone who can write in a site-packages directory (a shared
team venv, a mounted volume) can plant one, and the next t4patch command aimed there — ``status`` included,
run by anyone, root too — recovers it. So before one byte moves, every entry must be:

- inside the site-packages the journal was found in once every symlink is followed: each directory on the
  way, and the file itself or its stand-in where one is a link;
- a ``[[target]]`` of a patch set the journal names, in the patch-set tree in use, whose old and new sha256
  are that target's pinned pristine and patched ones (so every byte recovery renames into place hashes to
  one of them: :mod:`t4patch.patching.journal` renames a stand-in only when it hashes to the named value);
- or the state record ``t4patch.json`` in that distribution's own dist-info (itself inside the site), whose
  files recovery moves or removes only when they are t4patch's state record for that set
  (:func:`t4patch.patching.state.record_problem`), never a link;
- with stand-ins that are regular files or links resolving inside the site, never a directory or a device.

Deletes then touch only what t4patch creates: its stand-ins (t4patch's names, checked when the journal is
read), its state record, stale bytecode of a pinned module, the journal. Anything else refuses the whole
journal in one line naming it and what is wrong, and nothing is touched.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from t4patch.environment.target import InstalledDistribution, TargetEnvironment
from t4patch.errors import NotInstalledError, UnsupportedVersionError
from t4patch.fileio.hashing import sha256_file
from t4patch.patching.journal import Entry, Journal, refuse, resolves_inside
from t4patch.patching.manifest import PatchSet, Target
from t4patch.patching.registry import find_patch_set
from t4patch.patching.state import RECORD_MAX_BYTES, record_path, record_problem

MAX_SETS = 32  # one per engine a single apply or revert names; more is not a journal t4patch wrote


@dataclass(frozen=True)
class CheckedSet:
    """A set a journal names, as the patch-set tree in use has it, and its distribution in the journal's site."""

    patch_set: PatchSet
    distribution: InstalledDistribution

    @property
    def targets(self) -> dict[str, Target]:
        """Every file the set can change, the optional diffs' files included (each has one pinned pair)."""
        return {t.path: t for t in (*self.patch_set.targets, *self.patch_set.optional_targets)}


def check_journal(journal: Journal, path: Path) -> list[CheckedSet]:
    """Refuse ``journal`` (read from ``path`` by :func:`~t4patch.patching.journal.read_journal`) unless every
    entry is a pinned file of a set it names, inside its site; return those sets."""
    here = path.parent
    specs = list(dict.fromkeys(journal.patch_sets))
    if not specs or len(specs) > MAX_SETS:
        raise refuse(path, f"a journal that names {len(specs)} patch sets (a commit names 1 to {MAX_SETS})")
    sets = {spec: _checked_set(spec, path) for spec in specs}
    if not any(not e.soft for e in journal.entries):
        raise refuse(path, "a journal that names no patched file (a commit always changes at least one)")
    for entry in journal.entries:
        if entry.patch_set is not None and entry.patch_set not in sets:
            raise refuse(path, f"an entry for {entry.path} of {entry.patch_set}, a patch set the journal does "
                         f"not name ({', '.join(sets)})")
        candidates = [sets[entry.patch_set]] if entry.patch_set else list(sets.values())
        _check_inside(entry, here, path)
        owner = _check_pinned(entry, candidates, path)
        if entry.soft:
            _check_record_files(entry, owner, path)
    return list(sets.values())


def _checked_set(spec: str, path: Path) -> CheckedSet:
    here = path.parent
    name, sep, version = spec.partition("==")
    if not sep or not name or not version:
        raise refuse(path, f"a patch set named {spec!r} (expected NAME==VERSION)")
    try:
        patch_set = find_patch_set(name, version)
    except (NotInstalledError, UnsupportedVersionError):
        raise refuse(path, f"a journal of the patch set {spec[:80]}, which the patch-set tree in use does not "
                     "have (t4patch list shows the sets it has)") from None
    if patch_set.spec != spec:
        raise refuse(path, f"a journal of {spec[:80]}, which the patch-set tree in use calls {patch_set.spec}")
    dist = TargetEnvironment((here,), f"site-packages {here}").find(patch_set.distribution)
    if dist is None:
        raise refuse(path, f"a journal of {spec}, but no {patch_set.distribution} is installed in {here}")
    if not resolves_inside(dist.dist_info, here):
        raise refuse(path, f"a journal of {spec} whose dist-info {dist.dist_info} resolves to "
                     f"{os.path.realpath(dist.dist_info)}, outside the site-packages (a directory symlink)")
    return CheckedSet(patch_set, dist)


def _check_pinned(entry: Entry, candidates: list[CheckedSet], path: Path) -> CheckedSet:
    """The set ``entry`` belongs to: its state record, or a target with the entry's hashes pinned."""
    here = path.parent
    if entry.soft:
        for checked in candidates:
            if entry.path == record_path(checked.distribution):
                return checked
        raise refuse(path, f"{entry.path} given as the state record, which is not t4patch.json in the dist-info "
                     f"of {' or '.join(c.patch_set.spec for c in candidates)}")
    relative = entry.path.relative_to(here).as_posix()
    for checked in candidates:
        target = checked.targets.get(relative)
        if target is None:
            continue
        pinned = {(target.pristine_sha256, target.patched_sha256), (target.patched_sha256, target.pristine_sha256)}
        if (entry.old_sha256, entry.new_sha256) not in pinned:
            raise refuse(path, f"{relative} going from sha256 {entry.old_sha256} to {entry.new_sha256}, where "
                         f"{checked.patch_set.spec} pins pristine {target.pristine_sha256} and patched "
                         f"{target.patched_sha256} (recovery would install or keep bytes of neither)")
        return checked
    if entry.old_sha256 is None or entry.new_sha256 is None:
        raise refuse(path, f"a delete of {entry.path}, a file t4patch did not create (recovery deletes only its "
                     "own temp files, state record and stale bytecode)")
    raise refuse(path, f"{relative}, a file no patch set it names pins (not a [[target]] of "
                 f"{' or '.join(c.patch_set.spec for c in candidates)})")


def _check_inside(entry: Entry, here: Path, path: Path) -> None:
    """Every directory on the way and every link at the end resolves inside the site; stand-ins are files."""
    if not resolves_inside(entry.path.parent, here):
        raise refuse(path, f"{entry.path}, whose directory resolves to {os.path.realpath(entry.path.parent)}, "
                     f"outside {here} (a directory symlink on the way)")
    for candidate in (entry.path, entry.staged, entry.kept):
        if candidate is None:
            continue
        try:
            info = candidate.lstat()
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise refuse(path, f"{candidate}, which cannot be looked at ({exc.strerror or exc})") from None
        if stat.S_ISLNK(info.st_mode):
            if entry.soft:
                raise refuse(path, f"{candidate}, a symlink where t4patch keeps its state record (it never "
                             "writes one as a link)")
            if not resolves_inside(candidate, here):
                raise refuse(path, f"{candidate}, a symlink to {os.path.realpath(candidate)}, outside {here}")
        elif candidate != entry.path and not stat.S_ISREG(info.st_mode):
            raise refuse(path, f"{candidate}, which is not a regular file (t4patch's temp files are)")
    if entry.bytecode:
        cache = entry.path.parent / "__pycache__"
        if os.path.lexists(cache) and not resolves_inside(cache, here):
            raise refuse(path, f"{cache}, a directory symlink to {os.path.realpath(cache)}, outside {here} "
                         "(recovery removes stale bytecode there)")


def _check_record_files(entry: Entry, checked: CheckedSet, path: Path) -> None:
    """Each state record recovery would put in place or remove must be t4patch's record of that set.

    Recovery renames a staged record only when it hashes to the new sha256 and a kept one only when it hashes
    to the old (a stand-in cut short by the kill is merely removed, by its t4patch name), and removes the
    record itself only where the journal says the set has none on one side."""
    used = [c for c, digest in ((entry.staged, entry.new_sha256), (entry.kept, entry.old_sha256))
            if c is not None and digest is not None and _hashes_to(c, digest)]
    if None in (entry.old_sha256, entry.new_sha256):
        used.append(entry.path)
    for candidate in used:
        if not os.path.lexists(candidate):
            continue
        try:
            if not stat.S_ISREG(candidate.lstat().st_mode):
                raise refuse(path, f"{candidate}, which is not a regular file, where the state record goes")
            with open(candidate, "rb") as handle:
                data = handle.read(RECORD_MAX_BYTES + 1)
        except OSError as exc:
            raise refuse(path, f"{candidate}, which cannot be read ({exc.strerror or exc})") from None
        problem = record_problem(data, checked.patch_set.spec)
        if problem is not None:
            raise refuse(path, f"{candidate} given as the state record of {checked.patch_set.spec}, but it is "
                         f"{problem}; recovery moves or removes only t4patch's own record")


def _hashes_to(path: Path, digest: str) -> bool:
    try:
        return stat.S_ISREG(path.lstat().st_mode) and sha256_file(path) == digest
    except OSError:
        return False
