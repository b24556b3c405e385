"""`t4patch doctor`: what GPU this is, what is installed in the target environment, what needs patching.

Reads only metadata (dist-info, the CUDA driver, NVML, /proc): no torch, triton or engine import, so it runs
in a second even where importing an engine would take ten or fail. Missing GPU or NVML is reported, exit 0.
Engine-specific readiness checks come from the engine table (``Engine.doctor``), one section per engine.
"""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path
from typing import Any

from t4patch import engines as engine_table
from t4patch.cli_options import add_json_option, add_target_options
from t4patch.cuda.gpu import GpuReport, detect
from t4patch.engines.base import DoctorSection
from t4patch.environment import suggest
from t4patch.environment.target import InstalledDistribution, TargetEnvironment, resolve_target
from t4patch.output import emit_json, say, table
from t4patch.patching.registry import engines
from t4patch.patching.status import engine_status
from t4patch.readiness.model import Check, Context
from t4patch.readiness.stack import run_checks

# The stack under every engine that decides whether it runs on Turing; the engines' own distributions come
# first, from the engine table.
WIDTH = 120  # text output fits a 120-column terminal
STACK = ("torch", "triton", "flashinfer-python", "nvidia-ml-py")
WATCHED = (*engine_table.engine_distributions(), *STACK)


def configure_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("doctor", help="detect the GPU, the installed engines and their patch state")
    add_target_options(parser)
    add_json_option(parser)
    parser.set_defaults(func=run)
    return parser


def torch_build(dist: InstalledDistribution) -> str:
    """'cpu' or 'cuda' from the installed files, without importing torch."""
    if "+cpu" in dist.version:
        return "cpu"
    try:
        record = dist.record()
    except OSError:
        return "unknown"
    return "cuda" if any(p.endswith("libtorch_cuda.so") for p in record) else "cpu"


def memory() -> dict[str, int | None]:
    """RAM and swap in bytes from /proc/meminfo (Linux)."""
    values: dict[str, int] = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            values[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return {"ram_total": None, "ram_available": None, "swap_total": None, "swap_free": None}
    return {
        "ram_total": values.get("MemTotal"),
        "ram_available": values.get("MemAvailable"),
        "swap_total": values.get("SwapTotal"),
        "swap_free": values.get("SwapFree"),
    }


def packages(target: TargetEnvironment) -> list[dict[str, Any]]:
    rows = []
    for name in WATCHED:
        dist = target.find(name)
        row: dict[str, Any] = {"name": name, "version": dist.version if dist else None}
        if dist and name == "torch":
            row["build"] = torch_build(dist)
        rows.append(row)
    return rows


def advice(
    report: GpuReport,
    pkgs: list[dict[str, Any]],
    engine_rows: list[dict[str, Any]],
    target: TargetEnvironment | None = None,
) -> list[str]:
    """Plain-language warnings: each names the problem and the command that fixes it (aimed at ``target``)."""
    notes = []
    turing = [g for g in report.gpus if g.cc_tuple < (8, 0)]
    torch_row = next(p for p in pkgs if p["name"] == "torch")
    if report.gpus and torch_row.get("build") == "cpu":
        notes.append("torch is a CPU-only build but a GPU is present: install a CUDA build of torch")
    for row in engine_rows:
        if row["state"] in ("not-applied", "partial") and (turing or not report.gpus):
            notes.append(
                f"{row['engine']} {row['installed_version']} is not patched: "
                + suggest.command(target, "apply", row["patch_set"])
            )
        elif row["state"] == "foreign" or row["state"] == "no-patch-set":
            notes.append(f"{row['engine']}: {row['detail']}")
    for gpu in turing:
        notes.append(f"GPU {gpu.index} ({gpu.name}, {gpu.sm}) has no bf16: serve with --dtype float16")
    return notes


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
    report = detect()
    pkgs = packages(target)
    engine_rows = [engine_status(name, target).to_json() for name in engines()]
    mem = memory()
    notes = advice(report, pkgs, engine_rows, target)
    sections: list[tuple[str | None, DoctorSection | None]] = [
        (engine.doctor_key, engine.doctor(target)) for engine in engine_table.ENGINES
    ]
    for _, section in sections:
        if section is not None:
            notes.extend(section.warnings)
    checks = run_checks(Context(target, report, mem))
    if args.json:
        emit_json(
            "doctor",
            {
                "target": target.to_json(),
                "gpu": report.to_json(),
                "packages": pkgs,
                "engines": engine_rows,
                "memory": mem,
                **{key: section.data if section else None for key, section in sections if key is not None},
                "checks": [check.to_json() for check in checks],
                "advice": notes,
            },
        )
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
    for _, section in sections:
        if section is not None:
            say("")
            say(section.title)
            for line in section.lines:
                say(line)
    say("")
    say("checks:")
    for line in render_checks(checks):
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
