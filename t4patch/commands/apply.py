"""`t4patch apply SPEC...`: patch installed engines, all-or-nothing, idempotent."""

from __future__ import annotations

import argparse

from t4patch.cli_options import add_json_option, add_target_options
from t4patch.commands.engine_table import example_name, example_spec
from t4patch.engines.requirements import companion_problems
from t4patch.environment.target import resolve_target
from t4patch.output import emit_json, say, warn
from t4patch.patching import operation


def configure_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "apply",
        help="apply the patch set matching each installed engine",
        description="Apply the patch set for the installed version of each ENGINE. Every file is checked by "
        "sha256 first; if any file is foreign, nothing is written. Optional diffs (t4patch list names them) are "
        "off unless asked for with --with NAME; an optional diff already applied is left applied (only revert "
        "removes it).",
    )
    parser.add_argument("specs", nargs="+", metavar="SPEC", help=f"engine, optionally pinned: {example_name()} or {example_spec()}")
    parser.add_argument("--dry-run", action="store_true", help="print the unified diff it would make; write nothing")
    parser.add_argument("--with", dest="options", action="append", default=[], metavar="NAME",
                        help="also apply this optional diff of the patch set (repeatable; t4patch list names them)")
    add_target_options(parser)
    add_json_option(parser)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    target = resolve_target(args.python, args.site_packages)
    result = operation.run(args.specs, target, "apply", dry_run=args.dry_run, options=args.options)
    # the patched code needs its companions (the manifests' [[requires]]): say so now, with the install command
    warnings = [w for plan in result.plans for w in companion_problems(plan.patch_set, target)]
    if args.json:
        emit_json("apply", {"target": target.to_json(), "results": [result.describe(p) for p in result.plans],
                            "warnings": warnings})
    else:
        for line in result.lines(target):
            say(line)
        for text in warnings:
            warn(text)
    return 0
