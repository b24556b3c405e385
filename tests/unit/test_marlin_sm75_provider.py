"""The vllm-sm75 provider's own logic on the CPU: AWQ references, the Turing-path guard, the comparison with
the seed's range, the scope, and the whole pipeline with an emulated op namespace.

The emulated ops compute the Marlin GEMM from the Marlin layouts (so the layouts and argument plumbing are
exercised) and can accumulate in fp16 per 16-wide K slice, as Turing Marlin does, or in fp32. The guard must
pass the first and fail the second; that is the property the GPU test relies on.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import numpy
import pytest

torch = pytest.importorskip("torch")

from t4patch.commands.engine_table import ENGINES  # noqa: E402
from t4patch.engines.vllm import marlin_sm75_provider as turing  # noqa: E402
from t4patch.errors import DataFileError  # noqa: E402
from t4patch.verify.marlin import checks, config, layout, providers, quant, report, runner, shapes  # noqa: E402

TABLE_DOC = {
    "schema": 1,
    "name": "tiny",
    "model": "unit-test shapes",
    "group_size": 32,
    "weight_type": "uint4b8",
    "linear": [
        {"name": "short", "n": 128, "k": 256, "layers": 1, "source": "test"},
        {"name": "long", "n": 64, "k": 1536, "layers": 1, "source": "test"},
    ],
}
GPU = {"index": 0, "name": "Emulated GPU", "capability": "9.0", "multiprocessors": 1, "memory_bytes": 0,
       "l2_bytes": 0, "peak_gb_per_s": None, "peak_source": "none", "driver": None}
RECORD = {
    "source": {"version": "0.33.0"},
    "emulation": {"capability": "7.5", "max_shared_memory_per_block_optin": 65536, "multiprocessors": 40, "source": "t"},
}


def _uninterleave(values):
    rows, cols = values.shape
    inverse = numpy.argsort(numpy.array([0, 2, 4, 6, 1, 3, 5, 7]))
    return values.reshape(-1, 8)[:, torch.tensor(inverse)].reshape(rows, cols)


def _unpermute_zeros(packed, n):
    grouped, _ = layout.scale_perms()
    inverse = torch.argsort(torch.tensor(grouped))
    zp = _uninterleave(layout.unpack_columns(packed))
    return zp.reshape(-1, len(grouped))[:, inverse].reshape(-1, n)


def emulated_ops(fp16_accumulation: bool):
    """torch.ops.<namespace> stand-in: vLLM's three ops computed from the Marlin layouts."""

    def marlin_gemm(a, c, w, bias, s, a_s, g_s, zp, ws, type_id, m, n, k, atomic, fp32_reduce, is_zp_float):
        codes = layout.marlin_reference_unrepack(w, k, n)
        groups = s.shape[0]
        group = k // groups
        scales = layout.marlin_unpermute_scales(s, k, n, group if groups > 1 else -1)
        if zp is not None:
            assert type_id == turing.UINT4.id
            zeros = _unpermute_zeros(zp, n).float().repeat_interleave(group, dim=0)
        else:
            assert type_id == turing.UINT4B8.id
            zeros = torch.full_like(codes, 8, dtype=torch.float32)
        if groups == 1:  # channel-wise: fp32 accumulation of a x (code - 8), the scale applied at the end in fp16
            out = (a.float() @ (codes.float() - zeros)).half() * scales.half()
            if c is not None:
                c.copy_(out)
                return c
            return out
        weight = ((codes.float() - zeros) * scales.float().repeat_interleave(group, dim=0)).half()
        if fp16_accumulation:  # Turing: fp16 accumulation for fp16 x 4-bit with groups
            acc = torch.zeros(m, n, dtype=torch.float16)
            for start in range(0, k, 16):
                acc = (acc.float() + a[:, start:start + 16].float() @ weight[start:start + 16].float()).half()
            out = acc
        else:
            out = (a.float() @ weight.float()).half()
        if c is not None:
            c.copy_(out)
            return c
        return out

    def gptq_marlin_repack(q, k, n, bits, is_a_8bit):
        return layout.marlin_reference_repack(quant.gptq_unpack(q))

    def awq_marlin_repack(q, k, n, bits, is_a_8bit):
        return layout.marlin_reference_repack(_uninterleave(layout.unpack_columns(q)))

    return SimpleNamespace(marlin_gemm=marlin_gemm, gptq_marlin_repack=gptq_marlin_repack, awq_marlin_repack=awq_marlin_repack)


