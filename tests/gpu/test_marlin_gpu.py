"""`verify marlin` as a pytest entry for GPU runners: the same checks as the CLI, one test per provider.

Skipped without a CUDA GPU. Where the engines come from (environment variables, so a CI job sets them once):

- ``T4PATCH_VLLM_LIB``: vLLM 0.33.0's ``vllm/_C_stable_libtorch.abi3.so`` (or ``.so.xz``) to load directly;
  unset, vLLM must be installed in this interpreter (``pip install --no-deps vllm==0.33.0``).
- ``T4PATCH_SGLANG_SITE``: a site-packages dir holding SGLang 0.5.23 patched by t4patch; unset, this
  interpreter's SGLang is used.
- ``T4PATCH_MARLIN_FULL=1``: m = 1, 16, 64, 512 and full timing (default: --quick, m = 1, 64).
- ``T4PATCH_REQUIRE_GPU_PROVIDERS=1``: a missing engine fails the test instead of skipping it (set this on a
  runner that is supposed to have both, so a broken install cannot pass as "skipped").
- ``T4PATCH_MARLIN_JSON_DIR``: also write each provider's JSON report there (CI artifact).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from t4patch.environment.target import resolve_target  # noqa: E402
from t4patch.errors import MissingDependencyError, NotAppliedError  # noqa: E402
from t4patch.output import JSON_SCHEMA  # noqa: E402
from t4patch.verify.marlin import report, runner  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _request(provider: str) -> runner.Request:
    site = os.environ.get("T4PATCH_SGLANG_SITE") if provider == "sglang" else None
    full = os.environ.get("T4PATCH_MARLIN_FULL") == "1"
    return runner.Request(
        provider=provider,
        target=resolve_target(None, site),
        quick=not full,
        options={"vllm_lib": os.environ.get("T4PATCH_VLLM_LIB")},
    )


def _run(provider: str) -> tuple[dict, list]:
    try:
        payload, failures = runner.run(_request(provider))
    except (MissingDependencyError, NotAppliedError) as exc:
        if os.environ.get("T4PATCH_REQUIRE_GPU_PROVIDERS") == "1":
            pytest.fail(f"{provider} provider unavailable: {exc}")
        pytest.skip(f"{provider} provider unavailable: {exc}")
    out_dir = os.environ.get("T4PATCH_MARLIN_JSON_DIR")
    if out_dir:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        doc = {"schema": JSON_SCHEMA, "command": report.COMMAND, **payload}
        (Path(out_dir) / f"marlin-{provider}.json").write_text(json.dumps(doc, indent=2, default=str))
    print(report.render_text(payload))
    return payload, failures


def _assert_checks(payload: dict, failures: list) -> None:
    assert failures == [], "\n".join(f"[{kind}] {message}" for kind, message in failures)
    assert payload["verdict"] == "pass"
    shapes = payload["results"]
    assert len(shapes) == 11  # every Gemma 4 E2B linear
    for shape in shapes:
        assert shape["repack"]["exact"], shape["shape"]
        assert shape["overflow"]["nonfinite_outputs"] == 0, shape["shape"]
        for case in shape["cases"]:
            where = f"{shape['shape']} m={case['m']}"
            assert case["status"] in ("pass", "flag"), where
            assert case["rel_err_vs_fp16"] <= payload["tolerances"]["accuracy"]["fail_above"], where
            assert case["determinism_atomic_off"]["bitwise_equal"], where


def test_vllm_marlin_on_gpu():
    payload, failures = _run("vllm")
    _assert_checks(payload, failures)


def test_sglang_redirect_on_gpu():
    payload, failures = _run("sglang")
    _assert_checks(payload, failures)
    assert payload["act_order"]["repack"]["refused"] and payload["act_order"]["gemm"]["refused"]
    assert "desc_act" in payload["act_order"]["gemm"]["error"]
    for shape in payload["results"]:
        for case in shape["cases"]:
            assert case["redirect_bitwise_equal_to_vllm"] is True, f"{shape['shape']} m={case['m']}"
    if payload["switch_off_probe"]:
        assert payload["switch_off_probe"]["stock_path_taken"]
