"""Provider ``vllm-sm75`` (registered in t4patch.engines.vllm.engine): vLLM 0.33.0's Marlin as compute_75 PTX, run on any NVIDIA GPU with T4 host values.

Evidence class (named by :func:`t4patch.evidence.ptx_jit`): "sm_75 code executed on sm_XX through PTX JIT, T4
host parameters emulated". The library
comes from :mod:`t4patch.engines.vllm.marlin_sm75` (built once from the vLLM sdist, cached by source hash).
Because it holds PTX for compute_75 and no SASS, the driver JIT-compiles the Turing code and the kernels run
their ``__CUDA_ARCH__ == 750`` branches — Turing's fp16-accumulating mma included — on whatever GPU is
present; the host code believes it runs on a T4 (cc 7.5, 65,536 B, 40 SMs) and picks the T4's kernels and
partitioning. On a real T4 the same PTX is compiled for the card itself and the overrides are its own values.

Besides the shared checks (:mod:`t4patch.verify.marlin.checks`), this provider adds, through its
``extra_checks`` hook (and states its own scope through ``scope``):

- the **Turing-path guard**: at K >= ``min_k`` an error vs the fp16 matmul at or below fp32-accumulation
  level means the fp16-accumulating path did not run: an accuracy failure, never a pass;
- **AWQ**: ``awq_marlin_repack`` exact against the reference layout, GEMM with zero points against the fp16
  and fp32 matmul, determinism with atomic-add off;
- a **control**: GPTQ channel-wise (group -1), where Turing Marlin accumulates in fp32 by design;
- the **comparison** with the seed's T4 range and the sm_90 build's figure.

All thresholds are in ``engine-data/vllm/marlin-sm75-emulation.toml``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from t4patch import evidence
from t4patch.contract import MARLIN_MAX_BLOCKS_PER_SM, FailureSink, MarlinProvider
from t4patch.data.locations import data_dir
from t4patch.data.reader import DataKind, ListOf, Number, Str, Table, read
from t4patch.errors import DataFileError
from t4patch.verify.marlin import layout, metrics, probe, quant
from t4patch.verify.marlin.scalar_type import UINT4B8, uint

if TYPE_CHECKING:
    import torch

    from t4patch.verify.marlin.checks import Settings
    from t4patch.verify.marlin.shapes import ShapeTable

NAME = "vllm-sm75"
UINT4 = uint(4, 0)
_INTERLEAVE_4BIT = (0, 2, 4, 6, 1, 3, 5, 7)


@dataclass(frozen=True)
class EmulationConfig:
    guard_min_k: int
    guard_fp32_level: float
    guard_source: str
    awq_group_size: int
    awq_weight_std: float
    control_group_size: int
    control_m: tuple[int, ...]
    seed_low: float
    seed_high: float
    seed_source: str
    sm90_figure: float
    sm90_source: str

    def evidence(self, capability: tuple[int, int]) -> str:
        """sm_75 PTX through driver JIT on the GPU that ran it, T4 host values emulated (t4patch.evidence)."""
        return evidence.ptx_jit(capability, host_emulated=True)


EMULATION_DATA = DataKind(
    label="verification data",
    error=DataFileError,
)
EMULATION_SCHEMA = Table({
    "schema": Number(),
    "turing_path_guard": Table({"min_k": Number(), "fp32_path_at_or_below": Number(), "source": Str()}),
    "awq": Table({"group_size": Number(), "weight_std": Number()}),
    "control": Table({"group_size": Number(), "m": ListOf(Number(), nonempty=True)}),
    "comparison": Table({"seed_t4_low": Number(), "seed_t4_high": Number(), "seed_source": Str(),
                         "sm90_fp32_accumulation": Number(), "sm90_source": Str()}),
})


def load_config(path: Any = None) -> EmulationConfig:
    path = path or data_dir("engine-data") / "vllm" / "marlin-sm75-emulation.toml"
    doc = read(path, EMULATION_SCHEMA, EMULATION_DATA, version=1)
    try:
        guard, awq, control, comp = doc["turing_path_guard"], doc["awq"], doc["control"], doc["comparison"]
        config = EmulationConfig(
            guard_min_k=int(guard["min_k"]),
            guard_fp32_level=float(guard["fp32_path_at_or_below"]),
            guard_source=str(guard["source"]),
            awq_group_size=int(awq["group_size"]),
            awq_weight_std=float(awq["weight_std"]),
            control_group_size=int(control["group_size"]),
            control_m=tuple(int(m) for m in control["m"]),
            seed_low=float(comp["seed_t4_low"]),
            seed_high=float(comp["seed_t4_high"]),
            seed_source=str(comp["seed_source"]),
            sm90_figure=float(comp["sm90_fp32_accumulation"]),
            sm90_source=str(comp["sm90_source"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise EMULATION_DATA.fail(path, f"{type(exc).__name__}: {exc}") from exc
    if not (0 < config.seed_low < config.seed_high) or config.guard_fp32_level <= 0 or config.guard_min_k <= 0:
        raise EMULATION_DATA.fail(path, "the comparison range and the guard must be positive")
    return config


# ------------------------------------------------------------------------------------------ AWQ references


def awq_quantize(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric 4-bit per group along K: (codes (K, N) 0..15, zero points (K/g, N) 0..15, fp16 scales (K/g, N))."""
    import torch

    k, n = w.shape
    if k % group_size:
        raise ValueError(f"K = {k} is not a multiple of group_size {group_size}")
    grouped = w.float().reshape(k // group_size, group_size, n)
    lo, hi = grouped.amin(dim=1), grouped.amax(dim=1)
    scales = ((hi - lo) / 15.0).clamp(min=1e-8).to(torch.float16)
    s = scales.float()
    zeros = torch.round(-lo / s).clamp(0, 15)
    codes = torch.round(grouped / s.unsqueeze(1) + zeros.unsqueeze(1)).clamp(0, 15)
    return codes.reshape(k, n).to(torch.int32), zeros.to(torch.int32), scales


def awq_dequantize(codes: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    """fp16 (K, N): (code - zero) * scale, one rounding (the integer difference times an fp16 scale is exact in fp32)."""
    import torch

    z = zeros.float().repeat_interleave(group_size, dim=0)
    s = scales.float().repeat_interleave(group_size, dim=0)
    return ((codes.float() - z) * s).to(torch.float16)


def _interleave_columns(values: torch.Tensor) -> torch.Tensor:
    rows, cols = values.shape
    perm = list(_INTERLEAVE_4BIT)
    return values.reshape(-1, 8)[:, perm].reshape(rows, cols)


def awq_pack(codes: torch.Tensor) -> torch.Tensor:
    """AWQ ``qweight``: (K, N) codes -> (K, N/8) int32; slot i of column c holds code column 8c + (0,2,4,6,1,3,5,7)[i]."""
    return layout.pack_columns(_interleave_columns(codes))


def marlin_zero_points(zeros: torch.Tensor, n: int) -> torch.Tensor:
    """vLLM's ``marlin_zero_points`` for 4 bits, fp16 activations: the grouped scale permutation, the
    dequantizer's column interleave, packed 8 per int32 -> (K/g, N/8)."""
    import torch

    grouped, _ = layout.scale_perms()
    perm = torch.tensor(grouped, dtype=torch.int64, device=zeros.device)
    permuted = zeros.reshape(-1, perm.numel())[:, perm].reshape(-1, n)
    return layout.pack_columns(_interleave_columns(permuted).contiguous())


# ------------------------------------------------------------------------------------------ the provider


def sm75_provider(target: Any, vllm_lib_path: str | None, *, capability: tuple[int, int]) -> MarlinProvider:
    """Build or find the compute_75-only library, load it, and wrap its ops as a MarlinProvider."""
    from t4patch.engines.vllm import marlin_sm75

    config = load_config()
    built = marlin_sm75.marlin_library(vllm_lib_path)  # the sdist: this, else $T4PATCH_VLLM_SDIST, else the cache
    ops = marlin_sm75.load_ops(built)

    def gemm(a, c, w, s, ws, m, n, k, use_atomic_add, use_fp32_reduce):
        return ops.marlin_gemm(a, c, w, None, s, None, None, None, ws, UINT4B8.id, m, n, k, use_atomic_add, use_fp32_reduce, False)

    def repack(q, k, n):
        return ops.gptq_marlin_repack(q, k, n, 4, False)

    record = {**built.facts, "seconds": built.seconds, "jobs": built.jobs}  # the build record's extension facts
    info = {
        "evidence_class": config.evidence(capability),
        "vllm": {
            "source": f"vLLM {built.version} sdist, compiled by t4patch as {built.gencode} (PTX only), torch.ops.{built.namespace}",
            "distribution": {"version": built.version, "root": record.get("source", {}).get("path")},
            "library": {
                "path": str(built.path),
                "given": str(built.path),
                "sha256": record["library"]["sha256"],
                "identified_as": None,
            },
        },
        "build": {
            "cached": built.cached,
            "source_hash": record["source_hash"],
            "sdist_sha256": record.get("source", {}).get("sdist_sha256"),
            "seconds": record.get("seconds"),
            "jobs": record.get("jobs"),
            "gencode": record["gencode"],
            "fatbin_sass": record["fatbin"]["sass"],
            "fatbin_ptx": record["fatbin"]["ptx"],
            "change": record["change"],
            "compile_flags": record["compile_flags"],
            "toolchain": record["toolchain"],
        },
        "emulation": record["emulation"],
        "weight_type_id": UINT4B8.id,
    }
    workspace = _workspace

    def extra(results: list[dict[str, Any]], table: ShapeTable, settings: Settings, failures: FailureSink) -> dict[str, Any]:
        return extra_checks(ops, workspace, config, results, table, settings, failures, capability)

    return MarlinProvider(
        name=NAME,
        repack=repack,
        gemm=gemm,
        make_workspace=workspace,
        info=info,
        extra_checks=extra,
        scope=lambda cap, gpu_name: scope(config, cap, gpu_name, record),
    )


def _workspace(device: torch.device) -> torch.Tensor:
    """vLLM's get_marlin_workspace outside its workspace manager: zeroed int32 locks, 4 per SM of this GPU
    (at least the 40 the emulated T4 partitioning uses)."""
    import torch

    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
    return torch.zeros(max(sms, 40) * MARLIN_MAX_BLOCKS_PER_SM, dtype=torch.int32, device=device)


def scope(config: EmulationConfig, capability: tuple[int, int], gpu_name: str, record: dict[str, Any]) -> tuple[list[str], list[str]]:
    emu = record["emulation"]
    sm = f"sm_{capability[0]}{capability[1]}"
    proves = [
        f"evidence class: {config.evidence(capability)} ({gpu_name})",
        f"vLLM {record['source'].get('version')}'s Marlin, compiled from its sdist as PTX for compute_75 only (no SASS "
        "in the library, read back from its fatbin), was JIT-compiled by the driver and ran its __CUDA_ARCH__ == 750 "
        "branches: the m16n8k8 mma and fp16 accumulation for fp16 x 4-bit with groups",
        f"the host code chose as a T4 does (compute capability {emu['capability']} -> stages 2 and the sm75 kernel "
        f"table; {emu['max_shared_memory_per_block_optin']} B shared memory; {emu['multiprocessors']} SMs -> the T4's "
        "partitioning and reduction order)",
        "repack layouts (GPTQ and AWQ) equal the reference Marlin layout exactly",
        "accuracy, determinism and the overflow scan of that code path, on every shape of the table",
    ]
    does_not = [
        f"T4 timing or bandwidth: any time measured here is {sm} executing JIT-compiled Turing code",
        f"hardware rounding differences: the same PTX instructions ran on {sm}'s tensor cores; that an fp16-accumulating "
        "mma rounds bit-identically on TU104 is not shown",
        "the wheel's own SASS: vLLM's shipped sm_75 cubins were not what ran (same source, compiled here to PTX)",
        "ptxas for sm_75: the driver compiled the PTX for this GPU, so sm_75 register allocation and spills were not exercised",
        "end-to-end model quality: these are synthetic weights, not the checkpoint",
    ]
    return proves, does_not


# ------------------------------------------------------------------------------------------ extra checks


def turing_path_guard(config: EmulationConfig, results: list[dict[str, Any]], failures: FailureSink) -> dict[str, Any]:
    """Fail every case at K >= min_k whose error vs fp16 is at fp32-accumulation level."""
    checked, suspicious = 0, []
    for shape in results:
        if shape["k"] < config.guard_min_k:
            continue
        for case in shape.get("cases", []):
            err = case.get("rel_err_vs_fp16")
            if err is None:
                continue
            checked += 1
            if err <= config.guard_fp32_level:
                suspicious.append({"shape": shape["shape"], "k": shape["k"], "m": case["m"], "rel_err_vs_fp16": err})
    for item in suspicious:
        failures.add(
            "accuracy",
            f"{item['shape']} (K={item['k']}) m={item['m']}: error vs fp16 {item['rel_err_vs_fp16']:.3g} <= "
            f"{config.guard_fp32_level:g} is fp32-accumulation level: the Turing fp16-accumulating path did not run",
        )
    if checked == 0:
        failures.add("accuracy", f"Turing-path guard: no case with K >= {config.guard_min_k} produced an error figure")
    return {
        "min_k": config.guard_min_k,
        "fp32_path_at_or_below": config.guard_fp32_level,
        "cases_checked": checked,
        "cases_at_fp32_level": suspicious,
        "turing_path": checked > 0 and not suspicious,
        "source": config.guard_source,
    }


def comparison(config: EmulationConfig, results: list[dict[str, Any]]) -> dict[str, Any]:
    errors = [c["rel_err_vs_fp16"] for s in results for c in s.get("cases", []) if c.get("rel_err_vs_fp16") is not None]
    if not errors:
        return {"cases": 0}
    inside = sum(1 for e in errors if config.seed_low <= e <= config.seed_high)
    below = sum(1 for e in errors if e < config.seed_low)
    above = sum(1 for e in errors if e > config.seed_high)
    return {
        "cases": len(errors),
        "min": min(errors),
        "max": max(errors),
        "median": sorted(errors)[len(errors) // 2],
        "seed_t4_range": [config.seed_low, config.seed_high],
        "inside_seed_range": inside,
        "below_seed_range": below,
        "above_seed_range": above,
        "ratio_median_to_sm90": sorted(errors)[len(errors) // 2] / config.sm90_figure,
        "sm90_fp32_accumulation": config.sm90_figure,
        "seed_source": config.seed_source,
        "sm90_source": config.sm90_source,
    }


def check_awq_shape(ops: Any, workspace_fn: Any, config: EmulationConfig, shape: Any, settings: Settings, failures: FailureSink) -> dict[str, Any]:
    """AWQ on one (N, K): repack exactness, GEMM with zero points vs fp16/fp32 references, determinism."""
    import torch


    device = probe.device_for(settings.device)
    n, k, group = shape.n, shape.k, config.awq_group_size
    where = f"AWQ {shape.name} (N={n}, K={k}, g{group})"
    record: dict[str, Any] = {"shape": shape.name, "n": n, "k": k, "group_size": group}
    gen = quant.cpu_generator(settings.seed, f"{shape.name}:awq")
    w = torch.randn(k, n, generator=gen, dtype=torch.float32) * config.awq_weight_std
    codes, zeros, scales = awq_quantize(w, group)
    try:
        marlin_q = ops.awq_marlin_repack(awq_pack(codes).to(device), k, n, 4, False)
        probe.sync(device)
    except Exception as exc:  # noqa: BLE001
        failures.add("repack", f"{where}: awq_marlin_repack raised {probe.err(exc)}")
        record["repack"] = {"exact": False, "error": probe.err(exc)}
        return record
    comparison_ = layout.compare_repack(marlin_q, layout.marlin_reference_repack(codes), k, n)
    record["repack"] = comparison_.to_json()
    if not comparison_.exact:
        failures.add("repack", f"{where}: awq_marlin_repack differs from the reference Marlin layout ({comparison_.mismatched_codes} codes)")
    w16 = awq_dequantize(codes, zeros, scales, group).to(device)
    s_marlin = layout.marlin_permute_scales(scales, k, n, group).to(device)
    z_marlin = marlin_zero_points(zeros, n).to(device)
    workspace = workspace_fn(device)
    cases = []
    for m in settings.m_values:
        case: dict[str, Any] = {"m": m}
        a = torch.randn(m, k, generator=quant.cpu_generator(settings.seed, f"{shape.name}:awq:a:{m}")).to(torch.float16).to(device)
        ref16, ref32 = a @ w16, a.float() @ w16.float()

        def gemm(c: Any = None, atomic: bool = False, a: Any = a, m: int = m) -> torch.Tensor:
            return ops.marlin_gemm(a, c, marlin_q, None, s_marlin, None, None, z_marlin, workspace, UINT4.id, m, n, k, atomic, True, False)

        try:
            out = gemm(torch.full((m, n), float("nan"), dtype=torch.float16, device=device))
            repeats = [out] + [gemm() for _ in range(settings.tolerances.determinism_runs - 1)]
            probe.sync(device)
        except Exception as exc:  # noqa: BLE001
            failures.add("accuracy", f"{where} m={m}: GEMM raised {probe.err(exc)}")
            cases.append({**case, "status": "fail", "error": probe.err(exc)})
            continue
        rel16 = metrics.relative_mean_abs_error(out, ref16)
        rel32 = metrics.relative_mean_abs_error(out, ref32)
        status = metrics.classify(rel16, fail_above=settings.tolerances.fail_above, flag_above=settings.tolerances.flag_above)
        distinct = probe.distinct(repeats)
        case.update(
            rel_err_vs_fp16=probe.rounded(rel16),
            rel_err_vs_fp32=probe.rounded(rel32),
            fp16_matmul_vs_fp32=probe.rounded(metrics.relative_mean_abs_error(ref16, ref32)),
            nonfinite=int((~torch.isfinite(out)).sum()),
            status=status,
            determinism_atomic_off={"runs": len(repeats), "distinct_results": distinct, "bitwise_equal": distinct == 1},
        )
        if status == "fail":
            failures.add("accuracy", f"{where} m={m}: mean|out-ref|/mean|ref| = {rel16:.3g} > {settings.tolerances.fail_above}")
        if distinct != 1:
            failures.add("determinism", f"{where} m={m}: {len(repeats)} runs with atomic-add off gave {distinct} different results")
        cases.append(case)
    record["cases"] = cases
    return record


def check_control_shape(ops: Any, workspace_fn: Any, config: EmulationConfig, shape: Any, settings: Settings, failures: FailureSink) -> dict[str, Any]:
    """GPTQ channel-wise (group -1): Turing Marlin accumulates in fp32 here by design (reported only).

    With one scale per column the kernel multiplies the accumulated sum of a x (code - 8) by the scale at the
    end, in fp16 (marlin_template.h write-out), so its exact-order reference is fp16(fp16(a @ (codes - 8)) *
    scale), not the fp16 matmul of fp16-rounded weights (whose own weight rounding costs ~2e-4). Against that
    reference fp32 accumulation shows as ~1e-6 and fp16 accumulation would show as ~1e-3.
    """
    import torch

    device = probe.device_for(settings.device)
    n, k = shape.n, shape.k
    record: dict[str, Any] = {"shape": shape.name, "n": n, "k": k, "group_size": config.control_group_size}
    weight = quant.random_q4_0_weight(k, n, group_size=k, std=settings.tolerances.weight_std, seed=settings.seed, label=f"{shape.name}:channelwise")
    try:
        marlin_q = ops.gptq_marlin_repack(quant.gptq_pack(weight.codes).to(device), k, n, 4, False)
        w16 = quant.dequantize(weight.codes, weight.scales, k).to(device)
        centred = (weight.codes.float() - quant.UINT4B8_BIAS).to(device)
        scale16 = weight.scales.to(device).half()
        s_marlin = layout.marlin_permute_scales(weight.scales, k, n, -1).to(device)
        workspace = workspace_fn(device)
        cases = []
        for m in config.control_m:
            a = torch.randn(m, k, generator=quant.cpu_generator(settings.seed, f"{shape.name}:channelwise:a:{m}")).to(torch.float16).to(device)
            out = ops.marlin_gemm(a, None, marlin_q, None, s_marlin, None, None, None, workspace, UINT4B8.id, m, n, k, False, True, False)
            probe.sync(device)
            exact_order = (a.float() @ centred).half() * scale16
            cases.append(
                {
                    "m": m,
                    "rel_err_vs_exact_order": probe.rounded(metrics.relative_mean_abs_error(out, exact_order)),
                    "rel_err_vs_fp16": probe.rounded(metrics.relative_mean_abs_error(out, a @ w16)),
                    "rel_err_vs_fp32": probe.rounded(metrics.relative_mean_abs_error(out, a.float() @ w16.float())),
                }
            )
        record["cases"] = cases
    except Exception as exc:  # noqa: BLE001 - a control is reported, not a verdict
        record["error"] = probe.err(exc)
    return record


def extra_checks(
    ops: Any,
    workspace_fn: Any,
    config: EmulationConfig,
    results: list[dict[str, Any]],
    table: ShapeTable,
    settings: Settings,
    failures: FailureSink,
    capability: tuple[int, int],
) -> dict[str, Any]:
    import sys

    import torch

    guard = turing_path_guard(config, results, failures)
    awq, control = [], []
    for index, shape in enumerate(table.linears, 1):
        print(f"vllm-sm75: AWQ and channel-wise control {index}/{len(table.linears)} {shape.name}", file=sys.stderr, flush=True)
        awq.append(check_awq_shape(ops, workspace_fn, config, shape, settings, failures))
        control.append(check_control_shape(ops, workspace_fn, config, shape, settings, failures))
        if settings.device == "cuda":
            torch.cuda.empty_cache()
    compared = comparison(config, results)
    awq_compared = comparison(config, awq)
    summary = [
        f"evidence class: {config.evidence(capability)}",
        f"Turing-path guard (K >= {guard['min_k']}: error vs fp16 must exceed {guard['fp32_path_at_or_below']:g}): "
        + (f"passed on {guard['cases_checked']} cases" if guard["turing_path"] else f"FAILED ({len(guard['cases_at_fp32_level'])} cases at fp32 level)"),
    ]
    if compared.get("cases"):
        summary.append(
            f"GPTQ g{table.group_size} error vs fp16: {compared['min']:.2e} .. {compared['max']:.2e} (median {compared['median']:.2e}); "
            f"seed's T4 range {config.seed_low:.1e}..{config.seed_high:.1e}: {compared['inside_seed_range']} inside, "
            f"{compared['below_seed_range']} below, {compared['above_seed_range']} above; sm_90 build {config.sm90_figure:.1e}"
        )
    if awq_compared.get("cases"):
        exact = sum(1 for r in awq if r.get("repack", {}).get("exact"))
        summary.append(
            f"AWQ g{config.awq_group_size}: repack exact on {exact}/{len(awq)} shapes; error vs fp16 {awq_compared['min']:.2e} .. {awq_compared['max']:.2e}"
        )
    control_errors = [c["rel_err_vs_exact_order"] for r in control for c in r.get("cases", []) if c.get("rel_err_vs_exact_order") is not None]
    if control_errors:
        summary.append(
            "control, GPTQ channel-wise (fp32 accumulation by design): error vs its exact-order reference "
            f"{min(control_errors):.2e} .. {max(control_errors):.2e}"
        )
    return {
        "evidence_class": config.evidence(capability),
        "turing_path_guard": guard,
        "comparison": compared,
        "awq": {"group_size": config.awq_group_size, "results": awq, "comparison": awq_compared},
        "control_channelwise": {"group_size": config.control_group_size, "results": control},
        "extra_summary": summary,
    }