def sm75_provider(fp16_accumulation: bool) -> providers.MarlinProvider:
    ops = emulated_ops(fp16_accumulation)
    cfg = turing.load_config()
    workspace = lambda device: torch.zeros(1, dtype=torch.int32)  # noqa: E731

    def gemm(a, c, w, s, ws, m, n, k, atomic, fp32_reduce):
        return ops.marlin_gemm(a, c, w, None, s, None, None, None, ws, turing.UINT4B8.id, m, n, k, atomic, fp32_reduce, False)

    def extra(results, table, settings, failures):
        return turing.extra_checks(ops, workspace, cfg, results, table, settings, failures, (9, 0))

    return providers.MarlinProvider(
        name=turing.NAME,
        repack=lambda q, k, n: ops.gptq_marlin_repack(q, k, n, 4, False),
        gemm=gemm,
        make_workspace=workspace,
        info={"vllm": {"source": "emulated"}, "weight_type_id": turing.UINT4B8.id},
        extra_checks=extra,
        scope=lambda cap, name: turing.scope(cfg, cap, name, RECORD),
    )


def run(provider, m_values=(1, 4)):
    table = shapes.parse_shape_table(TABLE_DOC, Path("tiny.toml"))
    tol = config.load_tolerances()
    settings = checks.Settings(m_values=m_values, seed=0, group_size=32, tolerances=tol, speed=False, quick=True,
                               l2_bytes=0, peak_gb_per_s=None, device="cpu")
    software = {"python": "3", "torch": torch.__version__, "cuda": None, "target": {}}
    return runner.execute(provider, table, tol, settings, GPU, software, ENGINES)


def test_uint4_id_is_vllms():
    assert turing.UINT4.id == 1125899906843648  # vllm/scalar_type.py: uint4 (research notes, section 4)


def test_awq_pack_matches_vllms_numpy_recipe():
    gen = torch.Generator().manual_seed(1)
    codes = torch.randint(0, 16, (32, 64), generator=gen, dtype=torch.int32)
    # vLLM quant_utils.awq_pack: interleave columns by 0 2 4 6 1 3 5 7, then pack_cols (value i at bits 4i)
    q = codes.numpy().astype(numpy.uint32).reshape(-1, 8)[:, [0, 2, 4, 6, 1, 3, 5, 7]].reshape(32, 64)
    expected = numpy.zeros((32, 8), dtype=numpy.uint32)
    for i in range(8):
        expected |= q[:, i::8] << (4 * i)
    assert torch.equal(turing.awq_pack(codes), torch.from_numpy(expected.astype(numpy.int32)))


