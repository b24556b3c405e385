"""The result of `verify attention`: per engine, layer, case and kernel, what the compile needs and whether it
fits the architecture, plus how that result was obtained (which interpreter, Triton, loader, stand-ins).

A case passes only when it ran, took the code path the case table says it exercises, launched at least one
kernel, and every kernel's shared memory is at most the architecture's opt-in limit (the comparison Triton's
launcher makes: it refuses ``shared > limit``, so exactly the limit launches).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from typing import Any

from t4patch.output import table
from t4patch.verify.attention.cases import Arch, EngineCases, Model

TEXT_WIDTH = 120  # the text report fits a 120-column terminal


@dataclass(frozen=True)
class KernelResult:
    kernel: str
    grid: tuple[int, ...]
    tiles: dict[str, Any]
    num_warps: int
    num_stages: int
    shared_bytes: int
    limit_bytes: int
    registers: int | None
    spills: int | None

    @property
    def fits(self) -> bool:
        return self.shared_bytes <= self.limit_bytes

    def to_json(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel,
            "grid": list(self.grid),
            "tiles": dict(self.tiles),
            "num_warps": self.num_warps,
            "num_stages": self.num_stages,
            "shared_bytes": self.shared_bytes,
            "limit_bytes": self.limit_bytes,
            "registers": self.registers,
            "spills": self.spills,
            "fits": self.fits,
        }


@dataclass(frozen=True)
class CaseResult:
    layer: str
    head_size: int
    sliding_window: int
    case: str
    expected_path: str
    path: str | None
    error: str | None
    kernels: tuple[KernelResult, ...]
    accepted_refusal: str = ""  # the case table's: a clear refusal starting with it is not a failure

    @property
    def refused(self) -> str | None:
        """The patched engine's own clear refusal of this launch (accepted by the case table), if that is the error."""
        if self.error and self.accepted_refusal and self.error.startswith(f"RuntimeError: {self.accepted_refusal}"):
            return self.error.removeprefix("RuntimeError: ")
        return None

    @property
    def problems(self) -> tuple[str, ...]:
        found = []
        if self.refused:
            return ()  # launched nothing, on purpose: the engine said why
        if self.error:
            found.append(f"did not compile: {self.error}")
        elif self.path != self.expected_path:
            found.append(f"took path {self.path}, the case table expects {self.expected_path}")
        if not self.error and not self.kernels:
            found.append("launched no kernel")
        for k in self.kernels:
            if not k.fits:
                found.append(f"{k.kernel} needs {k.shared_bytes:,} B of shared memory > limit {k.limit_bytes:,} B")
        return tuple(found)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "layer": self.layer,
            "head_size": self.head_size,
            "sliding_window": self.sliding_window,
            "case": self.case,
            "expected_path": self.expected_path,
            "path": self.path,
            "error": self.error,
            "ok": self.ok,
            "problems": list(self.problems),
            **({"refused": self.refused} if self.refused else {}),
            "kernels": [k.to_json() for k in self.kernels],
        }


