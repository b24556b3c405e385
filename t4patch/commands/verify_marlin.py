"""`t4patch verify marlin`: run the engine's Marlin W4A16 kernels on the GPU against t4patch's references.

Exit codes: 0 pass; 12 VerificationError (accuracy, repack, overflow, redirect); 13 DeterminismError (only
determinism failed); 11 NoGpuError; 10 MissingDependencyError (torch, the engine's library or modules); 9
NotAppliedError (a redirecting provider on an unpatched engine).

The providers and their options come from the engine table (``Engine.marlin``). The kernels must run in the
interpreter that has the engine and a CUDA torch. With ``--python EXE`` naming another interpreter, this
command re-runs itself there (through :mod:`t4patch.environment.interpreter`) and passes its output and exit
code through; ``--site-packages DIR`` puts DIR first on this interpreter's path.
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

from t4patch.cli_options import add_json_option, add_target_options
from t4patch.commands.engine_table import ENGINES
from t4patch.contract import ProviderOption
from t4patch.environment import interpreter
from t4patch.environment.target import resolve_target
from t4patch.errors import TargetEnvironmentError
from t4patch.output import emit_json, say


def _provider_options() -> list[ProviderOption]:
    """Every provider's own options, once each (providers of one engine family share them)."""
    seen: dict[str, ProviderOption] = {}
    for spec in ENGINES.marlin_specs():
        for option in spec.options:
            seen.setdefault(option.flag, option)
    return list(seen.values())


def configure_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "marlin",
        help="check the engine's Marlin W4A16 GEMM and repack on the GPU (Gemma 4 E2B shapes)",
        description=(
            "Run the engine's Marlin repack and GEMM on model shapes and compare them with t4patch's own "
            "references: the Marlin tile layout (exact), an fp16 matmul of the dequantized weights "
            "(mean|out-ref|/mean|ref| <= 0.04), bitwise determinism with atomic-add off, an overflow scan with "
            "Gemma-sized activations, and kernel time against fp16 matmul and the GPU's memory bandwidth."
        ),
    )
    specs = ENGINES.marlin_specs()
    parser.add_argument(
        "--provider",
        choices=[spec.name for spec in specs],
        default=specs[0].name,
        help="; ".join(f"{spec.name}: {spec.help}" for spec in specs),
    )
    parser.add_argument("--shapes", default="gemma4-e2b", metavar="TABLE", help="shape table in cases/shapes/")
    parser.add_argument("--m", dest="m_list", metavar="M,M,...", help="batch sizes (default 1,16,64,512; --quick: 1,64)")
    parser.add_argument("--quick", action="store_true", help="fewer batch sizes and timing replays")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic weights and activations")
    for option in _provider_options():
        parser.add_argument(option.flag, dest=option.dest, metavar=option.metavar, help=option.help)
    parser.add_argument("--no-speed", action="store_true", help="skip the timing (accuracy checks only)")
    add_target_options(parser)
    add_json_option(parser)
    parser.set_defaults(func=run)
    return parser


def _forwarded_argv(args: argparse.Namespace) -> list[str]:
    argv = ["verify", "marlin", "--provider", args.provider, "--shapes", args.shapes, "--seed", str(args.seed)]
    if args.m_list:
        argv += ["--m", args.m_list]
    if args.quick:
        argv.append("--quick")
    for option in _provider_options():
        value = getattr(args, option.dest, None)
        if value:
            argv += [option.flag, str(Path(value).expanduser().resolve()) if option.is_path else value]
    if args.no_speed:
        argv.append("--no-speed")
    if args.json:
        argv.append("--json")
    return argv


def _rerun_in(python: str, args: argparse.Namespace) -> int:
    """Run this command again under ``python``, with its output and exit code passed through."""
    try:
        with interpreter.t4patch_command(python, "t4patch.cli") as argv:
            return subprocess.run([*argv, *_forwarded_argv(args)], check=False).returncode
    except OSError as exc:
        raise TargetEnvironmentError(
            f"--python {python}: could not run it ({exc})", hint="pass e.g. --python /path/to/venv/bin/python"
        ) from exc


def run(args: argparse.Namespace) -> int:
    from t4patch.verify.marlin import report, runner

    if args.python and not interpreter.is_this_environment(args.python):
        resolve_target(args.python, None)  # validates the interpreter with a clear error first
        return _rerun_in(args.python, args)
    target = resolve_target(None, args.site_packages)
    request = runner.Request(
        provider=args.provider,
        target=target,
        engines=ENGINES,
        shapes=args.shapes,
        m_values=runner.parse_m_list(args.m_list) if args.m_list else None,
        quick=args.quick,
        seed=args.seed,
        options={option.dest: getattr(args, option.dest, None) for option in _provider_options()},
        speed=not args.no_speed,
    )
    payload, failures = runner.run(request)
    if args.json:
        emit_json(report.COMMAND, payload)
    else:
        say(report.render_text(payload, ENGINES))
    report.raise_for_failures(failures)
    return 0
