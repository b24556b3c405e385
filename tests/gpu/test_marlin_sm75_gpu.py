"""`verify marlin --provider vllm-sm75` on a GPU: vLLM 0.33.0's Marlin as compute_75 PTX, T4 host values.

The point of this provider is that the Turing code path — fp16 accumulation in the mma for fp16 x 4-bit with
groups — is what ran. If anything silently put the fp32-accumulating path in its place (a SASS build for the
GPU itself, a wrong library, the T4 override not compiled in, a future vLLM that stops using fp16
accumulation), the error against the fp16 matmul of the dequantized weights drops to fp32-accumulation level
(the sm_90 build: 1.6e-6 at E2B shapes). This test fails then: at K >= 1536 an error <= 1e-5 is not the Turing
path. The thresholds are written here on purpose, independently of engine-data/vllm/marlin-sm75-emulation.toml, so a
change of the shipped data cannot weaken the test.

Environment:
- ``T4PATCH_VLLM_SDIST``: the vLLM 0.33.0 sdist (or an unpacked tree with the recipe's pinned files); unset,
  ~/.cache/t4patch/sdists/vllm-0.33.0.tar.gz. The library is built once (nvcc, ~1 min on 16 cores) and cached.
- ``T4PATCH_MARLIN_FULL=1``: m = 1, 16, 64, 512 (default 1, 64).
- Skipped when neither the sdist nor nvcc is there, unless ``T4PATCH_VLLM_SDIST`` is set or
  ``T4PATCH_REQUIRE_SM75_BUILD=1``: then a missing sdist, nvcc or torch headers fails (a runner configured for
  this check cannot pass it by skipping).
- ``T4PATCH_MARLIN_JSON_DIR``: also write the JSON report there.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from t4patch.environment.target import resolve_target  # noqa: E402
from t4patch.errors import MissingDependencyError, ToolMissingError  # noqa: E402
from t4patch.output import JSON_SCHEMA  # noqa: E402
from t4patch.verify.marlin import report, runner  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

TURING_MIN_K = 1536
FP32_ACCUMULATION_LEVEL = 1e-5  # issue 14: at or below this at K >= 1536 it was not the Turing path


@pytest.fixture(scope="module")
def sm75_run():
    full = os.environ.get("T4PATCH_MARLIN_FULL") == "1"
    sdist = os.environ.get("T4PATCH_VLLM_SDIST")
    # the provider's --vllm-lib: Request.options (engine-table layout) or Request.vllm_lib (earlier layout)
    names = {f.name for f in dataclasses.fields(runner.Request)}
    where = {"options": {"vllm_lib": sdist}} if "options" in names else {"vllm_lib": sdist}
    request = runner.Request(provider="vllm-sm75", target=resolve_target(None, None), quick=not full, speed=False, **where)
    try:
        payload, failures = runner.run(request)
    except (MissingDependencyError, ToolMissingError) as exc:
        # opt-in: a runner that names the sdist (or asks for the build) must be able to build and run it
        if sdist or os.environ.get("T4PATCH_REQUIRE_SM75_BUILD") == "1":
            pytest.fail(f"vllm-sm75 provider unavailable: {exc}")
        pytest.skip(f"vllm-sm75 provider unavailable: {exc}")
    out_dir = os.environ.get("T4PATCH_MARLIN_JSON_DIR")
    if out_dir:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        doc = {"schema": JSON_SCHEMA, "command": report.COMMAND, **payload}
        (Path(out_dir) / "marlin-vllm-sm75.json").write_text(json.dumps(doc, indent=2, default=str))
    print(report.render_text(payload))
    return payload, failures


def test_the_fp16_accumulating_turing_path_ran(sm75_run):
    payload, _ = sm75_run
    long_k = [(s["shape"], c) for s in payload["results"] if s["k"] >= TURING_MIN_K for c in s.get("cases", [])]
    assert long_k, "no GEMM with K >= 1536 was checked"
    fp32_like = [(name, c["m"], c.get("rel_err_vs_fp16")) for name, c in long_k
                 if c.get("rel_err_vs_fp16") is None or c["rel_err_vs_fp16"] <= FP32_ACCUMULATION_LEVEL]
    assert not fp32_like, f"error vs fp16 at fp32-accumulation level (or missing): not the Turing path: {fp32_like}"
    assert payload["turing_path_guard"]["turing_path"] is True
    assert payload["provider"]["build"]["fatbin_sass"] == []
    assert payload["provider"]["build"]["fatbin_ptx"] == ["compute_75"]
    assert payload["provider"]["emulation"]["capability"] == "7.5"


def test_channelwise_control_shows_fp32_accumulation(sm75_run):
    # Same build, group -1: Turing Marlin accumulates in fp32 there by design (and applies the scale at the end,
    # so it is compared with its exact-order reference). If the grouped cases and the channel-wise cases had the
    # same error, the error level would not be measuring the accumulation.
    payload, _ = sm75_run
    control = [c["rel_err_vs_exact_order"] for r in payload["control_channelwise"]["results"] if r["k"] >= TURING_MIN_K
               for c in r.get("cases", [])]
    grouped = [c["rel_err_vs_fp16"] for s in payload["results"] if s["k"] >= TURING_MIN_K for c in s["cases"]]
    assert control and grouped
    assert max(control) * 10 < min(grouped), (control, grouped)


def test_every_check_passes_on_all_shapes(sm75_run):
    payload, failures = sm75_run
    assert failures == [], "\n".join(f"[{kind}] {message}" for kind, message in failures)
    assert len(payload["results"]) == 11
    for shape in payload["results"]:
        assert shape["repack"]["exact"], shape["shape"]
        assert shape["overflow"]["nonfinite_outputs"] == 0 or not shape["overflow"]["ref_fits_fp16"], shape["shape"]
        for case in shape["cases"]:
            assert case["rel_err_vs_fp16"] <= payload["tolerances"]["accuracy"]["fail_above"]
            assert case["determinism_atomic_off"]["bitwise_equal"]
    awq = payload["awq"]["results"]
    assert len(awq) == 11
    for shape in awq:
        assert shape["repack"]["exact"], shape["shape"]
        for case in shape["cases"]:
            assert case["status"] in ("pass", "flag")
            assert case["determinism_atomic_off"]["bitwise_equal"]
