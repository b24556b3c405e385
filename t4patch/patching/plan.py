"""Plan first: what applying or reverting a patch set would do to each file, computed in memory.

Nothing here writes. A plan reads every target, classifies it by hash (pristine / patched / foreign /
missing), computes the new bytes and checks them against the pinned hash *before* anything is written. If any
file cannot be handled, the whole operation is refused, so an apply never leaves an engine half patched.
"""

from __future__ import annotations

import difflib
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from t4patch.environment.target import InstalledDistribution
from t4patch.errors import ForeignFileError, PatchSetError, TargetEnvironmentError, UnsupportedVersionError
from t4patch.fileio.hashing import sha256_bytes
from t4patch.patching.local_version import built_by_t4patch, release_of
from t4patch.patching.manifest import PatchSet, Target
from t4patch.patching.unified_diff import DiffMismatch, apply_file_diff

_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
FileState = Literal["pristine", "patched", "foreign", "missing"]
Operation = Literal["apply", "revert"]


@dataclass(frozen=True)
class FileStatus:
    target: Target
    absolute: Path
    state: FileState
    sha256: str | None  # what the file hashes to now (None when missing or not a regular file)
    data: bytes | None = field(default=None, repr=False, compare=False)  # the bytes that were hashed
    found: str | None = None  # what is there instead of a regular file ("a directory"), when foreign that way


@dataclass(frozen=True)
class FileChange:
    status: FileStatus
    new_bytes: bytes
    old_bytes: bytes

    def unified_diff(self, operation: Operation) -> str:
        """The change as a unified diff (what --dry-run prints)."""
        path = self.status.target.path
        return "".join(
            difflib.unified_diff(
                self.old_bytes.decode("utf-8", "replace").splitlines(keepends=True),
                self.new_bytes.decode("utf-8", "replace").splitlines(keepends=True),
                fromfile=f"a/{path}",
                tofile=f"b/{path}",
            )
        )


@dataclass(frozen=True)
class Plan:
    operation: Operation
    patch_set: PatchSet
    distribution: InstalledDistribution
    statuses: tuple[FileStatus, ...]
    changes: tuple[FileChange, ...]

    @property
    def is_noop(self) -> bool:
        return not self.changes


def _inside_target(dist: InstalledDistribution, absolute: Path) -> None:
    """Refuse a target whose directory resolves outside the site-packages tree (a directory symlink)."""
    root = dist.root.resolve()
    try:
        parent = absolute.parent.resolve()
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop (Python < 3.13)
        raise TargetEnvironmentError(
            f"cannot resolve the directory of {absolute} ({exc}); nothing was written",
            hint=f"repair the symlinks under {dist.root}, or {dist.reinstall_command()}",
        ) from None
    if not parent.is_relative_to(root):
        raise TargetEnvironmentError(
            f"{absolute} lies outside the target: its directory resolves to {parent}, which is not under "
            f"{root} (a directory symlink); t4patch writes only inside the target, so nothing was written",
            hint=f"replace the symlinked directory with the real files ({dist.reinstall_command()})",
        )


