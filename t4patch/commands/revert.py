"""`t4patch revert ENGINE...`: back to the pristine released bytes, proven by their sha256."""

from __future__ import annotations

import argparse
import shlex

from packaging.utils import canonicalize_name

from t4patch.cli_options import add_json_option, add_target_options
from t4patch.commands.engine_table import example_name, example_spec
from t4patch.environment import suggest
from t4patch.environment.target import TargetEnvironment, resolve_target
from t4patch.errors import NotInstalledError
from t4patch.output import emit_json, say
from t4patch.patching import operation
from t4patch.patching.registry import engines
from t4patch.patching.selection import find_installed, parse_spec


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
    for spec in args.specs:
        refuse_absent(spec, target)
    result = operation.run(args.specs, target, "revert", dry_run=args.dry_run)
    if args.json:
        emit_json("revert", {"target": target.to_json(), "results": [result.describe(p) for p in result.plans]})
    else:
        for line in result.lines():
            say(line)
    return 0


def refuse_absent(spec: str, target: TargetEnvironment) -> None:
    """An engine that is not installed has nothing to revert: say so, and where to look, never "install it"
    (a revert that suggests ``pip install vllm==0.33.0`` would pull a whole engine, and another torch, into an
    environment that never had it, or into t4patch's own venv when ``--python`` was forgotten)."""
    name = canonicalize_name(parse_spec(spec).name)
    if name not in engines() or find_installed(target, name) is not None:
        return  # an unknown name, and everything else, is the operation's own error
    look = suggest.command(target, "status")
    rerun = f"{suggest.PROGRAM} revert {shlex.quote(spec)} --python {suggest.PYTHON_PLACEHOLDER}"
    raise NotInstalledError(
        f"{name} is not installed in {target.description}: nothing to revert there",
        hint=f"see what is installed there: {look}; if the patched {name} is in another environment, name its "
        f"interpreter (a manual step: fill in the path): {rerun}",
    )
