"""The GPU checks of one shape: repack exactness, accuracy, determinism, overflow, speed, and (for a provider
whose engine redirects Marlin to another engine's op) the redirect's equality with and overhead over that op.

Every figure goes into a JSON-ready dict; every failure is appended to ``failures`` as (kind, message) so the
verdict is computed in one place (:mod:`t4patch.verify.marlin.report`). Engine exceptions are caught per step
and recorded: one broken shape must not hide the results of the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from t4patch.contract import MarlinProvider, RedirectLabels
from t4patch.verify.marlin import layout, metrics, probe, quant, timing
from t4patch.verify.marlin.config import Tolerances
from t4patch.verify.marlin.probe import bitwise_equal as bitwise_equal
from t4patch.verify.marlin.shapes import LinearShape

if TYPE_CHECKING:
    import torch

FP16_MAX = 65504.0
FAILURE_KINDS = ("repack", "accuracy", "determinism", "overflow", "redirect")


@dataclass(frozen=True)
class Settings:
    m_values: tuple[int, ...]
    seed: int
    group_size: int
    tolerances: Tolerances
    speed: bool
    quick: bool
    l2_bytes: int
    peak_gb_per_s: float | None
    copy_gb_per_s: float | None = None  # measured device-to-device copy rate on this GPU
    device: str = "cuda"  # "cpu" only in unit tests with an emulated provider (no timing there)


@dataclass
class Failures:
    items: list[tuple[str, str]]

    def add(self, kind: str, message: str) -> None:
        assert kind in FAILURE_KINDS, kind
        self.items.append((kind, message))


def _activations(seed: int, label: str, m: int, k: int, device: torch.device, std: float = 1.0) -> torch.Tensor:
    import torch

    a = torch.randn(m, k, generator=quant.cpu_generator(seed, label), dtype=torch.float32) * std
    return a.to(torch.float16).to(device)


def check_shape(provider: MarlinProvider, shape: LinearShape, settings: Settings, failures: Failures) -> dict[str, Any]:
    """Run every check for one (N, K); return its JSON-ready record."""
    tol = settings.tolerances
    device = probe.device_for(settings.device)
    n, k, group = shape.n, shape.k, settings.group_size
    where = f"{shape.name} (N={n}, K={k})"
    record: dict[str, Any] = {"shape": shape.name, "n": n, "k": k, "layers": shape.layers}

    weight = quant.random_q4_0_weight(k, n, group_size=group, std=tol.weight_std, seed=settings.seed, label=shape.name)
    packed = quant.gptq_pack(weight.codes)
    reference_layout = layout.marlin_reference_repack(weight.codes)
    scales_marlin = layout.marlin_permute_scales(weight.scales, k, n, group)
    record["weights"] = {
        "qweight_sha256": quant.sha256_tensor(packed),
        "scales_sha256": quant.sha256_tensor(weight.scales),
        "reference_layout_sha256": quant.sha256_tensor(reference_layout),
    }

    # --- repack: the engine's layout must equal the reference bit for bit
    try:
        marlin_q = provider.repack(packed.to(device).contiguous(), k, n)
        probe.sync(device)
    except provider.own_path_errors as exc:
        failures.add("redirect", f"{where}: repack reached {_own_path(provider)} ({exc})")
        record["repack"] = {"exact": False, "error": probe.err(exc)}
        return record
    except Exception as exc:  # noqa: BLE001
        failures.add("repack", f"{where}: repack raised {probe.err(exc)}")
        record["repack"] = {"exact": False, "error": probe.err(exc)}
        return record
    comparison = layout.compare_repack(marlin_q, reference_layout, k, n)
    record["repack"] = comparison.to_json()
    if not comparison.exact:
        detail = (
            f"shape {tuple(marlin_q.shape)} {marlin_q.dtype} vs {tuple(reference_layout.shape)} int32"
            if not comparison.shape_ok
            else f"{comparison.mismatched_codes} codes differ, first at (k, n) = {comparison.first_mismatches[:3]}"
        )
        failures.add("repack", f"{where}: repack differs from the reference Marlin layout: {detail}")

    w16 = quant.dequantize(weight.codes.to(device), weight.scales.to(device), group)
    scales_gpu = scales_marlin.to(device)
    workspace = provider.make_workspace(device)
    direct_workspace = provider.direct_workspace(device) if provider.direct_workspace else None
    cases = []
    for m in settings.m_values:
        cases.append(
            _check_m(provider, shape, settings, failures, m, marlin_q, scales_gpu, w16, workspace, direct_workspace)
        )
    record["cases"] = cases
    record["overflow"] = _check_overflow(provider, shape, settings, failures, marlin_q, scales_gpu, w16, workspace)
    if settings.speed:
        _speed(provider, shape, settings, record, marlin_q, scales_gpu, w16, workspace, direct_workspace)
    return record


def _check_m(
    provider: MarlinProvider,
    shape: LinearShape,
    settings: Settings,
    failures: Failures,
    m: int,
    marlin_q: torch.Tensor,
    scales: torch.Tensor,
    w16: torch.Tensor,
    workspace: torch.Tensor,
    direct_workspace: torch.Tensor | None,
) -> dict[str, Any]:
    import torch

    tol = settings.tolerances
    n, k = shape.n, shape.k
    where = f"{shape.name} (N={n}, K={k}) m={m}"
    case: dict[str, Any] = {"m": m}
    a = _activations(settings.seed, f"{shape.name}:a:{m}", m, k, w16.device)
    ref16 = a @ w16
    ref32 = a.float() @ w16.float()
    case["fp16_matmul_vs_fp32"] = probe.rounded(metrics.relative_mean_abs_error(ref16, ref32))

    def gemm(atomic: bool, c: torch.Tensor | None = None) -> torch.Tensor:
        return provider.gemm(a, c, marlin_q, scales, workspace, m, n, k, atomic, True)

    # accuracy: the output buffer is poisoned with NaN so an element the kernel never wrote cannot pass
    try:
        poisoned = torch.full((m, n), float("nan"), dtype=torch.float16, device=a.device)
        out = gemm(False, poisoned)
        probe.sync(a.device)
    except provider.own_path_errors as exc:
        failures.add("redirect", f"{where}: GEMM reached {_own_path(provider)} ({exc})")
        case.update(status="fail", error=probe.err(exc))
        return case
    except Exception as exc:  # noqa: BLE001
        failures.add("accuracy", f"{where}: GEMM raised {probe.err(exc)}")
        case.update(status="fail", error=probe.err(exc))
        return case
    rel16 = metrics.relative_mean_abs_error(out, ref16)
    rel32 = metrics.relative_mean_abs_error(out, ref32)
    status = metrics.classify(rel16, fail_above=tol.fail_above, flag_above=tol.flag_above)
    case.update(
        rel_err_vs_fp16=probe.rounded(rel16),
        rel_err_vs_fp32=probe.rounded(rel32),
        status=status,
        nonfinite=int((~torch.isfinite(out)).sum()),
        max_abs_diff_vs_fp32=probe.rounded(float((out.float() - ref32).abs().max())),
    )
    if status == "fail":
        failures.add(
            "accuracy",
            f"{where}: mean|out-ref|/mean|ref| = {rel16:.3g} > {tol.fail_above}"
            + (f" ({case['nonfinite']} non-finite outputs)" if case["nonfinite"] else ""),
        )

    # determinism: atomic-add off must repeat bit for bit; with it on, report what happens
    runs = tol.determinism_runs
    try:
        repeats = [out] + [gemm(False) for _ in range(runs - 1)]
        probe.sync(a.device)
        distinct = probe.distinct(repeats)
        case["determinism_atomic_off"] = {"runs": runs, "distinct_results": distinct, "bitwise_equal": distinct == 1}
        if distinct != 1:
            failures.add("determinism", f"{where}: {runs} runs with atomic-add off gave {distinct} different results")
    except Exception as exc:  # noqa: BLE001
        case["determinism_atomic_off"] = {"runs": runs, "error": probe.err(exc)}
        failures.add("determinism", f"{where}: repeated GEMM raised {probe.err(exc)}")
    try:
        atomic_runs = [gemm(True) for _ in range(runs)]
        probe.sync(a.device)
        distinct = probe.distinct(atomic_runs)
        case["determinism_atomic_on"] = {
            "runs": runs,
            "distinct_results": distinct,
            "bitwise_equal": distinct == 1,
            "rel_err_vs_fp16": probe.rounded(metrics.relative_mean_abs_error(atomic_runs[0], ref16)),
        }
    except Exception as exc:  # noqa: BLE001 - reported only; atomic-add is off by default
        case["determinism_atomic_on"] = {"runs": runs, "error": probe.err(exc)}

    # a redirect must be the other engine's op: bitwise the same result for the same inputs
    if provider.direct_gemm is not None:
        labels = _labels(provider)
        key = f"redirect_bitwise_equal_to_{labels.direct}"
        try:
            direct = provider.direct_gemm(a, None, marlin_q, scales, direct_workspace, m, n, k, False, True)
            probe.sync(a.device)
            equal = bitwise_equal(out, direct)
            case[key] = equal
            if not equal:
                failures.add(
                    "redirect",
                    f"{where}: {labels.engine}'s result differs from {labels.direct_label}'s marlin_gemm with the same inputs",
                )
        except Exception as exc:  # noqa: BLE001
            case[key] = None
            failures.add("redirect", f"{where}: direct {labels.direct_label} marlin_gemm raised {probe.err(exc)}")
    return case


def _check_overflow(
    provider: MarlinProvider,
    shape: LinearShape,
    settings: Settings,
    failures: Failures,
    marlin_q: torch.Tensor,
    scales: torch.Tensor,
    w16: torch.Tensor,
    workspace: torch.Tensor,
) -> dict[str, Any]:
    """Gemma-sized activations: a unit body plus outlier channels at the largest fp16 activation reported."""
    import torch

    tol = settings.tolerances
    n, k = shape.n, shape.k
    m = max(settings.m_values)
    generator = quant.cpu_generator(settings.seed, f"{shape.name}:overflow")
    a = torch.randn(m, k, generator=generator, dtype=torch.float32) * tol.overflow_body_std
    outliers = max(1, round(k * tol.overflow_outlier_fraction)) if tol.overflow_outlier_abs > 0 else 0
    channels = torch.randperm(k, generator=generator)[:outliers]
    signs = torch.randint(0, 2, (m, outliers), generator=generator).float() * 2 - 1
    a[:, channels] = signs * tol.overflow_outlier_abs
    a = a.to(torch.float16).to(w16.device)
    ref32 = a.float() @ w16.float()
    max_ref = float(ref32.abs().max())
    result: dict[str, Any] = {
        "m": m,
        "outlier_channels": outliers,
        "max_abs_activation": float(a.abs().max()),
        "max_abs_ref_fp32": probe.rounded(max_ref),
        "ref_fits_fp16": max_ref <= FP16_MAX,
    }
    try:
        out = provider.gemm(a, None, marlin_q, scales, workspace, m, n, k, False, True)
        probe.sync(a.device)
    except Exception as exc:  # noqa: BLE001
        result["error"] = probe.err(exc)
        failures.add("overflow", f"{shape.name}: GEMM with Gemma-sized activations raised {probe.err(exc)}")
        return result
    nonfinite = int((~torch.isfinite(out)).sum())
    fp16_nonfinite = int((~torch.isfinite(a @ w16)).sum())
    result.update(
        nonfinite_outputs=nonfinite,
        fp16_matmul_nonfinite=fp16_nonfinite,
        max_abs_out=probe.rounded(float(out.float().abs().max())) if nonfinite == 0 else None,
        rel_err_vs_fp32=probe.rounded(metrics.relative_mean_abs_error(out, ref32)),
    )
    if nonfinite and max_ref <= FP16_MAX:
        failures.add(
            "overflow",
            f"{shape.name} m={m}: {nonfinite} inf/NaN outputs although the fp32 result fits fp16 (max {max_ref:.4g})",
        )
    return result


def _speed(
    provider: MarlinProvider,
    shape: LinearShape,
    settings: Settings,
    record: dict[str, Any],
    marlin_q: torch.Tensor,
    scales: torch.Tensor,
    w16: torch.Tensor,
    workspace: torch.Tensor,
    direct_workspace: torch.Tensor | None,
) -> None:
    import torch

    tol = settings.tolerances
    n, k, group = shape.n, shape.k, settings.group_size
    replays = tol.graph_replays_quick if settings.quick else tol.graph_replays
    weight_bytes = k * n // 2 + (k // group) * n * 2
    copies = timing.rotating_copies(weight_bytes, settings.l2_bytes, tol.rotate_bytes_over_l2, tol.max_rotating_copies)
    copies16 = timing.rotating_copies(2 * k * n, settings.l2_bytes, tol.rotate_bytes_over_l2, tol.max_rotating_copies)
    qs = [marlin_q] + [marlin_q.clone() for _ in range(copies - 1)]
    ss = [scales] + [scales.clone() for _ in range(copies - 1)]
    ws16 = [w16] + [w16.clone() for _ in range(copies16 - 1)]
    record["speed_setup"] = {"weight_copies_marlin": copies, "weight_copies_fp16": copies16, "replays": replays}
    by_m = {case["m"]: case for case in record["cases"]}
    overhead_m = tol.redirect_overhead_m if tol.redirect_overhead_m in by_m else min(by_m)
    for m, case in by_m.items():
        if case.get("status") == "fail" and "error" in case:
            continue
        a = _activations(settings.seed, f"{shape.name}:a:{m}", m, k, w16.device)
        try:
            t_marlin = timing.time_kernel(
                lambda i: provider.gemm(a, None, qs[i], ss[i], workspace, m, n, k, False, True), copies, replays
            )
            t_fp16 = timing.time_kernel(lambda i: torch.matmul(a, ws16[i]), copies16, replays)
        except Exception as exc:  # noqa: BLE001 - speed is reported, never a verdict
            case["speed"] = {"error": probe.err(exc)}
            continue
        bytes_marlin = weight_bytes + m * k * 2 + m * n * 2
        gbps = bytes_marlin / (t_marlin.us_per_call * 1e-6) / 1e9
        speed: dict[str, Any] = {
            "marlin_us": probe.rounded(t_marlin.us_per_call),
            "fp16_matmul_us": probe.rounded(t_fp16.us_per_call),
            "speedup_vs_fp16": probe.rounded(t_fp16.us_per_call / t_marlin.us_per_call, 3),
            "method": t_marlin.method,
            "marlin_spread": probe.rounded(t_marlin.spread, 2),
            "bytes_moved": bytes_marlin,
            "achieved_gb_per_s": probe.rounded(gbps),
            "fraction_of_peak_bandwidth": probe.rounded(gbps / settings.peak_gb_per_s, 3) if settings.peak_gb_per_s else None,
            "fraction_of_measured_copy": probe.rounded(gbps / settings.copy_gb_per_s, 3) if settings.copy_gb_per_s else None,
            "fp16_matmul_gb_per_s": probe.rounded((2 * k * n + m * k * 2 + m * n * 2) / (t_fp16.us_per_call * 1e-6) / 1e9),
        }
        if t_marlin.graph_error:
            speed["graph_error"] = t_marlin.graph_error
        direct_gemm = provider.direct_gemm
        if direct_gemm is not None:
            direct_key = _labels(provider).direct
            try:
                t_direct = timing.time_kernel(
                    lambda i: direct_gemm(a, None, qs[i], ss[i], direct_workspace, m, n, k, False, True),
                    copies,
                    replays,
                )
                speed[f"direct_{direct_key}_us"] = probe.rounded(t_direct.us_per_call)
                speed["redirect_graph_overhead"] = probe.rounded(t_marlin.us_per_call / t_direct.us_per_call - 1, 3)
                if m == overhead_m:
                    host = timing.host_overhead(
                        lambda: direct_gemm(a, None, marlin_q, scales, direct_workspace, m, n, k, False, True),
                        lambda: provider.gemm(a, None, marlin_q, scales, workspace, m, n, k, False, True),
                        tol.eager_calls,
                        tol.eager_rounds,
                    )
                    speed[f"eager_direct_{direct_key}_us"] = probe.rounded(host.us_a)
                    speed[f"eager_{provider.name}_us"] = probe.rounded(host.us_b)
                    speed["eager_paired_diff_us"] = probe.rounded(host.diff_us, 3)
                    speed["eager_paired_diff_iqr_us"] = probe.rounded(host.diff_iqr_us, 3)
                    speed["eager_rounds"] = host.rounds
                    speed["eager_calls_per_round"] = host.calls_per_round
                    speed["redirect_eager_overhead"] = probe.rounded(host.overhead, 3)
                    speed["redirect_overhead_goal_met"] = host.overhead <= tol.redirect_overhead_goal
            except Exception as exc:  # noqa: BLE001
                speed[f"direct_{direct_key}_error"] = probe.err(exc)
        case["speed"] = speed


_UNLABELLED = RedirectLabels(engine="the engine", direct="direct", direct_label="the direct", own_path="the engine's own kernel")


def _labels(provider: MarlinProvider) -> RedirectLabels:
    return provider.redirect or _UNLABELLED


def _own_path(provider: MarlinProvider) -> str:
    return _labels(provider).own_path
