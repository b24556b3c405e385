"""The result of `verify attention`: per engine, layer, case and kernel, what the compile needs and whether it
fits the architecture, plus how that result was obtained (which interpreter, Triton, loader, stand-ins).

A case passes only when it ran, took the code path the case table says it exercises, launched at least one
kernel, and every kernel's shared memory is at most the architecture's opt-in limit (the comparison Triton's
launcher makes: it refuses ``shared > limit``, so exactly the limit launches).

Every kernel also says which path its dots took (tensor cores ``mma`` or fp32 ``fma``, with the PTX's
``mma.sync`` / ``fma.rn.f32`` counts). When the compiling Triton has t4patch's Triton set applied, each launch
is compiled a second time with the set switched off ("stock"), and on the architectures the set serves a kernel
with an fp16 x fp16 dot must be on tensor cores and must not spill; a stock compile with tensor-core dots there
means a patched kernel was served from the cache to the stock compiler, which fails too.
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
    dot_path: str | None = None  # mma / fma / mixed / none (kernel_path.PATH_*); None: not reported
    mma_sync: int | None = None  # PTX mma.sync instructions
    fma_f32: int | None = None  # PTX fma.rn.f32 instructions
    fp16_dots: int = 0  # fp16 x fp16 tl.dot ops of the kernel (TTIR)
    fp16_dots_on_fma: int = 0  # of those, the ones not shown on tensor cores (TTGIR)
    tensor_core_dots: int = 0  # dots of any type on tensor cores (TTGIR)
    dot_types: tuple[str, ...] = ()  # per dot, "f16*f16->f32" (TTIR: the types the kernel author wrote)
    require_mma: bool = False  # the compiler has t4patch's Triton set and serves this architecture with it
    stock: KernelResult | None = None  # the same launch compiled with the set switched off
    stock_required_fma: bool = False  # the stock compile must not have tensor-core dots (arch below cc 8.0)

    @property
    def fits(self) -> bool:
        return self.shared_bytes <= self.limit_bytes

    @property
    def problems(self) -> tuple[str, ...]:
        found = []
        if not self.fits:
            found.append(f"{self.kernel} needs {self.shared_bytes:,} B of shared memory > limit {self.limit_bytes:,} B")
        if self.require_mma and self.fp16_dots:
            if self.fp16_dots_on_fma:
                found.append(
                    f"{self.kernel}: {self.fp16_dots_on_fma} of {self.fp16_dots} fp16 tl.dot on the FMA path with "
                    f"t4patch's Triton set applied (mma.sync {_count(self.mma_sync)}, fma.rn.f32 "
                    f"{_count(self.fma_f32)})"
                )
            if self.spills:
                found.append(f"{self.kernel} spills {self.spills:,} words per thread on the patched compile "
                             f"({self.registers} registers)")
        if self.stock is not None and self.stock_required_fma and self.stock.tensor_core_dots:
            found.append(
                f"{self.kernel}: the stock compile (set switched off) has {self.stock.tensor_core_dots} tensor-core "
                "dot(s): a patched kernel was reused from Triton's cache, whose key must include the switch"
            )
        return tuple(found)

    @property
    def ok(self) -> bool:
        return not self.problems

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
            "dot_path": self.dot_path,
            "mma_sync": self.mma_sync,
            "fma_rn_f32": self.fma_f32,
            "fp16_dots": self.fp16_dots,
            "fp16_dots_on_fma": self.fp16_dots_on_fma,
            "dot_types": list(self.dot_types),
            "ok": self.ok,
            **({"stock": self.stock.to_json()} if self.stock is not None else {}),
        }


def _count(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"


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
    stock: CaseResult | None = None  # the same case compiled with t4patch's Triton set switched off

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
            found.extend(k.problems)
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
            **({"stock": {"path": self.stock.path, "error": self.stock.error,
                          **({"refused": self.stock.refused} if self.stock.refused else {})}}
               if self.stock is not None else {}),
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
    compiler: dict[str, Any] = field(default_factory=dict)  # the compiler, its t4patch set state, the passes run

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
            "compiler": dict(self.compiler),
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
            if engine.compiler:
                lines += _wrapped(_compiler_line(engine.compiler), "  ")
            rows: list[tuple[object, ...]] = []
            details: list[list[str]] = []
            for c in engine.cases:
                if not c.kernels:
                    result = "REFUSED" if c.refused else "FAIL"
                    rows.append((c.layer, c.head_size, c.case, c.path or "-", "-", "-", "-", "-", "-", "-", result))
                    details.append(_stock_case_line(c))
                for i, k in enumerate(c.kernels):
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
                            k.dot_path or "?",
                            "ok" if k.ok else "FAIL",
                        )
                    )
                    detail = [_tiles_line(k)]
                    if k.stock is not None:
                        detail.append(_stock_line(k.stock))
                    elif c.stock is not None and i == 0:
                        detail += _stock_case_line(c)
                    details.append(detail)
            # the limit is the same for every row (it is in the heading); tiles, instruction counts and the
            # stock compile go on lines of their own under each kernel so the table fits 120 columns
            rendered = table(
                ["  layer", "head", "case", "path", "kernel", "warps", "shared B", "regs", "spills", "dot", "result"],
                [("  " + str(r[0]),) + tuple(r[1:]) for r in rows],
            ).splitlines()
            kernel_column = rendered[0].index("kernel")
            lines.append(rendered[0])
            for row_line, detail_lines in zip(rendered[1:], details):
                lines.append(row_line)
                for text in detail_lines:
                    if text:
                        lines += _wrapped(text, " " * kernel_column)
            for c in engine.cases:
                for problem in c.problems:
                    lines += _wrapped(f"FAIL {c.layer}/{c.case}: {problem}", "  ")
                if c.refused:
                    lines += _wrapped(f"REFUSED {c.layer}/{c.case} (clearly, before launch): {c.refused}", "  ")
            for note in engine.notes:
                lines += _wrapped(f"note: {note}", "  ")
            lines += _wrapped(_paths_summary(engine), "  ")
            spilling = [(k.spills or 0, c, k) for c in engine.cases for k in c.kernels if k.spills]
            if spilling:
                most, worst_case, worst = max(spilling, key=lambda item: item[0])
                decides = (
                    "on the patched compile they fail a kernel with an fp16 dot (t4patch's Triton set must not "
                    "spill); otherwise they cost speed, never correctness"
                    if any(k.require_mma for c in engine.cases for k in c.kernels)
                    else "spills cost speed, never correctness, and do not decide 'ok' / 'FAIL', which is shared "
                    "memory against the limit"
                )
                lines += _wrapped(
                    f"spills: {len(spilling)} of {sum(len(c.kernels) for c in engine.cases)} kernels keep some "
                    f"registers in local memory (most: {most:,} words per thread, {worst.kernel} in "
                    f"{worst_case.layer}/{worst_case.case}); {decides}",
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
            + " (spills: 32-bit words of per-thread local memory, as Triton's n_spills; dot: mma = tensor cores, "
            "fma = fp32 FMA, none = no tl.dot, from the compile's TTGIR)",
            "",
        )
        return "\n".join(lines)


def _compiler_line(compiler: dict[str, Any]) -> str:
    """Which compiler compiled, whether t4patch's set is applied to it, and which passes ran."""
    name = f"{compiler.get('distribution')} {compiler.get('version') or '?'}"
    state = compiler.get("t4patch_set")
    switch = " ".join(f"{k}={v}" for k, v in compiler.get("stock_env", {}).items())
    if len(compiler.get("passes", [])) == 2:
        text = (f"compiler: {name} in {compiler.get('root')}, t4patch's Triton set applied: every launch compiled "
                f"as patched (rows) and with {switch} (stock, the lines under them)")
        users = {k: v for k, v in compiler.get("environment", {}).items() if v is not None}
        if users:
            text += (f"; note: {' '.join(f'{k}={v}' for k, v in users.items())} is set in this environment and "
                     "decides what a server started from it runs")
        return text
    described = {None: "its t4patch state unknown", "not-applied": "stock (t4patch's Triton set not applied)",
                 "no-patch-set": "stock (t4patch has no Triton set for this release)"}
    return f"compiler: {name} in {compiler.get('root')}, {described.get(state, f't4patch Triton set {state}')}"


