"""`t4patch wheel ENGINE==VERSION`: the released wheel with its patch set applied, for fleets and images.

Parse, one call into :mod:`t4patch.patching.wheel`, render. Install the result with the ordinary tools
(``pip install --no-deps``) on every node or in an image build; docs/fleet.md shows the whole flow.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from t4patch.cli_options import add_json_option
from t4patch.commands.engine_table import example_spec
from t4patch.output import emit_json, say

DESCRIPTION = """\
Build a patched wheel of one engine release: the released wheel (pip download --no-deps into t4patch's wheel
cache, or --from-wheel), proven to be the release (file name, dist-info and METADATA name it; every member =
RECORD), with the patch set applied, a local version label (0.33.0+t4patch.0.1.0.h1a2b3c4d: the t4patch
release that built it and a hash of what it adds; with --with, +t4patch.with.<option>..., which sorts below
the plain wheel, so a directory holding both installs the plain one unless the full label is pinned), the real
distribution name and tags, RECORD and METADATA rewritten and a t4patch state record inside, so that
`t4patch status` on an install from it reports the patch set as applied. Reproducible: the same inputs give
the same bytes; SHA256SUMS beside the wheel lists it. -o must be a directory (or not exist yet) outside every
patch-set tree; a file of the output's name that is not this build's bytes is refused, never replaced."""


def configure_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("wheel", help="build a patched wheel of an engine release (for fleets and images)",
                                   description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("spec", metavar="ENGINE==VERSION", help=f"the release, e.g. {example_spec()}")
    parser.add_argument("--from-wheel", metavar="PATH", type=Path,
                        help="the released wheel file to start from (default: pip download --no-deps)")
    parser.add_argument("-o", "--out", metavar="DIR", type=Path, default=Path("."),
                        help="directory to write the wheel and SHA256SUMS to (default: .)")
    parser.add_argument("--with", dest="options", action="append", default=[], metavar="OPTIONAL",
                        help="also apply this optional diff of the patch set (repeatable; t4patch list names them)")
    add_json_option(parser)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from t4patch.patching.wheel import build_patched_wheel

    result = build_patched_wheel(args.spec, out_dir=args.out, from_wheel=args.from_wheel,
                                 options=tuple(args.options))
    if args.json:
        emit_json("wheel", result.to_json())
        return 0
    say(f"{result.spec}{' with ' + ', '.join(result.options) if result.options else ''}: "
        f"{len(result.files)} file(s) patched, version {result.version}")
    say(f"wheel   {result.path}{' (already there, byte for byte: kept)' if result.kept else ''}")
    say(f"sha256  {result.sha256}")
    say(f"sums    {result.sums}")
    say(f"install pip install --no-deps {shlex.quote(str(result.path))}")
    return 0
