"""`t4patch verify attention [ENGINE...] [--arch sm_75]`: does each engine's Triton attention fit the GPU?

Compiles the installed engine's own attention launches (Gemma 4 E2B shapes, every code path) for the chosen
architecture on this machine, no GPU needed, and compares each kernel's shared memory with the architecture's
limit. Per launch it also reports the path of its tl.dot (tensor cores or fp32 FMA, with the PTX's mma.sync and
fma.rn.f32 counts); when the compiling Triton has t4patch's Triton set applied, each launch is compiled a second
time with the set switched off and shown beside it. Exit 0 when every case fits, 12 (VerificationError) when
any does not, or, with the Triton set applied on sm_75, when a patched fp16 attention dot stays on FMA or
spills; 10 when torch / triton / an engine dependency is missing in the interpreter that compiles (every
missing module named at once, with one install command).
"""

from __future__ import annotations

import argparse

from t4patch.cli_options import add_json_option, add_target_options
from t4patch.commands.engine_table import ENGINES
from t4patch.environment.target import resolve_target
from t4patch.output import emit_json, say


def configure_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "attention",
        help="compile each engine's Triton attention for a GPU architecture and check it fits",
        description="Drive the installed engine's own attention launcher ("
        + "; ".join(e.attention_summary for e in ENGINES if e.attention_summary)
        + ") with Gemma 4 E2B shapes, compile every "
        "launch for --arch instead of running it, and report tiles, warps, shared memory against the "
        "architecture's limit, registers, spills and the path each tl.dot took (mma.sync / fma.rn.f32 "
        "counts), stock and patched Triton side by side when t4patch's Triton set is applied. Needs torch "
        "(CPU build is fine) and the triton the engine pins (the verify extra: pip install -e '.[verify]' in "
        "a t4patch checkout), no GPU.",
    )
    parser.add_argument(
        "engines",
        nargs="*",
        metavar="ENGINE",
        help=" and/or ".join(e.name for e in ENGINES if e.attention_drivers)
        + " (default: every installed engine with a case table)",
    )
    parser.add_argument(
        "--arch",
        default="sm_75",
        metavar="SM",
        help="target architecture: sm_70, sm_75 (default, Tesla T4), sm_80, sm_86, sm_89, sm_90",
    )
    add_target_options(parser)
    add_json_option(parser)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from t4patch.verify.attention.cases import load_cases, resolve_arch
    from t4patch.verify.attention.runner import check, verify_attention

    arch = resolve_arch(args.arch)
    target = resolve_target(args.python, args.site_packages)
    report = verify_attention(
        list(args.engines),
        arch,
        target,
        python=target.python if args.python else None,
        site_packages=str(target.search_path[0]) if args.site_packages else None,
        table=load_cases(drivers=ENGINES.attention_drivers()),  # the case table may name only the table's drivers
    )
    if args.json:
        emit_json("verify attention", report.to_json())
    else:
        say(report.render_text())
    check(report, target)
    return 0