@dataclass(frozen=True)
class EngineResult:
    key: str
    distribution: str
    version: str
    site_packages: str
    patch_state: str | None  # a sentence for people (PATCH_STATE_TEXT), None when t4patch has no patch set
    interpreter: str
    versions: dict[str, Any]
    loader: dict[str, Any]
    files: dict[str, str | None]
    cases: tuple[CaseResult, ...]
    notes: tuple[str, ...] = ()
    patch_overall: str | None = None  # the status model's state: applied / not-applied / partial / foreign

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.cases)

    def to_json(self) -> dict[str, Any]:
        return {
            "engine": self.key,
            "distribution": self.distribution,
            "version": self.version,
            "site_packages": self.site_packages,
            "patch_state": self.patch_state,
            "interpreter": self.interpreter,
            "versions": dict(self.versions),
            "loader": dict(self.loader),
            "files_sha256": dict(self.files),
            "ok": self.ok,
            "cases": [c.to_json() for c in self.cases],
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class AttentionReport:
    arch: Arch
    model: Model
    target: dict[str, Any]
    engines: tuple[EngineResult, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return all(e.ok for e in self.engines)

    def failures(self) -> list[tuple[EngineResult, CaseResult]]:
        return [(e, c) for e in self.engines for c in e.cases if not c.ok]

    def to_json(self) -> dict[str, Any]:
        return {
            "arch": self.arch.to_json(),
            "model": self.model.to_json(),
            "target": dict(self.target),
            "ok": self.ok,
            "failed_cases": len(self.failures()),
            "compiled_not_run": "every launch was compiled for the architecture on this machine, none was run",
            "engines": [e.to_json() for e in self.engines],
        }

    def render_text(self) -> str:
        lines = [
            f"verify attention: {self.model.name} on {self.arch.name} "
            f"({self.arch.gpus}; shared memory limit {self.arch.shared_limit:,} B per block)",
            "every launch below was compiled for that architecture on this machine, none was run",
        ]
        for engine in self.engines:
            state = engine.patch_state or "no t4patch patch set"
            lines.append("")
            lines.append(
                f"{engine.distribution} {engine.version} ({state}) in {engine.site_packages}: "
                f"{'PASS' if engine.ok else 'FAIL'}"
            )
            lines += _wrapped(
                f"python {engine.versions.get('python', '?')} ({engine.interpreter}), "
                f"torch {engine.versions.get('torch', '?')}, triton {engine.versions.get('triton', '?')}; "
                f"{engine.loader.get('route', '')}",
                "  ",
            )
            rows: list[tuple[object, ...]] = []
            tiles: list[str] = []
            for c in engine.cases:
                if not c.kernels:
                    result = "REFUSED" if c.refused else "FAIL"
                    rows.append((c.layer, c.head_size, c.case, c.path or "-", "-", "-", "-", "-", "-", result))
                    tiles.append("")
                for k in c.kernels:
                    rows.append(
                        (
                            c.layer,
                            c.head_size,
                            c.case,
                            c.path or "-",
                            k.kernel,
                            k.num_warps,
                            f"{k.shared_bytes:,}",
                            "-" if k.registers is None else k.registers,
                            "-" if k.spills is None else k.spills,
                            "ok" if k.fits else "FAIL",
                        )
                    )
                    tiles.append(" ".join(f"{n}={v}" for n, v in k.tiles.items() if v is not None))
            # the limit is the same for every row (it is in the heading); the tiles go on a line of their own
            # under each kernel so the table fits 120 columns
            rendered = table(
                ["  layer", "head", "case", "path", "kernel", "warps", "shared B", "regs", "spills", "result"],
                [("  " + str(r[0]),) + tuple(r[1:]) for r in rows],
            ).splitlines()
            kernel_column = rendered[0].index("kernel")
            lines.append(rendered[0])
            for row_line, tile_text in zip(rendered[1:], tiles):
                lines.append(row_line)
                if tile_text:
                    lines += _wrapped(f"tiles: {tile_text}", " " * kernel_column)
            for c in engine.cases:
                for problem in c.problems:
                    lines += _wrapped(f"FAIL {c.layer}/{c.case}: {problem}", "  ")
                if c.refused:
                    lines += _wrapped(f"REFUSED {c.layer}/{c.case} (clearly, before launch): {c.refused}", "  ")
            for note in engine.notes:
                lines += _wrapped(f"note: {note}", "  ")
            spilling = [(k.spills or 0, c, k) for c in engine.cases for k in c.kernels if k.spills]
            if spilling:
                most, worst_case, worst = max(spilling, key=lambda item: item[0])
                lines += _wrapped(
                    f"spills: {len(spilling)} of {sum(len(c.kernels) for c in engine.cases)} kernels keep some "
                    f"registers in local memory (most: {most:,} words per thread, {worst.kernel} in "
                    f"{worst_case.layer}/{worst_case.case}); spills cost speed, never correctness, and do not "
                    "decide 'ok' / 'FAIL', which is shared memory against the limit",
                    "  ",
                )
        total = sum(len(e.cases) for e in self.engines)
        failed = len(self.failures())
        refused = sum(1 for e in self.engines for c in e.cases if c.refused)
        lines.append("")
        lines += _wrapped(
            f"{total - failed - refused} of {total} cases fit {self.arch.name}"
            + ("" if not failed else f"; {failed} do not")
            + ("" if not refused else f"; {refused} refused clearly by the patched engine (cannot fit at any tile)")
            + " (spills: 32-bit words of per-thread local memory, as Triton's n_spills)",
            "",
        )
        return "\n".join(lines)


def _wrapped(text: str, indent: str, width: int = TEXT_WIDTH) -> list[str]:
    """``text`` wrapped to ``width`` columns under ``indent`` (continuation lines indented two more)."""
    return textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent + "  ", break_on_hyphens=False)


def kernel_results(
    launches: list[dict[str, Any]], engine: EngineCases, arch: Arch
) -> tuple[KernelResult, ...]:
    results = []
    for launch in launches:
        names = engine.kernel_tiles.get(launch["kernel"], ())
        constexprs = launch.get("constexprs", {})
        results.append(
            KernelResult(
                kernel=launch["kernel"],
                grid=tuple(launch.get("grid", ())),
                tiles={n: constexprs.get(n) for n in names},
                num_warps=launch["num_warps"],
                num_stages=launch["num_stages"],
                shared_bytes=launch["shared_bytes"],
                limit_bytes=arch.shared_limit,
                registers=launch.get("registers"),
                spills=launch.get("spills"),
            )
        )
    return tuple(results)


def case_results(
    worker_results: list[dict[str, Any]], engine: EngineCases, model: Model, arch: Arch
) -> tuple[CaseResult, ...]:
    """Turn the worker's per-(layer, case) records into CaseResults; every table entry must be present."""
    by_key = {(r["layer"], r["case"]): r for r in worker_results}
    out = []
    for layer in model.layers:
        for case in engine.cases:
            record = by_key.get((layer.name, case.name))
            if record is None:
                out.append(
                    CaseResult(layer.name, layer.head_size, layer.sliding_window, case.name, case.path, None,
                               "the worker returned no result for this case", ())
                )
                continue
            out.append(
                CaseResult(
                    layer=layer.name,
                    head_size=layer.head_size,
                    sliding_window=layer.sliding_window,
                    case=case.name,
                    expected_path=case.path,
                    path=record.get("path"),
                    error=record.get("error"),
                    kernels=kernel_results(record.get("launches", []), engine, arch),
                    accepted_refusal=case.accepted_refusal,
                )
            )
    return tuple(out)
