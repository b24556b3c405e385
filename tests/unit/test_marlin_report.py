"""The whole check pipeline on the CPU with an emulated Marlin, the report schema, and the exit codes.

The emulated provider repacks with the reference layout and multiplies the decoded weights in fp32; variants
corrupt one code, add noise, vary between calls, or leave the output unwritten, and each must be caught by the
check it targets with the exit code the CLI promises.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from t4patch import cli  # noqa: E402
from t4patch.commands.engine_table import ENGINES  # noqa: E402
from t4patch.environment.target import resolve_target  # noqa: E402
from t4patch.errors import (  # noqa: E402
    DeterminismError,
    MissingDependencyError,
    NoGpuError,
    VerificationError,
)
from t4patch.output import emit_json  # noqa: E402
from t4patch.verify.marlin import checks, config, layout, probe, providers, quant, report, runner, shapes  # noqa: E402

TABLE_DOC = {
    "schema": 1,
    "name": "tiny",
    "model": "unit-test shapes",
    "group_size": 32,
    "weight_type": "uint4b8",
    "linear": [
        {"name": "wide", "n": 192, "k": 256, "layers": 2, "source": "test"},
        {"name": "deep", "n": 64, "k": 384, "layers": 1, "source": "test"},
    ],
}
GPU = {
    "index": 0,
    "name": "Emulated GPU",
    "capability": "9.0",
    "multiprocessors": 1,
    "memory_bytes": 0,
    "l2_bytes": 0,
    "peak_gb_per_s": None,
    "peak_source": "none",
    "driver": None,
}


def emulated(*, corrupt=False, noise=0.0, flaky=False, unwritten=False, atomic_flaky=True) -> providers.MarlinProvider:
    calls = {"n": 0}

    def repack(q, k, n):
        codes = quant.gptq_unpack(q)
        if corrupt:
            codes = codes.clone()
            codes[k - 1, n - 1] = (codes[k - 1, n - 1] + 1) % 16
        return layout.marlin_reference_repack(codes)

    def gemm(a, c, w, s, ws, m, n, k, use_atomic_add, use_fp32_reduce):
        if unwritten and c is not None:
            return c
        codes = layout.marlin_reference_unrepack(w, k, n)
        scales = layout.marlin_unpermute_scales(s, k, n, 32)
        out = (a.float() @ quant.dequantize(codes, scales, 32).float())
        if noise:
            out = out + noise * out.abs().mean() * torch.randn_like(out)
        calls["n"] += 1
        if flaky or (use_atomic_add and atomic_flaky):
            out[0, 0] += 1e-2 * (calls["n"] % 3)  # a different low bit per call, like an unordered reduction
        out = out.half()
        if c is not None:
            c.copy_(out)
            return c
        return out

    return providers.MarlinProvider(
        name="vllm",
        repack=repack,
        gemm=gemm,
        make_workspace=lambda device: torch.zeros(1, dtype=torch.int32),
        info={"vllm": {"source": "emulated"}, "weight_type_id": 1125899907892224},
    )


def run_emulated(provider: providers.MarlinProvider, m_values=(1, 5)):
    table = shapes.parse_shape_table(TABLE_DOC, Path("tiny.toml"))
    tol = config.load_tolerances()
    settings = checks.Settings(
        m_values=m_values,
        seed=0,
        group_size=32,
        tolerances=tol,
        speed=False,
        quick=True,
        l2_bytes=0,
        peak_gb_per_s=None,
        device="cpu",
    )
    software = {"python": "3", "torch": torch.__version__, "cuda": None, "target": {}}
    return runner.execute(provider, table, tol, settings, GPU, software, ENGINES)


def test_emulated_marlin_passes_with_full_report():
    payload, failures = run_emulated(emulated())
    assert failures == [] and payload["verdict"] == "pass"
    report.raise_for_failures(failures)  # no exception
    buffer = io.StringIO()
    emit_json(report.COMMAND, payload, stream=buffer)
    doc = json.loads(buffer.getvalue())
    assert doc["schema"] == 1 and doc["command"] == "verify marlin"
    assert {"verdict", "failures", "gpu", "software", "provider", "shapes", "m", "tolerances", "scope", "results"} <= set(doc)
    assert [r["shape"] for r in doc["results"]] == ["wide", "deep"]
    for shape in doc["results"]:
        assert shape["repack"]["exact"] is True
        assert len(shape["weights"]["qweight_sha256"]) == 64
        assert [c["m"] for c in shape["cases"]] == [1, 5]
        for case in shape["cases"]:
            assert case["status"] == "pass"
            assert case["rel_err_vs_fp16"] is not None and case["rel_err_vs_fp16"] < 5e-3
            assert case["determinism_atomic_off"] == {"runs": 5, "distinct_results": 1, "bitwise_equal": True}
            assert case["determinism_atomic_on"]["bitwise_equal"] is False  # reported, not a failure
        assert shape["overflow"]["nonfinite_outputs"] == 0
        assert shape["overflow"]["max_abs_activation"] == 2080.0
    assert any("fp16 accumulation" in line or "fp16 (vLLM PR #29901)" in line for line in doc["scope"]["does_not_prove"])
    text = report.render_text(payload, ENGINES)
    assert "verdict: pass" in text and "wide" in text and "Emulated GPU" in text


def test_corrupted_repack_is_a_verification_error_at_the_right_k_n():
    payload, failures = run_emulated(emulated(corrupt=True))
    assert payload["verdict"] == "fail"
    assert {kind for kind, _ in failures} >= {"repack"}
    wide = payload["results"][0]
    assert wide["repack"]["exact"] is False
    assert wide["repack"]["first_mismatches_kn"] == [[255, 191]]
    with pytest.raises(VerificationError) as info:
        report.raise_for_failures(failures)
    assert info.value.exit_code == 12 and not isinstance(info.value, DeterminismError)


def test_inaccurate_gemm_fails_accuracy():
    payload, failures = run_emulated(emulated(noise=0.2))
    assert "accuracy" in {kind for kind, _ in failures}
    assert all(c["status"] == "fail" for s in payload["results"] for c in s["cases"])
    with pytest.raises(VerificationError) as info:
        report.raise_for_failures(failures)
    assert info.value.exit_code == 12


def test_noise_between_flag_and_fail_is_flagged_not_failed():
    payload, failures = run_emulated(emulated(noise=0.012))
    statuses = {c["status"] for s in payload["results"] for c in s["cases"]}
    assert "flag" in statuses and "fail" not in statuses
    assert not [f for f in failures if f[0] == "accuracy"]


def test_unwritten_output_cannot_pass():
    payload, failures = run_emulated(emulated(unwritten=True))
    cases = [c for s in payload["results"] for c in s["cases"]]
    assert all(c["status"] == "fail" and c["nonfinite"] > 0 for c in cases)
    assert "accuracy" in {kind for kind, _ in failures}


def test_nondeterminism_alone_is_a_determinism_error():
    payload, failures = run_emulated(emulated(flaky=True))
    assert {kind for kind, _ in failures} == {"determinism"}
    with pytest.raises(DeterminismError) as info:
        report.raise_for_failures(failures)
    assert info.value.exit_code == 13


def test_scope_statement_depends_on_the_gpu():
    proves, does_not = report.scope((7, 5), "Tesla T4", ENGINES)
    assert "Turing's own" in " ".join(proves)
    proves90, does_not90 = report.scope((9, 0), "NVIDIA H200", ENGINES)
    assert any("fp16" in line for line in does_not90) and any("sm_90" in line for line in proves90)


def test_cli_without_gpu_exits_11(capsys, monkeypatch):
    monkeypatch.setattr(runner, "_gpu", lambda torch_module: (_ for _ in ()).throw(NoGpuError("no GPU")))
    assert cli.main(["verify", "marlin", "--quick"]) == 11
    assert "no GPU" in capsys.readouterr().err


def test_cli_without_torch_exits_10(capsys, monkeypatch):
    def no_torch():
        raise MissingDependencyError("verify marlin needs torch")

    monkeypatch.setattr(runner, "_torch", no_torch)
    assert cli.main(["verify", "marlin"]) == 10


def test_cli_bad_m_exits_2():
    assert cli.main(["verify", "marlin", "--m", "0,4"]) == 2
    assert cli.main(["verify", "marlin", "--m", "4,4"]) == 2


def test_cli_pass_and_fail_exit_codes(monkeypatch, capsys):
    outcomes = {"run": (run_emulated(emulated())[0], [])}
    monkeypatch.setattr(runner, "run", lambda request: outcomes["run"])
    assert cli.main(["verify", "marlin", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == 1 and doc["verdict"] == "pass"
    outcomes["run"] = run_emulated(emulated(flaky=True))
    assert cli.main(["verify", "marlin"]) == 13
    out = capsys.readouterr()
    assert "verdict: FAIL" in out.out and "atomic-add off" in out.err
    outcomes["run"] = run_emulated(emulated(corrupt=True))
    assert cli.main(["verify", "marlin", "--json"]) == 12


def test_vllm_provider_missing_is_a_missing_dependency(tmp_path):
    target = resolve_target(None, str(tmp_path))
    with pytest.raises(MissingDependencyError, match="no vllm installation") as info:
        providers.make_provider("vllm", target, {}, (9, 0), ENGINES)
    # aimed at the --site-packages directory, --no-deps (never vLLM's own dependency set)
    assert info.value.exit_code == 10 and f"--target {tmp_path} --no-deps vllm==0.33.0" in str(info.value)
    with pytest.raises(MissingDependencyError, match="found nothing"):
        providers.make_provider("vllm", target, {"vllm_lib": str(tmp_path / "missing.so")}, (9, 0), ENGINES)


def test_sglang_provider_missing_is_a_missing_dependency(tmp_path):
    target = resolve_target(None, str(tmp_path))
    with pytest.raises(MissingDependencyError, match="SGLang 0.5.23") as info:
        providers.make_provider("sglang", target, {}, (7, 5), ENGINES)
    assert info.value.exit_code == 10


@pytest.mark.skipif(torch.cuda.is_available(), reason="the child would run the real checks on this GPU")
def test_cli_python_option_reruns_in_that_interpreter_and_passes_the_exit_code(tmp_path, capsys):
    import sys

    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    assert cli.main(["verify", "marlin", "--python", str(wrapper), "--quick"]) == 11  # NoGpuError in the child
    assert cli.main(["verify", "marlin", "--python", str(tmp_path / "nope")]) == 3  # TargetEnvironmentError


def test_bitwise_equal_counts_nan_payloads_and_signed_zero():
    nan = torch.tensor([float("nan"), 1.0], dtype=torch.float16)
    assert probe.bitwise_equal(nan, nan.clone())  # torch.equal would say False
    assert not probe.bitwise_equal(torch.tensor([0.0]).half(), torch.tensor([-0.0]).half())
    assert not probe.bitwise_equal(torch.ones(2).half(), torch.ones(2).float())
    assert probe.distinct([nan, nan.clone(), nan + 1]) == 2
