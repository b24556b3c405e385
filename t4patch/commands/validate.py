"""`t4patch validate [DIR...]`: check patch sets before they ship (CI for the patches/ tree).

Loading validates the manifest and diffs; with ``--wheel`` the set is also proven against a released
wheel's files (:mod:`t4patch.patching.wheelproof`): every pristine sha256 equals RECORD, every diff applies
exactly, and reversing it gives the pristine bytes back.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from t4patch.cli_options import add_json_option
from t4patch.output import emit_json, say
from t4patch.patching.manifest import load_patch_set
from t4patch.patching.registry import all_patch_sets, sets_for_wheel
from t4patch.patching.wheelproof import prove_against_wheel


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


def run(args: argparse.Namespace) -> int:
    sets = [load_patch_set(Path(d)) for d in args.dirs] if args.dirs else all_patch_sets()
    if args.wheel and not args.dirs:
        sets = sets_for_wheel(sets, Path(args.wheel))  # the set made for that wheel's release, not every set
    results: list[dict[str, Any]] = []
    for ps in sets:
        proven = [p.line for p in prove_against_wheel(ps, Path(args.wheel))] if args.wheel else []
        results.append({"patch_set": ps.spec, "directory": str(ps.directory), "valid": True, "draft": ps.draft,
                        "wheel_checks": proven})
    if args.json:
        emit_json("validate", {"results": results})
        return 0
    for r in results:
        if r["draft"]:  # valid data, but nobody has reviewed it: apply and wheel refuse it
            say(f"{r['patch_set']}: valid DRAFT ({r['directory']}): written by t4patch port, not reviewed; apply "
                "and wheel refuse it until its `draft = true` line is deleted (docs/maintaining.md)")
        else:
            say(f"{r['patch_set']}: valid ({r['directory']})")
        for line in r["wheel_checks"]:
            say(f"  {line}")
    return 0
