"""Everything `t4patch doctor` finds, gathered in one pass: packages, patch state, RAM and swap, the generic
checks, each engine's doctor section, and the advice that names a fix for each problem found.

The command only renders this (text or JSON). The engines' own findings come from their one doctor hook
(:meth:`t4patch.contract.Engine.doctor`), called here in the order of the engine table the command hands in;
the advice that belongs to no engine (a CPU torch beside a GPU, an unpatched engine, no bf16) is written here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from t4patch.contract import Check, Context, DoctorSection, EngineTable
from t4patch.cuda.gpu import GpuReport
from t4patch.environment import suggest
from t4patch.environment.target import InstalledDistribution, TargetEnvironment
from t4patch.patching.registry import engines as patched_distributions
from t4patch.patching.status import engine_status
from t4patch.readiness.stack import run_checks, torch_fix

# The stack under every engine that decides whether it runs on Turing; the engines' own distributions come
# first, from the engine table.
STACK = ("torch", "triton", "flashinfer-python", "nvidia-ml-py")


def watched(engines: EngineTable) -> tuple[str, ...]:
    """The distributions doctor lists: every engine's, then the stack's."""
    return (*engines.distributions(), *STACK)


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


def packages(target: TargetEnvironment, engines: EngineTable) -> list[dict[str, Any]]:
    rows = []
    for name in watched(engines):
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
        pip = target.pip_install() if target is not None else "pip install"
        notes.append(
            "torch is a CPU-only build but a GPU is present: install a CUDA build of torch: "
            + torch_fix(pip, torch_row["version"])
        )
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


@dataclass(frozen=True)
class DoctorReport:
    target: TargetEnvironment
    gpus: GpuReport
    packages: list[dict[str, Any]]
    engine_rows: list[dict[str, Any]]
    memory: dict[str, int | None]
    sections: list[tuple[str | None, DoctorSection | None]]  # (the engine's doctor key, its section), table order
    checks: list[Check]
    advice: list[str]

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target.to_json(),
            "gpu": self.gpus.to_json(),
            "packages": self.packages,
            "engines": self.engine_rows,
            "memory": self.memory,
            **{key: section.data if section else None for key, section in self.sections if key is not None},
            "checks": [check.to_json() for check in self.checks],
            "advice": self.advice,
        }


def gather(target: TargetEnvironment, gpus: GpuReport, engines: EngineTable) -> DoctorReport:
    """Every finding of doctor on ``target``: the generic checks first, then each engine's, in table order."""
    pkgs = packages(target, engines)
    engine_rows = [engine_status(name, target).to_json() for name in patched_distributions()]
    mem = memory()
    ctx = Context(target, gpus, mem, engines)
    notes = advice(gpus, pkgs, engine_rows, target)
    sections = [(engine.doctor_key, engine.doctor(ctx)) for engine in engines]
    checks = run_checks(ctx)
    for _, section in sections:
        if section is not None:
            notes.extend(section.warnings)
            checks.extend(section.checks)
    return DoctorReport(target, gpus, pkgs, engine_rows, mem, sections, checks, notes)
