"""`t4patch port ENGINE==NEW`: carry a shipped patch set to another release of its engine, as a draft."""

from __future__ import annotations

import argparse
from pathlib import Path

from t4patch.cli_options import add_json_option
from t4patch.commands.engine_table import example_name
from t4patch.errors import IncompletePortError, UsageError
from t4patch.output import emit_json, say
from t4patch.patching.port import port
from t4patch.patching.release_spec import exact_release


def configure_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "port",
        help="port a patch set to another release of its engine (writes a draft for review)",
        description="Land every hunk of a shipped patch set on another release's files (exact, at an offset, "
        "already upstream, or by 3-way merge; never fuzz), and write a draft patch set for it: apply refuses "
        "the draft until a maintainer reviews it and deletes `draft = true`. See docs/maintaining.md.",
    )
    parser.add_argument("spec", metavar="ENGINE==NEW", help=f"the release to port to, e.g. {example_name()}==<version>")
    parser.add_argument("--from", dest="from_spec", metavar="ENGINE==OLD",
                        help="the shipped set to port from (default: the nearest shipped release)")
    parser.add_argument("--wheel", metavar="PATH", help="NEW's wheel (default: the wheel cache, else pip download)")
    parser.add_argument("--from-wheel", metavar="PATH", help="OLD's wheel (default: the wheel cache, else pip download)")
    parser.add_argument("-o", "--output", metavar="DIR", default="port-drafts",
                        help="patch-set tree to write the draft into, as DIR/<engine>/<version>/ (default: port-drafts)")
    add_json_option(parser)
    parser.set_defaults(func=run)
    return parser


PORT_EXAMPLE = "t4patch port {name}==<version>"


def run(args: argparse.Namespace) -> int:
    name, new_version = exact_release(args.spec, option="port", example=PORT_EXAMPLE)
    old_version = None
    if args.from_spec:
        old_name, old_version = exact_release(args.from_spec, option="--from",
                                              example=f"t4patch port {name}=={new_version} --from {{name}}==<version>")
        if old_name != name:
            raise UsageError(f"--from {args.from_spec}: expected a release of {name}, found {old_name}")
    report = port(name, new_version, Path(args.output), old_version=old_version, wheel=args.wheel,
                  from_wheel=args.from_wheel)
    if args.json:
        emit_json("port", report.to_json())
    else:
        for line in report.lines():
            say(line)
    # A draft that needs a hand edit (or no draft at all) is not a finished port: a script must see it.
    return 0 if report.complete else IncompletePortError.exit_code
