"""vLLM 0.33.0's patched Triton attention refuses clearly when even the smallest KV tile cannot fit.

With more than 16 query heads per KV head, BLOCK_M becomes 32, and at head 512 the FMA-path formula
4 * 512 * (32 + 16) = 98,304 B exceeds a T4's 65,536 B at tile 16, the clamp's floor. The patched launcher
must raise its own error naming head size, BLOCK_M, tile and limit (not leave Triton's OutOfResources for the
first launch). Proven with `verify attention` on the real wheel and a copy of the shipped case table with 32
query heads; head 256 still fits at that BLOCK_M.

The INT4 per-token-head KV cache launcher (``_launch_packed_attn``, diff 0002) is proven the same way, on an
sm_75 stand-in: at 32 query heads per KV head its ``_attn_packed`` needs 69,632 B at head 256 with TILE 32
(stock misfits; the patch halves the tile to 16: 51,200 B) and 131,072 B at head 512 even at TILE 16, where
the patched launcher itself raises the clear RuntimeError (the table copy drops ``accepted_refusal``, so the
raise shows as the case's compile error rather than as a REFUSED verdict).

With t4patch's Triton set (issue 21.3) the same BLOCK_M 32 at head 512 fits on tensor cores: the patched
launcher compiles first and keeps the tile the compiler says fits (TILE 16: 65,536 B, exactly a T4's limit)
instead of raising; the Triton wheel is installed into a directory, patched with ``t4patch apply
triton==3.8.0`` and imported by the compile worker from there (``PYTHONPATH``).
"""

from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path

import pytest

from t4patch.cli import main
from t4patch.commands.engine_table import ENGINES
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


