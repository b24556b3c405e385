"""The verdict, the scope statement, and the two renderings (aligned text, JSON schema 1) of a run.

The verdict is computed here from the recorded failures only, so the text, the JSON and the exit code can
never disagree. The scope statement is computed from the compute capability the run actually used: a run on
sm_90 proves the code path and the layouts, not Turing's fp16-accumulating numerics or its speed.
"""

from __future__ import annotations

from typing import Any

from t4patch.contract import EngineTable
from t4patch.cuda.arch import TURING_CAPABILITY
from t4patch.errors import DeterminismError, VerificationError
from t4patch.output import table

COMMAND = "verify marlin"
NEXT_STEP = "rerun with --json for every figure; report it with the GPU and engine versions"


def scope(
    capability: tuple[int, int], gpu_name: str, engines: EngineTable, provider: str | None = None
) -> tuple[list[str], list[str]]:
    """(what this run proves, what it does not) for sm_75, given the GPU it ran on, the engine table and the
    provider that ran."""
    sm = f"sm_{capability[0]}{capability[1]}"
    if capability == TURING_CAPABILITY:
        proves = [
            f"the engine's Marlin kernels ran on this {gpu_name} ({sm}): the accuracy, determinism, overflow and "
            "speed figures are Turing's own (fp16 accumulation included)",
            "the repack layout equals the reference Marlin layout exactly on every shape",
        ]
        does_not = [
            "end-to-end model quality: these are synthetic Q4_0-grid weights, not the checkpoint",
            "other Turing boards with different clocks or memory (speed only)",
        ]
        return proves, does_not
    kernels = engines.marlin_kernels(provider)  # for a redirect: the engine it forwards to, through the table
    numerics = (kernels.numerics_reference if kernels else None) or "upstream"
    library = (kernels.library if kernels else None) or "the engine's library"
    # what a redirect run proves, for every engine that has one (the sentence lists them all, whichever ran)
    redirects = "".join(
        f", and {scoped.redirect_clause}"
        for engine in engines
        if (scoped := engine.marlin_scope) is not None and scoped.redirect_clause
    )
    proves = [
        f"the provider's code path on a real GPU ({gpu_name}, {sm}): argument mapping, workspace, dtypes{redirects}",
        "the repack layout equals the reference Marlin layout exactly (the layout does not depend on the GPU)",
        f"accuracy within upstream's bound and determinism with atomic-add off, for the {sm} build of the same source",
    ]
    does_not = [
        f"Turing numerics: Marlin on sm_75 accumulates in fp16 ({numerics}), so a T4's error is expected to be larger "
        f"(the seed measured 0.7e-3..2.0e-3) than {sm}'s fp32-accumulated figures here",
        "fp16-accumulation overflow: the overflow scan here ran on kernels that accumulate in fp32",
        "Turing speed or bandwidth use: times and bytes/s are this GPU's",
        f"that {library} holds working sm_75 cubins: that needs a T4 (t4patch doctor reads the fatbin for their presence)",
    ]
    return proves, does_not


def verdict(failures: list[tuple[str, str]]) -> str:
    return "pass" if not failures else "fail"


def raise_for_failures(failures: list[tuple[str, str]]) -> None:
    """DeterminismError when only determinism failed; VerificationError for anything else."""
    if not failures:
        return
    kinds = sorted({kind for kind, _ in failures})
    first = failures[0][1]
    more = f" (+{len(failures) - 1} more)" if len(failures) > 1 else ""
    if kinds == ["determinism"]:
        raise DeterminismError(
            f"expected bitwise-equal results with atomic-add off, found: {first}{more}", hint=NEXT_STEP
        )
    raise VerificationError(f"Marlin check failed [{', '.join(kinds)}]: {first}{more}", hint=NEXT_STEP)


def _fmt(value: Any, spec: str = ".2e") -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def _det(entry: dict[str, Any] | None) -> str:
    if not entry:
        return "-"
    if "error" in entry:
        return "error"
    return f"{entry['distinct_results']}/{entry['runs']}" + ("" if entry["bitwise_equal"] else " !")


