"""`t4patch validate [DIR...]`: check patch sets before they ship (CI for the patches/ tree).

Loading validates the manifest and diffs; with ``--wheel`` the set is also proven against a released
wheel's files: every pristine sha256 equals RECORD, every diff applies exactly, and reversing it gives the
pristine bytes back. That is the same proof the integration tests make, usable on a new engine release.
"""

from __future__ import annotations

import argparse
import zipfile
from pathlib import Path

from t4patch.cli_options import add_json_option
from t4patch.environment.target import parse_record
from t4patch.errors import PatchSetError
from t4patch.fileio.hashing import sha256_bytes
from t4patch.output import emit_json, say
from t4patch.patching.manifest import PatchSet, load_patch_set
from t4patch.patching.registry import all_patch_sets
from t4patch.patching.unified_diff import DiffMismatch, apply_file_diff


def configure_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "validate",
        help="check patch sets (manifest, diffs, hashes), optionally against a released wheel",
    )
    parser.add_argument("dirs", nargs="*", metavar="DIR", help="patch-set directories (default: all shipped)")
    parser.add_argument(
        "--wheel", metavar="WHL", help="prove the patch set against this released wheel (pristine = RECORD)"
    )
    add_json_option(parser)
    parser.set_defaults(func=run)
    return parser


def prove_against_wheel(patch_set: PatchSet, wheel: Path) -> list[str]:
    """Check every target against the wheel; return one line per proven file, raise on the first failure."""
    lines = []
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
            data = pristine
            try:
                for diff in patch_set.diffs_for(target.path):
                    data = apply_file_diff(data, diff)
                if sha256_bytes(data) != target.patched_sha256:
                    raise PatchSetError(
                        f"{patch_set.spec}: {target.path} patches to {sha256_bytes(data)}, manifest pins "
                        f"{target.patched_sha256}"
                    )
                for diff in reversed(patch_set.diffs_for(target.path)):
                    data = apply_file_diff(data, diff, reverse=True)
            except DiffMismatch as exc:
                raise PatchSetError(f"{patch_set.spec}: {exc}") from None
            if data != pristine:
                raise PatchSetError(f"{patch_set.spec}: reversing {target.path} does not give the pristine bytes")
            lines.append(f"{target.path}: pristine = RECORD, applies exactly, patched hash ok, reverts exactly")
    return lines


def run(args: argparse.Namespace) -> int:
    sets = [load_patch_set(Path(d)) for d in args.dirs] if args.dirs else all_patch_sets()
    results = []
    for ps in sets:
        proven = prove_against_wheel(ps, Path(args.wheel)) if args.wheel else []
        results.append({"patch_set": ps.spec, "directory": str(ps.directory), "valid": True, "wheel_checks": proven})
    if args.json:
        emit_json("validate", {"results": results})
        return 0
    for r in results:
        say(f"{r['patch_set']}: valid ({r['directory']})")
        for line in r["wheel_checks"]:
            say(f"  {line}")
    return 0
