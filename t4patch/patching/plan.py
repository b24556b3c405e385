"""Plan first: what applying or reverting a patch set would do to each file, computed in memory.

Nothing here writes. A plan reads every target, classifies it by hash (pristine / patched / foreign /
missing), computes the new bytes and checks them against the pinned hash *before* anything is written. If any
file cannot be handled, the whole operation is refused, so an apply never leaves an engine half patched.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from t4patch.environment.target import InstalledDistribution
from t4patch.errors import ForeignFileError, PatchSetError, UnsupportedVersionError
from t4patch.fileio.hashing import sha256_bytes
from t4patch.patching.manifest import PatchSet, Target
from t4patch.patching.unified_diff import DiffMismatch, apply_file_diff

FileState = Literal["pristine", "patched", "foreign", "missing"]
Operation = Literal["apply", "revert"]


@dataclass(frozen=True)
class FileStatus:
    target: Target
    absolute: Path
    state: FileState
    sha256: str | None  # what the file hashes to now (None when missing)
    data: bytes | None = field(default=None, repr=False, compare=False)  # the bytes that were hashed


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


def file_statuses(patch_set: PatchSet, dist: InstalledDistribution) -> tuple[FileStatus, ...]:
    """Classify every target file of ``patch_set`` in the installed ``dist`` by its sha256."""
    statuses = []
    for target in patch_set.targets:
        absolute = dist.root / target.path
        try:
            data = absolute.read_bytes()
        except FileNotFoundError:
            statuses.append(FileStatus(target, absolute, "missing", None))
            continue
        digest = sha256_bytes(data)
        if digest == target.pristine_sha256:
            state: FileState = "pristine"
        elif digest == target.patched_sha256:
            state = "patched"
        else:
            state = "foreign"
        statuses.append(FileStatus(target, absolute, state, digest, data))
    return tuple(statuses)


def check_against_record(patch_set: PatchSet, dist: InstalledDistribution) -> None:
    """The installed build must be the one the patch set was made for: RECORD lists each target with the
    manifest's pristine sha256. This also refuses targets that are not files of the distribution at all."""
    if dist.version != patch_set.version:
        raise UnsupportedVersionError(
            f"{dist.name} {dist.version} is installed but the patch set is for {patch_set.version}",
            hint=dist.reinstall_command(patch_set.version),
        )
    record = dist.record()
    for target in patch_set.targets:
        if target.path not in record:
            raise PatchSetError(
                f"{patch_set.spec}: target {target.path} is not a file of the installed {dist.name} "
                f"(not in {dist.dist_info.name}/RECORD)",
                hint="the patch set is broken; report it, and check: t4patch validate",
            )
        recorded = record[target.path]
        if recorded != target.pristine_sha256:
            raise UnsupportedVersionError(
                f"{dist.name} {dist.version}: RECORD gives {target.path} sha256 {recorded}, the patch set was "
                f"made for {target.pristine_sha256} (a different build of this version)",
                hint=f"{dist.reinstall_command(patch_set.version)} (the PyPI wheel)",
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
    check_against_record(patch_set, dist)
    statuses = file_statuses(patch_set, dist)
    done_state: FileState = "patched" if operation == "apply" else "pristine"
    from_state: FileState = "pristine" if operation == "apply" else "patched"
    reinstall = dist.reinstall_command(patch_set.version)
    for status in statuses:
        if status.state == "missing":
            raise ForeignFileError(
                f"{status.absolute} is missing: expected the {from_state} file of {patch_set.spec}",
                hint=reinstall,
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