def _tiles_line(k: KernelResult) -> str:
    tiles = " ".join(f"{n}={v}" for n, v in k.tiles.items() if v is not None)
    kinds: dict[str, int] = {}
    for kind in k.dot_types:
        kinds[kind] = kinds.get(kind, 0) + 1
    dots = ", ".join(f"{n} {kind}" for kind, n in kinds.items())
    counts = (f"dots {dots}; " if dots else "") + f"mma.sync {_count(k.mma_sync)}, fma.rn.f32 {_count(k.fma_f32)}"
    return f"tiles: {tiles}; {counts}" if tiles else counts


def _stock_line(k: KernelResult) -> str:
    """The same launch compiled with t4patch's Triton set switched off, on one line."""
    tiles = " ".join(f"{n}={v}" for n, v in k.tiles.items() if v is not None)
    return (
        f"stock Triton: {k.dot_path or '?'}, mma.sync {_count(k.mma_sync)}, fma.rn.f32 {_count(k.fma_f32)}, "
        f"{k.shared_bytes:,} B ({'fits' if k.fits else 'does not fit'}), {'-' if k.registers is None else k.registers}"
        f" regs, {'-' if k.spills is None else k.spills} spills" + (f"; tiles: {tiles}" if tiles else "")
    )


def _stock_case_line(c: CaseResult) -> list[str]:
    """The stock compile of a case whose kernels do not pair with the patched ones (or that launched none)."""
    if c.stock is None:
        return []
    if c.stock.refused:
        return [f"stock Triton: REFUSED ({c.stock.refused[:80]}...)"]
    if c.stock.error:
        return [f"stock Triton: did not compile: {c.stock.error}"]
    return [_stock_line(k) for k in c.stock.kernels]