def render_text(report: dict[str, Any], engines: EngineTable) -> str:
    gpu = report["gpu"]
    prov = report["provider"]
    direct = redirect_target(prov, engines)
    lines = [
        f"t4patch verify marlin: provider {prov['name']}, shapes {report['shapes']['name']}, m = "
        + ", ".join(str(m) for m in report["m"]),
        f"GPU: {gpu['name']} (sm_{gpu['capability'].replace('.', '')}, {gpu['multiprocessors']} SMs, "
        f"datasheet {_fmt(gpu['peak_gb_per_s'], '.0f')} GB/s, measured copy "
        f"{_fmt(gpu.get('measured_copy_gb_per_s'), '.0f')} GB/s); torch {report['software']['torch']}, "
        f"CUDA {report['software']['cuda']}",
        f"engine: {provider_summary(prov, engines)}",
    ]
    for note in prov.get("standins", []):
        lines.append(f"  stand-in: {note}")
    lines.append("")
    rows = []
    for shape in report["results"]:
        for case in shape.get("cases", []):
            rows.append(
                [
                    shape["shape"],
                    shape["n"],
                    shape["k"],
                    case["m"],
                    _fmt(case.get("rel_err_vs_fp16")),
                    _fmt(case.get("rel_err_vs_fp32")),
                    _fmt(case.get("fp16_matmul_vs_fp32")),
                    case.get("status", "-"),
                    _det(case.get("determinism_atomic_off")),
                    _det(case.get("determinism_atomic_on")),
                ]
                + ([_fmt(case.get(f"redirect_bitwise_equal_to_{direct}"))] if direct else [])
            )
    headers = ["shape", "N", "K", "m", "err/fp16", "err/fp32", "fp16mm/fp32", "status", "det off", "det atomic"]
    if direct:
        headers.append(f"=={direct}")
    lines += ["accuracy (mean|out-ref|/mean|ref|) and determinism (distinct results / runs)", table(headers, rows), ""]
    lines.append("repack vs reference Marlin layout, and overflow scan (Gemma-sized activations)")
    rows = []
    for shape in report["results"]:
        rep = shape.get("repack", {})
        over = shape.get("overflow", {})
        rows.append(
            [
                shape["shape"],
                "exact" if rep.get("exact") else ("ERROR" if "error" in rep else "MISMATCH"),
                _fmt(over.get("m")),
                _fmt(over.get("max_abs_activation"), ".0f"),
                _fmt(over.get("max_abs_ref_fp32"), ".4g"),
                _fmt(over.get("nonfinite_outputs")),
                _fmt(over.get("rel_err_vs_fp32")),
            ]
        )
    lines += [table(["shape", "repack", "m", "max|a|", "max|ref|", "inf/nan", "err/fp32"], rows), ""]
    speed_rows = []
    for shape in report["results"]:
        for case in shape.get("cases", []):
            sp = case.get("speed")
            if not sp or "error" in sp:
                continue
            row = [
                shape["shape"],
                case["m"],
                _fmt(sp.get("marlin_us"), ".2f"),
                _fmt(sp.get("fp16_matmul_us"), ".2f"),
                _fmt(sp.get("speedup_vs_fp16"), ".2f"),
                _fmt(sp.get("achieved_gb_per_s"), ".0f"),
                _fmt(sp.get("fraction_of_peak_bandwidth"), ".0%") if sp.get("fraction_of_peak_bandwidth") else "-",
                _fmt(sp.get("fraction_of_measured_copy"), ".0%") if sp.get("fraction_of_measured_copy") else "-",
            ]
            if direct:
                row += [
                    _fmt(sp.get(f"direct_{direct}_us"), ".2f"),
                    _fmt(sp.get("redirect_graph_overhead"), "+.1%"),
                    _fmt(sp.get("redirect_eager_overhead"), "+.1%")
                    + (f" ({sp['eager_paired_diff_us']:+.2f}±{sp['eager_paired_diff_iqr_us']:.2f} us)"
                       if sp.get("eager_paired_diff_us") is not None else ""),
                ]
            speed_rows.append(row)
    if speed_rows:
        headers = ["shape", "m", "marlin us", "fp16 us", "x fp16", "GB/s", "of peak", "of copy"]
        if direct:
            headers += [f"{direct} us", "graph ovh", "eager ovh"]
        lines += ["speed (CUDA graph replays timed with events; weights rotated past L2)", table(headers, speed_rows), ""]
    goals = [
        case["speed"]["redirect_overhead_goal_met"]
        for shape in report["results"]
        for case in shape.get("cases", [])
        if "redirect_overhead_goal_met" in (case.get("speed") or {})
    ]
    if goals:
        goal = report["tolerances"]["redirect_overhead_goal"]
        lines.append(
            f"redirect overhead goal (<= {goal:.0%} per eager call at m = {report['tolerances']['redirect_overhead_m']}): "
            f"met on {sum(goals)} of {len(goals)} shapes (reported, not a verdict)"
        )
    if report.get("act_order"):
        ao = report["act_order"]
        for what in ("repack", "gemm"):
            if what in ao:
                entry = ao[what]
                lines.append(
                    f"act-order {what}: " + ("refused: " if entry["refused"] else "NOT refused ") + entry.get("error", "")
                )
    if report.get("switch_off_probe"):
        lines.append(f"without {report['switch_off_probe']['env'].split()[0]}: {report['switch_off_probe']['repack']}")
    lines += report.get("extra_summary", [])  # provider-specific lines (vllm-sm75)
    lines.append("")
    lines.append("this run proves: " + "; ".join(report["scope"]["proves"]))
    lines.append("it does not prove: " + "; ".join(report["scope"]["does_not_prove"]))
    lines.append("")
    if report["failures"]:
        lines.append(f"verdict: FAIL ({len(report['failures'])} failures)")
        lines += [f"  [{f['kind']}] {f['message']}" for f in report["failures"]]
    else:
        flagged = sum(1 for s in report["results"] for c in s.get("cases", []) if c.get("status") == "flag")
        lines.append("verdict: pass" + (f" ({flagged} cases above the flag level)" if flagged else ""))
    return "\n".join(lines)


def redirect_target(prov: dict[str, Any], engines: EngineTable) -> str | None:
    """The engine the provider's redirect forwards to (its columns in the tables), or None."""
    found = engines.marlin_spec(prov["name"])
    return found[1].redirect_to if found else None


def provider_summary(prov: dict[str, Any], engines: EngineTable) -> str:
    found = engines.marlin_spec(prov["name"])
    if found is None:
        return f"provider {prov['name']}"
    return found[1].summary(prov)
