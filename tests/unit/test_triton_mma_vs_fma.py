"""The benchmark's T4 model and its CPU-only mode (tools/bench/triton_mma_vs_fma.py): each path priced with its
own tiles, the work the MMA layout repeats across warps charged, the paths checked, the table printed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.bench.triton_mma_vs_fma import attention_launches, attention_work, main, model_case, t4_model, tiles


def _launch(mma: int, fma: int, dot_flops: int, warps: int = 4, **constexprs: int) -> dict:
    return {"kernel": "vllm.kernel_unified_attention", "warmup": False, "grid": [1, 1, 1], "num_warps": warps,
            "shared": 0, "mma_m16n8k8_f16": mma, "fma_rn_f32": fma, "dot_flops": dot_flops, "mma_warps": None,
            "args": [{"name": k, "role": "constexpr", "value": v} for k, v in constexprs.items()]
            + [{"name": "q", "role": "param", "aligned16": True}]}


def test_attention_work_counts_causal_and_windowed_pairs():
    flops, bytes_ = attention_work({"engine": "vllm", "head": 4, "window": 0, "seqs": [(2, 3)]})
    assert flops == 4 * 4 * 8 * (2 + 3)  # positions 1 and 2 see 2 and 3 keys
    windowed, _ = attention_work({"engine": "vllm", "head": 4, "window": 2, "seqs": [(2, 3)]})
    assert windowed == 4 * 4 * 8 * (2 + 2)
    sglang, _ = attention_work({"engine": "sglang", "head": 4, "window": 1, "seqs": [(2, 3)]})
    assert sglang == windowed  # SGLang's window counts the distance: p - k <= 1 is 2 keys
    assert bytes_ == 2 * 4 * (2 * 2 * 8 + 2 * 3)


def test_t4_model_prices_mma_at_65_and_fma_at_8_1_tflops_per_useful_flop():
    body = 4 * 64 * 2048  # one pass: 4 warps x 64 m16n8k8 = 4 warps x 2,048 warp fma of the same FLOPs
    flops = 1e12
    fast, slow = t4_model(_launch(64, 0, body), flops, 0.0), t4_model(_launch(0, 2048, body), flops, 0.0)
    assert fast["compute_s"] == pytest.approx(flops / 65e12)
    assert slow["compute_s"] == pytest.approx(flops / 8.1e12)
    assert fast["issued_per_dot_flop"] == pytest.approx(1.0) and fast["bound"] == "compute"
    memory = t4_model(_launch(64, 0, body), flops, 320e9)
    assert memory["modeled_s"] == pytest.approx(1.0) and memory["bound"] == "memory"  # 1 s of DRAM


def test_t4_model_charges_work_repeated_across_warps_and_each_paths_own_tiles():
    flops = 1e12
    # the same pass with 8 warps where each issues as much as one of 4 warps: twice the tensor work per useful FLOP
    repeated = t4_model(_launch(64, 0, 4 * 64 * 2048, warps=8), flops, 0.0)
    assert repeated["issued_per_dot_flop"] == pytest.approx(2.0)
    assert repeated["compute_s"] == pytest.approx(2 * flops / 65e12)
    # a tile of twice the dot work per pass needs half the passes: same time for the same work per FLOP
    small, large = t4_model(_launch(0, 2048, 4 * 2048 * 64), flops, 0.0), t4_model(
        _launch(0, 4096, 4 * 4096 * 64), flops, 0.0)
    assert large["passes"] == pytest.approx(small["passes"] / 2)
    assert large["compute_s"] == pytest.approx(small["compute_s"])
    with pytest.raises(ValueError, match="dot_flops"):
        t4_model(_launch(64, 0, 0), flops, 0.0)


def test_tiles_are_the_tile_constexprs_and_the_warps():
    launch = _launch(64, 6, 1, BLOCK_M=16, TILE_SIZE=32, HEAD_SIZE=256, BLOCK_Q=2)
    assert tiles(launch) == {"BLOCK_M": 16, "TILE_SIZE": 32, "BLOCK_Q": 2, "num_warps": 4}


def _case(mode: str, *launches: dict) -> dict:
    return {"id": "vllm/full/prefill", "engine": "vllm", "head": 4, "window": 0, "seqs": [(2, 3)],
            "mode": mode, "launches": list(launches)}


def test_the_attention_launches_skip_warmups_and_dotless_kernels_and_check_the_path():
    probe = {**_launch(128, 6, 99), "warmup": True}
    reduce = {**_launch(0, 17, 0), "kernel": "vllm.reduce_segments"}
    kept = _launch(96, 6, 1 << 20)
    assert attention_launches(_case("mma", probe, kept, reduce), "mma") == [kept]
    with pytest.raises(ValueError, match="T4PATCH_TRITON_MMA=0"):
        attention_launches(_case("fma", kept), "fma")  # an MMA kernel in the FMA bundle
    with pytest.raises(ValueError, match="T4PATCH_TRITON_MMA=1"):
        attention_launches(_case("mma", _launch(0, 2048, 1 << 20)), "mma")
    with pytest.raises(ValueError, match="no launched kernel"):
        attention_launches(_case("mma", probe, reduce), "mma")


def test_model_case_prices_each_path_with_its_own_tiles():
    fma = _launch(0, 2048, 4 * 2048 * 64, TILE_SIZE=16)
    mma = _launch(96, 6, 2 * 4 * 64 * 2048, TILE_SIZE=32)  # twice the tile, 1.5x the dot work issued per pass
    row = model_case(_case("fma", fma), _case("mma", mma))
    assert row["fma"]["launches"][0]["tiles"]["TILE_SIZE"] == 16
    assert row["mma"]["launches"][0]["tiles"]["TILE_SIZE"] == 32
    flops = row["useful_flops"]
    expect_fma = flops / 8.1e12
    expect_mma = flops / (2 * 4 * 64 * 2048) * 4 * (96 * 2048 / 65e12 + 6 * 64 / 8.1e12)
    assert row["fma"]["modeled_s"] == pytest.approx(max(expect_fma, row["unique_bytes"] / 320e9))
    assert row["mma"]["modeled_s"] == pytest.approx(max(expect_mma, row["unique_bytes"] / 320e9))
    assert row["modeled_ratio"] == pytest.approx(row["fma"]["modeled_s"] / row["mma"]["modeled_s"])
    with pytest.raises(ValueError, match="different cases"):
        model_case({**_case("fma", fma), "id": "other"}, _case("mma", mma))


def test_model_only_reads_the_two_captures_and_prints_the_labelled_table(tmp_path: Path, capsys):
    big = [(700, 1500)]
    for mode, launch in (("fma", _launch(0, 2052, 524288, TILE_SIZE=16)),
                         ("mma", _launch(96, 6, 524288, TILE_SIZE=16))):
        (tmp_path / mode).mkdir()
        (tmp_path / mode / "records.json").write_text(json.dumps([{**_case(mode, launch), "head": 512,
                                                                     "seqs": big}]))
    out = tmp_path / "model.json"
    assert main(["--model-only", "--bundle", str(tmp_path), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "T4 model from instruction counts, not a measurement" in printed
    row = json.loads(out.read_text())["rows"][0]
    # same tiles: the ratio is the static cost per warp, FMA over MMA (the MMA pass issues 1.5x its dot work)
    assert row["modeled_ratio"] == pytest.approx((2052 * 64 / 8.1e12) / (96 * 2048 / 65e12 + 6 * 64 / 8.1e12))
    assert f"{row['modeled_ratio']:7.2f}x" in printed
    (tmp_path / "fma" / "records.json").unlink()
    assert main(["--model-only", "--bundle", str(tmp_path)]) == 2
    assert "T4PATCH_TRITON_MMA=0" in capsys.readouterr().err
