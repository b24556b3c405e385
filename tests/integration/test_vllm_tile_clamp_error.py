"""vLLM 0.33.0's patched Triton attention refuses clearly when even the smallest KV tile cannot fit.

With more than 16 query heads per KV head, BLOCK_M becomes 32, and at head 512 the FMA-path formula
4 * 512 * (32 + 16) = 98,304 B exceeds a T4's 65,536 B at tile 16, the clamp's floor. The patched launcher
must raise its own error naming head size, BLOCK_M, tile and limit (not leave Triton's OutOfResources for the
first launch). Proven with `verify attention` on the real wheel and a copy of the shipped case table with 32
query heads; head 256 still fits at that BLOCK_M.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from t4patch.cli import main
from t4patch.data.locations import data_dir
from t4patch.environment.target import resolve_target
from t4patch.verify.attention.cases import load_archs, load_cases
from t4patch.verify.attention.runner import verify_attention
from tests.helpers import install_wheel_to, wheel_path

pytestmark = pytest.mark.integration

pytest.importorskip("torch", reason="verify attention needs torch (CPU build is enough)")
triton = pytest.importorskip("triton", reason="verify attention needs triton 3.8")
if ".".join(triton.__version__.split(".")[:2]) != "3.8":
    pytest.skip(f"triton {triton.__version__} here; vLLM 0.33.0 pins 3.8.x", allow_module_level=True)

REGEX_VERSION = "2026.11.19"


def test_head_512_with_32_query_heads_per_kv_head_raises_a_clear_error(tmp_path: Path):
    site = install_wheel_to(tmp_path / "vllm", wheel_path("vllm", "0.33.0"))
    if importlib.util.find_spec("regex") is None:
        install_wheel_to(site, wheel_path("regex", REGEX_VERSION))
    assert main(["apply", "vllm==0.33.0", "--site-packages", str(site)]) == 0
    text = (data_dir("verify") / "attention-cases.toml").read_text(encoding="utf-8")
    assert "num_query_heads = 8\n" in text
    table_path = tmp_path / "attention-cases.toml"
    table_path.write_text(text.replace("num_query_heads = 8\n", "num_query_heads = 32\n"), encoding="utf-8")
    report = verify_attention(
        ["vllm"], load_archs()["sm_75"], resolve_target(site_packages=str(site)), site_packages=str(site),
        table=load_cases(table_path),
    )
    [engine] = report.engines
    full = [c for c in engine.cases if c.layer == "full"]
    sliding = [c for c in engine.cases if c.layer == "sliding"]
    assert full and all(c.problems for c in full)
    message = " ".join(p for c in full for p in c.problems)
    assert "t4patch: Triton unified attention needs 98304 B" in message
    assert "head size 512" in message and "BLOCK_M 32" in message and "65536 B per block" in message
    assert "OutOfResources" not in message
    assert sliding and all(not c.problems for c in sliding)  # 4 * 256 * (32 + 16) = 49,152 B fits
