"""`t4patch port ENGINE==NEW`: carry a shipped patch set to another release of its engine, as a draft."""

from __future__ import annotations

import argparse
from pathlib import Path

from packaging.utils import canonicalize_name

from t4patch.cli_options import add_json_option
from t4patch.engines import example_name, example_spec
from t4patch.errors import UsageError
from t4patch.output import emit_json, say
from t4patch.patching.port import port
from t4patch.patching.selection import parse_spec


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


def _exact(spec: str, option: str) -> tuple[str, str]:
    req = parse_spec(spec)
    pins = [s for s in req.specifier if s.operator == "=="]
    if len(list(req.specifier)) != 1 or not pins or "*" in pins[0].version:
        raise UsageError(
            f"{option} {spec}: expected one exact release, e.g. {example_spec()}, found {spec!r}",
            hint="t4patch list (the shipped releases)",
        )
    return canonicalize_name(req.name), pins[0].version


def run(args: argparse.Namespace) -> int:
    name, new_version = _exact(args.spec, "port")
    old_version = None
    if args.from_spec:
        old_name, old_version = _exact(args.from_spec, "--from")
        if old_name != name:
            raise UsageError(f"--from {args.from_spec}: expected a release of {name}, found {old_name}")
    report = port(name, new_version, Path(args.output), old_version=old_version, wheel=args.wheel,
                  from_wheel=args.from_wheel)
    if args.json:
        emit_json("port", report.to_json())
    else:
        for line in report.lines():
            say(line)
    return 0