def _paths_summary(engine: EngineResult) -> str:
    """How many launches ran each dot path, as compiled and (when there was one) with the set switched off."""
    def tally(kernels: list[KernelResult]) -> str:
        counts: dict[str, int] = {}
        for k in kernels:
            counts[k.dot_path or "?"] = counts.get(k.dot_path or "?", 0) + 1
        return ", ".join(f"{n} {path}" for path, n in sorted(counts.items())) or "no launches"

    kernels = [k for c in engine.cases for k in c.kernels]
    text = f"dot paths: {tally(kernels)}"
    stock = [k for c in engine.cases if c.stock is not None for k in c.stock.kernels]
    if any(c.stock is not None for c in engine.cases):
        text += f"; stock Triton (set switched off): {tally(stock)}"
    return text


def _wrapped(text: str, indent: str, width: int = TEXT_WIDTH) -> list[str]:
    """``text`` wrapped to ``width`` columns under ``indent`` (continuation lines indented two more)."""
    return textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent + "  ", break_on_hyphens=False)


def kernel_results(
    launches: list[dict[str, Any]],
    engine: EngineCases,
    arch: Arch,
    *,
    require_mma: bool = False,
    stock_launches: list[dict[str, Any]] | None = None,
    stock_required_fma: bool = False,
) -> tuple[KernelResult, ...]:
    """The worker's launches as KernelResults; ``stock_launches`` (the same case, set switched off) are paired by
    position when they launch the same kernels in the same order."""
    stock = kernel_results(stock_launches, engine, arch) if stock_launches is not None else ()
    paired = [s.kernel for s in stock] == [launch["kernel"] for launch in launches]
    results = []
    for i, launch in enumerate(launches):
        names = engine.kernel_tiles.get(launch["kernel"], ())
        constexprs = launch.get("constexprs", {})
        dots = launch.get("dots", [])
        fp16 = [d for d in dots if d.get("a") == "f16" and d.get("b") == "f16"]
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
                dot_path=launch.get("dot_path"),
                mma_sync=launch.get("mma_sync"),
                fma_f32=launch.get("fma_rn_f32"),
                fp16_dots=len(fp16),
                fp16_dots_on_fma=sum(1 for d in fp16 if d.get("tensor_cores") is not True),
                tensor_core_dots=sum(1 for d in dots if d.get("tensor_cores") is True),
                dot_types=tuple(f"{d.get('a')}*{d.get('b')}->{d.get('acc')}" for d in dots),
                require_mma=require_mma,
                stock=stock[i] if paired else None,
                stock_required_fma=stock_required_fma,
            )
        )
    return tuple(results)


def case_results(
    worker_results: list[dict[str, Any]],
    engine: EngineCases,
    model: Model,
    arch: Arch,
    *,
    stock_results: list[dict[str, Any]] | None = None,
    require_mma: bool = False,
    stock_required_fma: bool = False,
) -> tuple[CaseResult, ...]:
    """Turn the worker's per-(layer, case) records into CaseResults; every table entry must be present.

    ``stock_results``: the second pass with t4patch's Triton set switched off (None: there was none);
    ``require_mma``: fp16 dots must be on tensor cores and not spill (the set is applied and serves ``arch``);
    ``stock_required_fma``: the stock pass must have no tensor-core dot (``arch`` is below cc 8.0).
    """
    by_key = {(r["layer"], r["case"]): r for r in worker_results}
    stock_by_key = {(r["layer"], r["case"]): r for r in stock_results or []}
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
            stock_record = stock_by_key.get((layer.name, case.name)) if stock_results is not None else None
            stock_case = None
            if stock_record is not None:
                stock_case = CaseResult(
                    layer=layer.name, head_size=layer.head_size, sliding_window=layer.sliding_window, case=case.name,
                    expected_path=case.path, path=stock_record.get("path"), error=stock_record.get("error"),
                    kernels=kernel_results(stock_record.get("launches", []), engine, arch),
                    accepted_refusal=case.accepted_refusal,
                )
            out.append(
                CaseResult(
                    layer=layer.name,
                    head_size=layer.head_size,
                    sliding_window=layer.sliding_window,
                    case=case.name,
                    expected_path=case.path,
                    path=record.get("path"),
                    error=record.get("error"),
                    kernels=kernel_results(
                        record.get("launches", []), engine, arch, require_mma=require_mma,
                        stock_launches=stock_record.get("launches", []) if stock_record is not None else None,
                        stock_required_fma=stock_required_fma,
                    ),
                    accepted_refusal=case.accepted_refusal,
                    stock=stock_case,
                )
            )
    return tuple(out)
