"""Prove a patch set against a released wheel, without installing it.

The proof a new release's patch set must pass before it ships (``t4patch validate --wheel``), and that the
wheel builder and the porting tool reuse: for every target, the manifest's pristine sha256 equals the wheel's
RECORD and the file's own bytes, the diffs apply exactly and give the pinned patched sha256, and reversing
them gives the pristine bytes back.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

from t4patch.environment.target import parse_record
from t4patch.errors import PatchSetError
from t4patch.fileio.hashing import sha256_bytes
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


def prove_against_wheel(patch_set: PatchSet, wheel: Path) -> list[FileProof]:
    """Check every target against ``wheel``; return one proof per file, raise on the first failure."""
    proofs = []
    with zipfile.ZipFile(wheel) as zf:
        record_name = next((n for n in zf.namelist() if n.endswith(".dist-info/RECORD")), None)
        if record_name is None:
            raise PatchSetError(f"{wheel}: expected a wheel with a .dist-info/RECORD, found none")
        record = parse_record(zf.read(record_name).decode("utf-8"))
        for target in patch_set.targets:
            if target.path not in record:
                raise PatchSetError(f"{patch_set.spec}: {target.path} is not in {wheel.name}'s RECORD")
            if record[target.path] != target.pristine_sha256:
                raise PatchSetError(
                    f"{patch_set.spec}: {target.path} RECORD sha256 {record[target.path]} != manifest pristine "
                    f"{target.pristine_sha256}"
                )
            pristine = zf.read(target.path)
            if sha256_bytes(pristine) != target.pristine_sha256:
                raise PatchSetError(f"{patch_set.spec}: {target.path} in {wheel.name} does not match its RECORD")
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
