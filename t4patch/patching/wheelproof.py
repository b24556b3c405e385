"""Prove a patch set against a released wheel, without installing it.

The proof a new release's patch set must pass before it ships (``t4patch validate --wheel``), and that the
wheel builder and the porting tool reuse: for every target, the manifest's pristine sha256 equals the wheel's
RECORD and the file's own bytes, the diffs apply exactly and give the pinned patched sha256, and reversing
them gives the pristine bytes back.
"""

from __future__ import annotations

import csv
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from t4patch.environment.target import parse_record
from t4patch.errors import PatchSetError, UsageError
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


def _bad_wheel(wheel: Path, problem: str) -> UsageError:
    return UsageError(f"--wheel {wheel}: expected a released wheel (.whl), found {problem}",
                      hint="download it with: pip download --no-deps --only-binary=:all: <engine>==<version>")


def _read_member(zf: zipfile.ZipFile, wheel: Path, name: str) -> bytes:
    try:
        return zf.read(name)
    except KeyError:
        raise _bad_wheel(wheel, f"a RECORD listing {name}, which the archive does not hold") from None
    except (OSError, zipfile.BadZipFile, zlib.error) as exc:
        raise _bad_wheel(wheel, f"a damaged member {name} ({exc})") from None


def _open_wheel(wheel: Path) -> zipfile.ZipFile:
    if not wheel.is_file():
        raise _bad_wheel(wheel, "a directory" if wheel.is_dir() else "nothing there")
    try:
        return zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as exc:
        raise _bad_wheel(wheel, f"a file that is not a zip archive ({exc})") from None


def prove_against_wheel(patch_set: PatchSet, wheel: Path) -> list[FileProof]:
    """Check every target against ``wheel``; return one proof per file, raise on the first failure.

    A damaged or wrong ``wheel`` is a usage error (exit 2); a patch set that does not fit a good wheel is a
    :class:`PatchSetError` naming the side that disagrees.
    """
    proofs = []
    with _open_wheel(wheel) as zf:
        record_name = next((n for n in zf.namelist() if n.endswith(".dist-info/RECORD")), None)
        if record_name is None:
            raise _bad_wheel(wheel, "an archive with no .dist-info/RECORD")
        try:
            record = parse_record(_read_member(zf, wheel, record_name).decode("utf-8"))
        except (ValueError, csv.Error) as exc:  # not UTF-8, bad base64, a NUL byte
            raise _bad_wheel(wheel, f"a damaged {record_name} ({type(exc).__name__}: {exc})") from None
        for target in patch_set.targets:
            if target.path not in record:
                raise PatchSetError(f"{patch_set.spec}: {target.path} is not in {wheel.name}'s RECORD")
            pristine = _read_member(zf, wheel, target.path)
            found = sha256_bytes(pristine)
            if record[target.path] != target.pristine_sha256:
                side = ("the manifest disagrees with the wheel (its RECORD and the file agree)"
                        if found == record[target.path] else
                        "the wheel's RECORD disagrees with its own file" if found == target.pristine_sha256 else
                        "all three disagree")
                raise PatchSetError(
                    f"{patch_set.spec}: {target.path}: RECORD sha256 {record[target.path]}, manifest pristine "
                    f"{target.pristine_sha256}, file {found}: {side}"
                )
            if found != target.pristine_sha256:
                raise _bad_wheel(wheel, f"{target.path} hashing to {found}, not to its RECORD sha256")
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