def test_marlin_zero_points_match_vllms_numpy_recipe():
    gen = torch.Generator().manual_seed(2)
    n = 128
    zp = torch.randint(0, 16, (4, n), generator=gen, dtype=torch.int32)
    grouped, _ = layout.scale_perms()
    step = zp.numpy().reshape(-1, 64)[:, list(grouped)]
    step = step.reshape(-1, 8)[:, [0, 2, 4, 6, 1, 3, 5, 7]].ravel().reshape(-1, n).astype(numpy.uint32)
    expected = numpy.zeros((4, n // 8), dtype=numpy.uint32)
    for i in range(8):
        expected |= step[:, i::8] << (4 * i)
    assert torch.equal(turing.marlin_zero_points(zp, n), torch.from_numpy(expected.astype(numpy.int32)))
    assert torch.equal(_unpermute_zeros(turing.marlin_zero_points(zp, n), n), zp)


def test_awq_quantization_round_trips_within_half_a_step():
    w = torch.randn(256, 64, generator=torch.Generator().manual_seed(3)) * 0.02
    codes, zeros, scales = turing.awq_quantize(w, 128)
    assert int(codes.min()) >= 0 and int(codes.max()) <= 15 and int(zeros.max()) <= 15
    w16 = turing.awq_dequantize(codes, zeros, scales, 128).float()
    step = scales.float().repeat_interleave(128, dim=0)
    assert float(((w16 - w).abs() / step).max()) <= 0.51 + 1e-3


def test_shipped_config_is_valid_and_has_the_issue_figures():
    cfg = turing.load_config()
    assert (cfg.guard_min_k, cfg.guard_fp32_level) == (1536, 1e-5)
    assert (cfg.seed_low, cfg.seed_high, cfg.sm90_figure) == (0.7e-3, 2.0e-3, 1.6e-6)
    assert cfg.evidence((9, 0)) == "sm_75 code executed on sm_90 through PTX JIT, T4 host parameters emulated"


def test_bad_config_is_refused(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("schema = 1\n")
    with pytest.raises(DataFileError, match="missing required key"):
        turing.load_config(path)
    good = (Path(turing.data_dir("engine-data")) / "vllm" / "marlin-sm75-emulation.toml").read_text()
    path.write_text(good.replace("min_k = 1536", "min_k = 1536\nmin_kk = 1"))
    with pytest.raises(DataFileError, match="unknown key 'min_kk'"):
        turing.load_config(path)
    path.write_text("evidence_class = \"sm_75 code\"\n" + good)  # the evidence class lives in t4patch.evidence
    with pytest.raises(DataFileError, match="evidence_class"):
        turing.load_config(path)


@pytest.fixture(scope="module")
def fp16_run():
    return run(sm75_provider(fp16_accumulation=True))


@pytest.fixture(scope="module")
def fp32_run():
    return run(sm75_provider(fp16_accumulation=False))


def test_fp16_accumulating_run_passes_with_awq_control_and_comparison(fp16_run):
    payload, failures = fp16_run
    assert failures == [], failures
    assert payload["verdict"] == "pass"
    guard = payload["turing_path_guard"]
    assert guard["turing_path"] and guard["cases_checked"] == 2  # the K = 1536 shape at m = 1 and 4
    long = next(s for s in payload["results"] if s["k"] == 1536)
    assert all(c["rel_err_vs_fp16"] > 1e-5 for c in long["cases"])
    assert [r["repack"]["exact"] for r in payload["awq"]["results"]] == [True, True]
    assert all(c["status"] == "pass" for r in payload["awq"]["results"] for c in r["cases"])
    control = [c["rel_err_vs_exact_order"] for r in payload["control_channelwise"]["results"] for c in r["cases"]]
    assert max(control) < 1e-5 < min(c["rel_err_vs_fp16"] for c in long["cases"])
    assert payload["comparison"]["cases"] == 4
    assert payload["evidence_class"].startswith("sm_75 code executed on sm_90 through PTX JIT")
    text = report.render_text(payload, ENGINES)
    assert "Turing-path guard" in text and "AWQ g128" in text and "PTX JIT" in text


def test_fp32_accumulating_run_fails_the_turing_path_guard(fp32_run):
    payload, failures = fp32_run
    assert payload["verdict"] == "fail"
    assert not payload["turing_path_guard"]["turing_path"]
    messages = [m for kind, m in failures if kind == "accuracy"]
    assert messages and all("Turing fp16-accumulating path did not run" in m for m in messages)
    assert {(item["k"], item["m"]) for item in payload["turing_path_guard"]["cases_at_fp32_level"]} == {(1536, 1), (1536, 4)}
    with pytest.raises(Exception) as excinfo:
        report.raise_for_failures(failures)
    assert getattr(excinfo.value, "exit_code", None) == 12


def test_corrupted_awq_repack_is_caught():
    provider = sm75_provider(fp16_accumulation=True)
    ops = emulated_ops(True)
    good = ops.awq_marlin_repack

    def bad(q, k, n, bits, a8):
        out = good(q, k, n, bits, a8).clone()
        out[0, 0] ^= 1
        return out

    ops.awq_marlin_repack = bad
    cfg = turing.load_config()
    extra = lambda results, table, settings, failures: turing.extra_checks(  # noqa: E731
        ops, provider.make_workspace, cfg, results, table, settings, failures, (9, 0))
    payload, failures = run(dataclasses.replace(provider, extra_checks=extra))
    assert any(kind == "repack" and m.startswith("AWQ") for kind, m in failures)


def test_guard_without_long_k_cases_fails_loudly():
    failures = checks.Failures([])
    guard = turing.turing_path_guard(turing.load_config(), [{"shape": "s", "k": 256, "cases": [{"m": 1, "rel_err_vs_fp16": 1e-3}]}], failures)
    assert not guard["turing_path"] and failures.items and "no case with K >= 1536" in failures.items[0][1]


def test_comparison_counts_the_seed_range():
    cfg = turing.load_config()
    results = [{"cases": [{"rel_err_vs_fp16": v} for v in (5e-4, 1e-3, 1.5e-3, 3e-3)]}]
    got = turing.comparison(cfg, results)
    assert (got["inside_seed_range"], got["below_seed_range"], got["above_seed_range"]) == (2, 1, 1)
    assert got["min"] == 5e-4 and got["max"] == 3e-3


def test_scope_names_the_evidence_class_and_what_it_cannot_prove():
    proves, does_not = turing.scope(turing.load_config(), (9, 0), "NVIDIA H200", RECORD)
    assert "sm_75 code executed on sm_90 through PTX JIT, T4 host parameters emulated" in proves[0]
    joined = " ".join(does_not)
    for needle in ("T4 timing", "rounding", "SASS", "ptxas"):
        assert needle in joined