@pytest.fixture(scope="module")
def sites(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("tile-clamp-error")
    stock = install_wheel_to(base / "stock", wheel_path("vllm", "0.33.0"))
    if importlib.util.find_spec("regex") is None:
        install_wheel_to(stock, wheel_path("regex", REGEX_VERSION))
    patched = Path(shutil.copytree(stock, base / "patched"))
    assert main(["apply", "vllm==0.33.0", "--site-packages", str(patched)]) == 0
    return {"stock": stock, "patched": patched}


def _table_32_heads(tmp_path: Path, keep_refusals: bool = True):
    text = (data_dir("cases") / "attention-cases.toml").read_text(encoding="utf-8")
    assert "num_query_heads = 8\n" in text and "accepted_refusal = " in text
    text = text.replace("num_query_heads = 8\n", "num_query_heads = 32\n")
    if not keep_refusals:
        text = re.sub(r"(?m)^accepted_refusal = .*\n", "", text)
    path = tmp_path / "attention-cases.toml"
    path.write_text(text, encoding="utf-8")
    return load_cases(path, drivers=ENGINES.attention_drivers())


def _verify(site: Path, table):
    report = verify_attention(
        ["vllm"], load_archs()["sm_75"], resolve_target(site_packages=str(site)), site_packages=str(site), table=table
    )
    [engine] = report.engines
    return engine


def test_head_512_with_32_query_heads_per_kv_head_raises_a_clear_error(tmp_path: Path, sites):
    engine = _verify(sites["patched"], _table_32_heads(tmp_path))
    core = [c for c in engine.cases if not c.case.startswith("int4-")]
    full = [c for c in core if c.layer == "full"]
    sliding = [c for c in core if c.layer == "sliding"]
    assert full and all(c.problems for c in full)
    message = " ".join(p for c in full for p in c.problems)
    assert "t4patch: Triton unified attention needs 98304 B" in message
    assert "head size 512" in message and "BLOCK_M 32" in message and "65536 B per block" in message
    assert "OutOfResources" not in message
    assert sliding and all(not c.problems for c in sliding)  # 4 * 256 * (32 + 16) = 49,152 B fits


def _packed(case) -> tuple[int, int]:
    (kernel,) = [k for k in case.kernels if k.kernel == "_attn_packed"]
    return kernel.tiles["TILE_SIZE"], kernel.shared_bytes


def test_int4_launcher_clamps_head_256_and_raises_for_head_512_on_an_sm75_standin(tmp_path: Path, sites):
    table = _table_32_heads(tmp_path, keep_refusals=False)
    stock = {(c.layer, c.case): c for c in _verify(sites["stock"], table).cases if c.case.startswith("int4-")}
    patched = {(c.layer, c.case): c for c in _verify(sites["patched"], table).cases if c.case.startswith("int4-")}
    # head 256, BLOCK_M 32: stock's TILE 32 misfits; the patched launcher halves it to 16 and fits
    for case in ("int4-prefill", "int4-decode-large"):
        assert _packed(stock[("sliding", case)]) == (32, 69632) and stock[("sliding", case)].problems
        assert _packed(patched[("sliding", case)]) == (16, 51200) and not patched[("sliding", case)].problems
    assert _packed(stock[("sliding", "int4-decode-small")]) == _packed(patched[("sliding", "int4-decode-small")])
    # head 512: no tile fits; stock would hit Triton's OutOfResources, the patched launcher raises first
    for case in ("int4-prefill", "int4-decode-small", "int4-decode-large"):
        assert not stock[("full", case)].error and stock[("full", case)].problems
        c = patched[("full", case)]
        assert not c.kernels and not c.refused  # launched nothing; refusal not accepted by this table copy
        assert c.error and c.error.startswith(
            "RuntimeError: t4patch: the INT4 per-token-head KV cache attention kernel (_attn_packed) needs 131072 B"
        ), c.error
        for part in ("head size 512", "smallest KV tile 16", "BLOCK_M 32", "allows 65536 B per block",
                     "--kv-cache-dtype auto (or float16)"):
            assert part in c.error, (part, c.error)
        assert "OutOfResources" not in c.error


@pytest.fixture(scope="module")
def patched_triton(tmp_path_factory) -> Path:
    site = install_wheel_to(tmp_path_factory.mktemp("triton-3.8.0"), wheel_path("triton", "3.8.0"))
    assert main(["apply", "triton==3.8.0", "--site-packages", str(site)]) == 0
    return site


def test_with_the_triton_set_head_512_at_block_m_32_fits_and_runs_on_tensor_cores(
    tmp_path: Path, sites, patched_triton: Path, monkeypatch
):
    """It runs instead of raising; verify still names what it costs: the 2D kernel spills at 255 registers."""
    monkeypatch.setenv("PYTHONPATH", str(patched_triton))
    engine = _verify(sites["patched"], _table_32_heads(tmp_path))
    assert engine.compiler["t4patch_set"] == "applied"
    core = {(c.layer, c.case): c for c in engine.cases if not c.case.startswith("int4-")}
    for (layer, case), c in core.items():
        assert not c.error, (layer, case, c.error)  # the patched launcher no longer raises
        (kernel,) = [k for k in c.kernels if k.kernel == "kernel_unified_attention"]
        assert kernel.tiles["BLOCK_M"] == 32 and kernel.dot_path == "mma" and kernel.fits, (layer, case)
        if layer == "full":
            assert (kernel.tiles["TILE_SIZE"], kernel.shared_bytes) == (16, 65536), case
            # the same launch with the set switched off is the FMA path, which the launcher refuses clearly
            assert c.stock is not None and c.stock.error and "needs 98304 B" in c.stock.error
        else:
            assert kernel.spills == 0 and c.ok, (case, c.problems)
    # measured (Triton 3.8.0 for sm_75): the 3D kernel fits without spilling; the 2D one spills 10 words per
    # thread at 255 registers, which verify attention reports as a failure of the patched compile (exit 12)
    assert core[("full", "decode-small")].ok
    for case in ("prefill", "decode-large"):
        assert core[("full", case)].problems == (
            "kernel_unified_attention spills 10 words per thread on the patched compile (255 registers)",)
