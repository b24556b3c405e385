"""`t4patch doctor`: what GPU this is, what is installed in the target environment, what needs patching.

Reads only metadata (dist-info, the CUDA driver, NVML, /proc): no torch, triton or engine import, so it runs
in a second even where importing an engine would take ten or fail. Missing GPU or NVML is reported, exit 0.
What is found is gathered by :mod:`t4patch.readiness.report` (engine findings through each engine's doctor hook,
in the order of the engine table handed in here); this module only renders it.
"""

from __future__ import annotations

import argparse
import textwrap

from t4patch.cli_options import add_json_option, add_target_options
from t4patch.commands.engine_table import ENGINES
from t4patch.contract import Check
from t4patch.cuda.gpu import detect
from t4patch.environment import suggest
from t4patch.environment.target import resolve_target
from t4patch.output import emit_json, say, table
from t4patch.readiness.report import gather

WIDTH = 120  # text output fits a 120-column terminal


def configure_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("doctor", help="detect the GPU, the installed engines and their patch state")
    add_target_options(parser)
    add_json_option(parser)
    parser.set_defaults(func=run)
    return parser


def render_checks(checks: list[Check], width: int = WIDTH) -> list[str]:
    """One block per check: status, name and reason wrapped to ``width`` columns, then the fix on one line."""
    name_width = max((len(c.name) for c in checks), default=0)
    lines = []
    for check in checks:
        head = f"  {check.status:<4}  {check.name:<{name_width}}  "
        lines += textwrap.wrap(check.reason, width, initial_indent=head, subsequent_indent=" " * len(head))
        if check.fix:
            # never wrapped: a fix is often a command, and a command broken over lines cannot be pasted
            lines.append(" " * len(head) + "fix: " + check.fix)
    return lines


def run(args: argparse.Namespace) -> int:
    target = resolve_target(args.python, args.site_packages)
    found = gather(target, detect(), ENGINES)
    report, pkgs, engine_rows, mem, notes = found.gpus, found.packages, found.engine_rows, found.memory, found.advice
    if args.json:
        doc = found.to_json()
        # the commands in advice and fixes name the t4patch the user ran, as the text output's do
        doc["advice"] = [suggest.render(note) for note in doc["advice"]]
        for check in doc["checks"]:
            check["fix"] = suggest.render(check["fix"]) if check["fix"] else None
        emit_json("doctor", doc)
        return 0
    say(f"target: {target.description}")
    say("")
    if report.gpus:
        say(f"GPUs (driver {report.driver_version or '?'}, CUDA driver {report.cuda_driver_version or '?'}):")
        say(
            table(
                ["  #", "name", "cc", "smem/block opt-in", "bf16", "memory"],
                [
                    (
                        f"  {g.index}",
                        g.name,
                        g.compute_capability,
                        f"{g.shared_memory_per_block_optin:,} B" if g.shared_memory_per_block_optin else "?",
                        "yes" if g.bf16 else "no",
                        f"{g.memory_total_bytes / 2**30:.1f} GiB" if g.memory_total_bytes else "?",
                    )
                    for g in report.gpus
                ],
            )
        )
    else:
        say("GPUs: none found (" + ("; ".join(report.problems) or "no devices") + ")")
    say("")
    say("packages:")
    say(
        table(
            ["  name", "version", "note"],
            [(f"  {p['name']}", p["version"] or "not installed", p.get("build", "")) for p in pkgs],
        )
    )
    say("")
    say("patch sets:")
    say(
        table(
            ["  engine", "installed", "patch set", "state"],
            [
                (f"  {e['engine']}", e["installed_version"] or "-", e["patch_set"] or "-", e["state"])
                for e in engine_rows
            ],
        )
    )
    for _, section in found.sections:
        if section is not None and section.title is not None:
            say("")
            say(section.title)
            for line in section.lines:
                say(line)
    say("")
    say("checks:")
    for line in render_checks(found.checks):
        say(line)
    gib = 2**30
    if mem["ram_total"] is not None:
        say("")
        say(
            f"memory: RAM {mem['ram_total'] / gib:.1f} GiB ({(mem['ram_available'] or 0) / gib:.1f} available), "
            f"swap {(mem['swap_total'] or 0) / gib:.1f} GiB"
        )
    if notes:
        say("")
        for note in notes:
            say(f"! {note}")
    return 0
