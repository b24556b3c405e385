"""`t4patch revert ENGINE...`: back to the pristine released bytes, proven by their sha256."""

from __future__ import annotations

import argparse

from t4patch.cli_options import add_json_option, add_target_options
from t4patch.engines import example_name, example_spec
from t4patch.environment.target import resolve_target
from t4patch.output import emit_json, say
from t4patch.patching import operation


def configure_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "revert",
        help="restore the pristine files of patched engines",
        description="Restore every file of the engine's patch set to the released bytes (checked against the "
        "pristine sha256 before writing), optional diffs included: every file t4patch patched. Refuses "
        "foreign files.",
    )
    parser.add_argument("specs", nargs="+", metavar="ENGINE", help=f"engine name, e.g. {example_name()} or {example_spec()}")
    parser.add_argument("--dry-run", action="store_true", help="print the unified diff it would make; write nothing")
    add_target_options(parser)
    add_json_option(parser)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    target = resolve_target(args.python, args.site_packages)
    result = operation.run(args.specs, target, "revert", dry_run=args.dry_run)
    if args.json:
        emit_json("revert", {"target": target.to_json(), "results": [result.describe(p) for p in result.plans]})
    else:
        for line in result.lines():
            say(line)
    return 0
