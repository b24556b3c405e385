"""`t4patch list`: the patch sets shipped with this t4patch, their diffs and why each exists."""

from __future__ import annotations

import argparse

from t4patch.cli_options import add_json_option
from t4patch.output import emit_json, say
from t4patch.patching.registry import all_patch_sets


def configure_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("list", help="list the shipped patch sets and their diffs")
    add_json_option(parser)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    patch_sets = all_patch_sets()
    if args.json:
        emit_json(
            "list",
            {
                "patch_sets": [
                    {
                        "distribution": ps.distribution,
                        "version": ps.version,
                        "summary": ps.summary,
                        "patches": [
                            {"file": p.file, "title": p.title, "fixes": p.fixes, "gpus": p.gpus,
                             "references": list(p.references), "files": list(p.paths)}
                            for p in ps.patches
                        ],
                        "targets": [
                            {"path": t.path, "pristine_sha256": t.pristine_sha256,
                             "patched_sha256": t.patched_sha256}
                            for t in ps.targets
                        ],
                    }
                    for ps in patch_sets
                ]
            },
        )
        return 0
    for ps in patch_sets:
        say(f"{ps.spec}  ({len(ps.patches)} diff(s), {len(ps.targets)} file(s)): {ps.summary}")
        for p in ps.patches:
            say(f"  {p.file}: {p.title}")
    return 0
