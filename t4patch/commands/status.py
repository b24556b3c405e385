"""`t4patch status [ENGINE...]`: per file pristine / patched / foreign / missing, decided by sha256."""

from __future__ import annotations

import argparse

from packaging.utils import canonicalize_name

from t4patch.cli_options import add_json_option, add_target_options
from t4patch.commands.engine_table import example_name, example_spec
from t4patch.environment import suggest
from t4patch.environment.target import TargetEnvironment, resolve_target
from t4patch.errors import NotAppliedError, NotInstalledError, UsageError
from t4patch.output import emit_json, say, table
from t4patch.patching.registry import engines
from t4patch.patching.selection import parse_spec
from t4patch.patching.state import read_record
from t4patch.patching.status import (
    EngineStatus,
    check_applied,
    checked_by_default,
    companion_of,
    engine_status,
    option_detail,
    required_options,
)


def configure_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "status",
        help="show whether each engine's patch set is applied",
        description="For each ENGINE (default: every installed engine t4patch has patch sets for) report each "
        "target file as pristine, patched, foreign (neither hash) or missing, and each optional diff of its "
        "patch set as applied or not.",
    )
    parser.add_argument("engines", nargs="*", metavar="ENGINE", help=f"engine name, e.g. {example_name()} or {example_spec(1)}")
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 9 unless every requested engine's patch set is fully applied (its default diffs: optional "
        "ones are not required unless named with --with) and every companion its set requires ([[requires]], "
        "t4patch list) is installed at that release; without ENGINE: every installed engine except one "
        "installed, unpatched, only as the companion of an applied set",
    )
    parser.add_argument("--with", dest="options", action="append", default=[], metavar="NAME",
                        help="with --check: also require this optional diff to be applied (repeatable)")
    add_target_options(parser)
    add_json_option(parser)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    target = resolve_target(args.python, args.site_packages)
    if args.options and not args.check:
        raise UsageError(
            f"--with {' '.join(args.options)}: expected --check with it (status always shows every optional diff; "
            "--with only adds it to what --check requires)",
            hint=suggest.command(target, "status", *args.engines, "--check", "--with", args.options[0]),
        )
    if args.engines:
        names = []
        for spec in args.engines:
            req = parse_spec(spec)
            names.append(canonicalize_name(req.name))
        unknown = [n for n in names if n not in engines()]
        if unknown:
            raise NotInstalledError(
                f"t4patch has no patch sets for {', '.join(unknown)}; it patches: {', '.join(engines())}",
                hint="t4patch list",
            )
        statuses = [engine_status(n, target) for n in names]
    else:
        statuses = [s for s in (engine_status(n, target) for n in engines()) if s.overall != "not-installed"]
        if not statuses and args.check:
            raise NotAppliedError(
                f"--check: none of the engines t4patch patches ({', '.join(engines())}) is installed in "
                f"{target.description}",
                hint=f"name the serving environment (a manual step: fill in its interpreter): "
                f"{suggest.PROGRAM} status --check --python {suggest.PYTHON_PLACEHOLDER}",
            )
    checked = statuses if args.engines else checked_by_default(statuses)
    required = required_options(checked, args.options) if args.check else {}
    if args.json:
        emit_json("status", {"target": target.to_json(), "engines": [s.to_json() for s in statuses]})
    else:
        print_status(statuses, target)
    if args.check:
        check_applied(checked, required, target)
    return 0


def print_status(statuses: list[EngineStatus], target: TargetEnvironment) -> None:
    say(f"target: {target.description}")
    if not statuses:
        say(f"none of the engines t4patch patches ({', '.join(engines())}) is installed here")
        return
    for s in statuses:
        version = s.installed.version if s.installed else "-"
        say(f"\n{s.name} {version}: {s.overall} ({s.detail})")
        beside = companion_of(s, statuses)
        if beside and s.overall == "not-applied":
            say(f"  installed as the companion of {', '.join(beside)} (its compiled code; a bare --check does not "
                f"require this set: {suggest.command(target, 'status', s.name, '--check')} does)")
        if s.installed and s.overall not in ("not-installed", "no-patch-set"):
            record = read_record(s.installed)
            if record is not None:
                with_ = f" with {', '.join(record.options)}" if record.options else ""
                say(f"  record: {record.patch_set}{with_} applied {record.applied_at} by t4patch "
                    f"{record.t4patch_version}")
        if s.files:
            say(table(["  state", "file"], [(f"  {f.state}", f.target.path) for f in s.files]))
        for o in s.options:
            say(f"  optional {o.name}: {o.state}; {option_detail(s, o, target)}")
            say(table(["    state", "file"], [(f"    {f.state}", f.target.path) for f in o.files]))