def _what_is(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def file_statuses(patch_set: PatchSet, dist: InstalledDistribution) -> tuple[FileStatus, ...]:
    """Classify every target file of ``patch_set`` in the installed ``dist`` by its sha256.

    Every target must lie inside the site-packages tree once symlinked directories are resolved (a file
    symlink is fine: the link is what a write replaces). Anything but a regular file there is foreign; a
    file this user cannot read is an error, not a guess.
    """
    statuses = []
    for target in patch_set.targets:
        absolute = dist.root / target.path
        _inside_target(dist, absolute)
        try:
            info = absolute.stat()
        except FileNotFoundError:
            statuses.append(FileStatus(target, absolute, "missing", None))
            continue
        except OSError as exc:
            raise TargetEnvironmentError(
                f"cannot look at {absolute} ({exc.strerror or exc}); nothing was written",
                hint=f"repair it ({dist.reinstall_command()}), then run t4patch again",
            ) from None
        if not stat.S_ISREG(info.st_mode):  # never read a FIFO or a device: it could block or never end
            statuses.append(FileStatus(target, absolute, "foreign", None, found=_what_is(info.st_mode)))
            continue
        try:
            data = absolute.read_bytes()
        except OSError as exc:
            raise TargetEnvironmentError(
                f"cannot read {absolute} as this user ({exc.strerror or exc}); nothing was written",
                hint="run as a user who can read the environment (its owner), or target one you own with --python",
            ) from None
        digest = sha256_bytes(data)
        if digest == target.pristine_sha256:
            state: FileState = "pristine"
        elif digest == target.patched_sha256:
            state = "patched"
        else:
            state = "foreign"
        statuses.append(FileStatus(target, absolute, state, digest, data))
    return tuple(statuses)


def read_installed_record(dist: InstalledDistribution) -> dict[str, str | None]:
    """``dist``'s RECORD, or a one-line error if it is missing or damaged (it proves which build is installed)."""
    path = dist.dist_info / "RECORD"
    if not path.is_file():
        raise UnsupportedVersionError(
            f"{dist.name} {dist.version}: expected {path} listing the sha256 of every installed file, found "
            + ("something that is not a file" if os.path.lexists(path) else "none")
            + "; without it t4patch cannot tell which build is installed, so nothing was written",
            hint=dist.reinstall_command(),
        )
    try:
        return dist.record()
    except Exception as exc:  # noqa: BLE001 - csv.Error, binascii.Error, UnicodeDecodeError, OSError: all damage
        raise UnsupportedVersionError(
            f"{dist.name} {dist.version}: {path} is damaged ({type(exc).__name__}: {exc}); expected a wheel "
            "RECORD (path,sha256=<urlsafe base64>,size per line), so nothing was written",
            hint=dist.reinstall_command(),
        ) from None


def check_against_record(patch_set: PatchSet, dist: InstalledDistribution,
                         statuses: tuple[FileStatus, ...] | None = None) -> None:
    """The installed build must be the one the patch set was made for: RECORD lists each target with the
    manifest's pristine sha256. This also refuses targets that are not files of the distribution at all.

    When they disagree, the message says which side is the odd one out, judged by the file itself: RECORD
    and the file agree (another build, or a wrong manifest), the manifest and the file agree (RECORD was
    edited), or all three differ."""
    if release_of(dist.version) != patch_set.version:
        raise UnsupportedVersionError(
            f"{dist.name} {dist.version} is installed but the patch set is for {patch_set.version}",
            hint=dist.reinstall_command(patch_set.version),
        )
    record = read_installed_record(dist)
    by_path = {s.target.path: s for s in statuses or ()}
    for target in patch_set.targets:
        if target.path not in record:
            raise PatchSetError(
                f"{patch_set.spec}: target {target.path} is not a file of the installed {dist.name} "
                f"(not in {dist.dist_info.name}/RECORD)",
                hint="the patch set is broken; report it, and check: t4patch validate",
            )
        recorded = record[target.path]
        if recorded == target.pristine_sha256:
            continue
        if recorded is None or not _SHA256_HEX.fullmatch(recorded):
            raise UnsupportedVersionError(
                f"{dist.name} {dist.version}: {dist.dist_info.name}/RECORD is damaged: its entry for {target.path} "
                f"has no sha256 (expected sha256=<43 urlsafe base64 characters>, found {recorded!r} once decoded); "
                "without it the installed build is unproven, so nothing was written",
                hint=dist.reinstall_command(patch_set.version),
            )
        if built_by_t4patch(dist.version) and recorded == target.patched_sha256:
            continue  # installed from a `t4patch wheel` wheel: its RECORD pins the patched bytes
        status = by_path.get(target.path)
        found = status.sha256 if status else None
        reinstall = f"{dist.reinstall_command(patch_set.version)} (the PyPI wheel)"
        if found is not None and found == recorded:
            raise UnsupportedVersionError(
                f"{dist.name} {dist.version}: {target.path} hashes to {recorded}, as its RECORD says, but the "
                f"patch set's manifest pins pristine {target.pristine_sha256}: the manifest disagrees with "
                "the installed build (a different build of this version, or a wrong pristine hash in the "
                "patch set); nothing was written",
                hint=f"{reinstall}; if that build still differs, check the patch set: t4patch validate "
                f"{patch_set.directory} --wheel <the PyPI wheel>",
            )
        if found is not None and found in (target.pristine_sha256, target.patched_sha256):
            raise UnsupportedVersionError(
                f"{dist.name} {dist.version}: RECORD gives {target.path} sha256 {recorded}, but the file and "
                f"the manifest agree ({'pristine' if found == target.pristine_sha256 else 'patched'} "
                f"{found}): RECORD disagrees (edited or damaged), so the installed build is unproven and "
                "nothing was written",
                hint=reinstall,
            )
        raise UnsupportedVersionError(
            f"{dist.name} {dist.version}: {target.path}: RECORD gives sha256 {recorded}, the manifest pins "
            f"pristine {target.pristine_sha256}, the file "
            + (f"hashes to {found}" if found else f"is {status.found or status.state}" if status else "was not read")
            + ": all three disagree (a different build, changed since); nothing was written",
            hint=reinstall,
        )


def transform_bytes(patch_set: PatchSet, path: str, data: bytes, operation: Operation) -> bytes:
    """``data`` with every diff for ``path`` applied (apply) or reversed last-first (revert).

    Raises :class:`~t4patch.patching.unified_diff.DiffMismatch` if a hunk does not fit exactly.
    """
    diffs = patch_set.diffs_for(path)
    if operation == "revert":
        diffs = list(reversed(diffs))
    for diff in diffs:
        data = apply_file_diff(data, diff, reverse=(operation == "revert"))
    return data


def _transform(patch_set: PatchSet, status: FileStatus, data: bytes, operation: Operation) -> bytes:
    try:
        data = transform_bytes(patch_set, status.target.path, data, operation)
    except DiffMismatch as exc:
        raise PatchSetError(
            f"{patch_set.spec}: the diff does not fit the file its hash vouches for ({exc})",
            hint="the patch set is broken; report it, and check: t4patch validate",
        ) from None
    want = status.target.patched_sha256 if operation == "apply" else status.target.pristine_sha256
    got = sha256_bytes(data)
    if got != want:
        raise PatchSetError(
            f"{patch_set.spec}: {operation} of {status.target.path} gives sha256 {got}, manifest pins {want}",
            hint="the patch set is broken; report it, and check: t4patch validate",
        )
    return data


def make_plan(patch_set: PatchSet, dist: InstalledDistribution, operation: Operation) -> Plan:
    """Everything ``operation`` would write, or an error if any file forbids it (then nothing is written)."""
    statuses = file_statuses(patch_set, dist)
    check_against_record(patch_set, dist, statuses)
    done_state: FileState = "patched" if operation == "apply" else "pristine"
    from_state: FileState = "pristine" if operation == "apply" else "patched"
    reinstall = dist.reinstall_command(patch_set.version)
    for status in statuses:
        if status.state == "missing":
            raise ForeignFileError(
                f"{status.absolute} is missing: expected the {from_state} file of {patch_set.spec}",
                hint=reinstall,
            )
        if status.state == "foreign" and status.found:
            raise ForeignFileError(
                f"{status.absolute}: expected the {from_state} file of {patch_set.spec}, found {status.found}; "
                "nothing was written",
                hint=f"move it away and {reinstall}, then run t4patch again",
            )
        if status.state == "foreign":
            raise ForeignFileError(
                f"{status.absolute} was changed by something other than t4patch: expected sha256 "
                f"{status.target.pristine_sha256} (pristine) or {status.target.patched_sha256} (patched), "
                f"found {status.sha256}; nothing was written",
                hint=f"{reinstall}, then run t4patch again",
            )
    changes = []
    for status in statuses:
        if status.state == done_state:
            continue
        old = status.data or b""
        changes.append(FileChange(status, _transform(patch_set, status, old, operation), old))
    return Plan(operation, patch_set, dist, statuses, tuple(changes))
