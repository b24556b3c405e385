"""The patched SGLang 0.5.23 Triton attention, with the tiles a T4 gets, against a torch reference on a real GPU.

Runs ``python -m tools.research.attention_gpu_sglang`` in a subprocess (it installs an import hook for the
``sglang`` package and must not share a process with tests that import a real SGLang) and checks its JSON:
every case within 2e-3 max abs error, and the launchers picked the T4 tiles (7.5 / 65,536 B) and SGLang's
stock Hopper tiles (9.0). Skipped without a CUDA GPU. Where the patched kernels come from:

- ``T4PATCH_SGLANG_ATTN_DIR``: a directory holding ``sglang/kernels/ops/attention/{extend_attention,
  decode_attention,score_mod}.py`` and ``sglang/srt/environ.py`` of SGLang 0.5.23 patched by t4patch (a
  whole patched site-packages also works);
- else ``T4PATCH_SGLANG_SITE`` (as for the Marlin GPU test): a site-packages with patched SGLang 0.5.23;
- else the released wheel (tests/wheels.py: cache or `pip download`), installed to a temp dir and patched.
  Without network and cache this skips, or fails under ``T4PATCH_REQUIRE_GPU_PROVIDERS=1``.

About 30 s on an H200 with a cold Triton cache (12 s warm).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

# (layer head size, phase) -> the T4 tiles the patched launchers must pick, and SGLang's stock sm_90 ones.
EXPECTED = {
    (256, "extend"): {"sm75-patched": (32, 32), "stock-sm90-tiles": (64, 64)},
    (512, "extend"): {"sm75-patched": (16, 16), "stock-sm90-tiles": (32, 64)},
    (256, "decode"): {"sm75-patched": (None, 32), "stock-sm90-tiles": (None, 32)},
    (512, "decode"): {"sm75-patched": (None, 16), "stock-sm90-tiles": (None, 32)},
}
FIRST_KERNEL = {"extend": "_fwd_kernel", "decode": "_fwd_grouped_kernel_stage1"}


def _unavailable(reason: str) -> None:
    if os.environ.get("T4PATCH_REQUIRE_GPU_PROVIDERS") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def sglang_dir(tmp_path_factory) -> Path:
    for var in ("T4PATCH_SGLANG_ATTN_DIR", "T4PATCH_SGLANG_SITE"):
        if os.environ.get(var):
            return Path(os.environ[var])
    try:
        from t4patch.cli import main
        from tests.helpers import install_wheel_to, wheel_path

        site = install_wheel_to(tmp_path_factory.mktemp("sglang-attn"), wheel_path("sglang", "0.5.23"))
    except Exception as exc:  # noqa: BLE001 - no wheel (no network, no cache): nothing to test
        _unavailable(f"SGLang 0.5.23 wheel unavailable: {exc}")
    assert main(["apply", "sglang==0.5.23", "--site-packages", str(site)]) == 0
    return site


@pytest.fixture(scope="module")
def result(sglang_dir, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("sglang-attn-out") / "result.json"
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, "-m", "tools.research.attention_gpu_sglang", "--sglang-dir", str(sglang_dir),
         "--out", str(out)],
        capture_output=True, text=True, env=env, timeout=900,
    )
    print(proc.stdout[-6000:], proc.stderr[-6000:])
    assert out.exists(), f"harness wrote no result (exit {proc.returncode})"
    doc = json.loads(out.read_text())
    assert "numerics_error" not in doc, doc["numerics_error"]
    return doc


def test_every_case_within_bound(result):
    rows = result["numerics"]
    assert len(rows) == 6  # 2 layers x (extend, decode-small, decode-large)
    for row in rows:
        for label in ("sm75-patched", "stock-sm90-tiles"):
            assert row[label]["finite"], (row["layer"], row["case"], label)
            assert row[label]["max_abs_err"] <= result["bound"], (row["layer"], row["case"], label, row[label])
    assert result["all_ok"] is True


def test_launchers_picked_t4_and_stock_tiles(result):
    for row in result["numerics"]:
        want = EXPECTED[(row["head"], row["phase"])]
        for label, tiles in want.items():
            first = [l for l in row[label]["launches"] if l["kernel"] == FIRST_KERNEL[row["phase"]]]
            assert first, (row["layer"], row["case"], label, "no launch recorded")
            got = {(l["BLOCK_M"], l["BLOCK_N"]) for l in first}
            assert got == {tiles}, (row["layer"], row["case"], label, got)
            if label == "sm75-patched":
                # what compiles here is the sm_90 build of the T4 tiles; a T4 allows 65,536 B
                assert all(l["shared"] <= 65536 for l in row[label]["launches"]), row[label]["launches"]
