"""Prove a patch set against a released wheel's files, without installing anything.

The same proof `t4patch validate --wheel`, `t4patch wheel` and `t4patch port` use: the wheel is opened through
:func:`t4patch.fileio.wheeltools.open_release` (it must be the set's release, every member = its RECORD), then
for every target the manifest's pristine sha256 must equal the wheel's RECORD, the diffs must apply exactly and
give the pinned patched sha256, and reversing them must give the pristine bytes back.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from t4patch.errors import PatchSetError
from t4patch.fileio.hashing import sha256_bytes
from t4patch.fileio.wheeltools import Expected, ReleasedWheel, open_release
from t4patch.patching.manifest import PatchSet
from t4patch.patching.plan import transform_bytes
from t4patch.patching.unified_diff import DiffMismatch


@dataclass(frozen=True)
class FileProof:
    """One target proven against the wheel (a failure raises instead)."""

    path: str
    pristine_sha256: str
    patched_sha256: str

    @property
    def line(self) -> str:
        return f"{self.path}: pristine = RECORD, applies exactly, patched hash ok, reverts exactly"


def prove_against_wheel(patch_set: PatchSet, wheel: Path | ReleasedWheel, *, role: str = "--wheel") -> list[FileProof]:
    """Check every target against ``wheel`` (a path, opened and checked here, or a wheel already open); return
    one proof per file, raise on the first failure.

    A wheel that is not the set's release is a usage error (exit 2, the wheel module's fault table); a patch
    set that does not fit a good wheel is a :class:`PatchSetError` (exit 7) naming the side that disagrees.
    """
    if isinstance(wheel, ReleasedWheel):
        return _prove(patch_set, wheel)
    with open_release(wheel, Expected(patch_set.distribution, patch_set.version, role=role)) as opened:
        return _prove(patch_set, opened)


def _prove(patch_set: PatchSet, wheel: ReleasedWheel) -> list[FileProof]:
    record = wheel.record
    proofs = []
    for target in patch_set.targets:
        if target.path not in record:
            raise PatchSetError(f"{patch_set.spec}: {target.path} is not in {wheel.path.name}'s RECORD"
                                f"{wheel.expected.after}",
                                hint="the patch set is broken; check it with: t4patch validate")
        if record[target.path] != target.pristine_sha256:
            raise PatchSetError(
                f"{patch_set.spec}: {target.path} in {wheel.path.name} hashes to {record[target.path]} as its RECORD "
                f"says, but the patch set pins the released {target.pristine_sha256}: either this is not the released "
                f"wheel (its RECORD edited with the file) or the set is wrong{wheel.expected.after}",
                hint=f"check the set against the wheel from the package index: pip download --no-deps "
                f"--only-binary=:all: -d DIR {patch_set.spec} && t4patch validate {patch_set.directory} --wheel "
                "DIR/<file>.whl",
            )
        pristine = wheel.read(target.path)  # hashed against RECORD on the way
        try:
            data = transform_bytes(patch_set, target.path, pristine, "apply")
            if sha256_bytes(data) != target.patched_sha256:
                raise PatchSetError(
                    f"{patch_set.spec}: {target.path} patches to {sha256_bytes(data)}, manifest pins "
                    f"{target.patched_sha256}"
                )
            data = transform_bytes(patch_set, target.path, data, "revert")
        except DiffMismatch as exc:
            raise PatchSetError(f"{patch_set.spec}: {exc}") from None
        if data != pristine:
            raise PatchSetError(f"{patch_set.spec}: reversing {target.path} does not give the pristine bytes")
        proofs.append(FileProof(target.path, target.pristine_sha256, target.patched_sha256))
    return proofs
