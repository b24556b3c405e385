"""The pure parts of the Triton MMA proof tools: PTX counting and parameter parsing, kernel-parameter packing,
and the benchmark's T4 model (tools/research/triton_ptx_replay.py, tools/bench/triton_mma_vs_fma.py)."""

from __future__ import annotations

import struct

import pytest

from tools.bench.triton_mma_vs_fma import attention_work, t4_model
from tools.research.triton_ptx_replay import _pack, ptx_counts, ptx_params

PTX = """
.version 8.7
.target sm_75
.visible .entry gemm(
	.param .u64 .ptr .global .align 1 gemm_param_0,
	.param .u32 gemm_param_1,
	.param .f32 gemm_param_2,
	.param .u64 .ptr .global .align 1 gemm_param_3
)
{
	mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%f1, %f2, %f3, %f4}, {%r1, %r2}, {%r3}, {%f5, %f6, %f7, %f8};
	mma.sync.aligned.m16n8k8.row.col.f16.f16.f16.f16 {%r9, %r10}, {%r1, %r2}, {%r3}, {%r11, %r12};
	mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%f1, %f2, %f3, %f4}, {%r1, %r2, %r3, %r4}, {%r5, %r6}, {%f5, %f6, %f7, %f8};
	fma.rn.f32 %f9, %f1, %f2, %f3;
}
"""


def test_counts_tell_turing_fp16_mma_from_tf32_and_fma():
    counts = ptx_counts(PTX)
    assert counts == {"mma_sync": 3, "mma_m16n8k8_f16": 2, "fma_rn_f32": 1, "cp_async": 0}


def test_entry_parameters_in_order():
    assert ptx_params(PTX) == ("gemm", ["u64", "u32", "f32", "u64"])
    with pytest.raises(ValueError, match="no .entry"):
        ptx_params(".version 8.7\n")


def test_parameters_are_packed_as_the_ptx_type_says():
    assert _pack("u64", "u64", 0x1234).raw == (0x1234).to_bytes(8, "little")
    assert _pack("u32", "i32", -2).raw == struct.pack("<i", -2)
    assert _pack("f32", "fp32", 0.5).raw == struct.pack("<f", 0.5)
    assert _pack("b16", "fp16", 1.0).raw == struct.pack("<e", 1.0)
    with pytest.raises(ValueError, match="bf16"):
        _pack("b16", "bf16", 1.0)


def test_attention_work_counts_causal_and_windowed_pairs():
    flops, bytes_ = attention_work({"engine": "vllm", "head": 4, "window": 0, "seqs": [(2, 3)]})
    assert flops == 4 * 4 * 8 * (2 + 3)  # positions 1 and 2 see 2 and 3 keys
    windowed, _ = attention_work({"engine": "vllm", "head": 4, "window": 2, "seqs": [(2, 3)]})
    assert windowed == 4 * 4 * 8 * (2 + 2)
    sglang, _ = attention_work({"engine": "sglang", "head": 4, "window": 1, "seqs": [(2, 3)]})
    assert sglang == windowed  # SGLang's window counts the distance: p - k <= 1 is 2 keys
    assert bytes_ == 2 * 4 * (2 * 2 * 8 + 2 * 3)


def test_t4_model_prices_mma_at_65_and_fma_at_8_1_tflops():
    mma = {"mma_m16n8k8_f16": 64, "fma_rn_f32": 0}
    fma = {"mma_m16n8k8_f16": 0, "fma_rn_f32": 2048}  # the same FLOPs per warp-iteration: 64 * 2048 = 2048 * 64
    flops = 1e12
    fast, slow = t4_model(mma, mma, flops, 0.0), t4_model(fma, mma, flops, 0.0)
    assert fast["compute_s"] == pytest.approx(flops / 65e12)
    assert slow["compute_s"] == pytest.approx(flops / 8.1e12)
    assert t4_model(mma, mma, flops, 320e9)["modeled_s"] == pytest.approx(1.0)  # memory bound: 1 s of DRAM
