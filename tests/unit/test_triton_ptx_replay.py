"""The pure parts of the Triton MMA proof tools: PTX counting and parameter parsing, kernel-parameter packing,
and the TTGIR's dot work (tools/research/triton_ptx_replay.py; the benchmark's T4 model is in
test_triton_mma_vs_fma.py)."""

from __future__ import annotations

import struct

import pytest

from tools.research.triton_ptx_replay import _pack, ptx_counts, ptx_params, ttgir_dots

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


TTGIR = """
#mma = #ttg.nvidia_mma<{versionMajor = 2, versionMinor = 1, warpsPerCTA = [1, 8], instrShape = [16, 8]}>
      %qk = tt.dot %q, %k, %c, inputPrecision = tf32 : tensor<32x512xf16, #ttg.dot_op<{opIdx = 0, parent = #mma, kWidth = 2}>> * tensor<512x16xf16, #ttg.dot_op<{opIdx = 1, parent = #mma, kWidth = 2}>> -> tensor<32x16xf32, #mma> loc(#loc1)
      %pv = tt.dot %p, %v, %a, inputPrecision = tf32 : tensor<32x16xf16, #ttg.dot_op<{opIdx = 0, parent = #mma, kWidth = 2}>> * tensor<16x512xf16, #ttg.dot_op<{opIdx = 1, parent = #mma, kWidth = 2}>> -> tensor<32x512xf32, #mma> loc(#loc2)
      %b = tt.dot %x, %y, %z : tensor<2x16x32xf32, #ttg.dot_op<{opIdx = 0, parent = #blocked}>> * tensor<2x32x8xf32, #ttg.dot_op<{opIdx = 1, parent = #blocked}>> -> tensor<2x16x8xf32, #blocked> loc(#loc3)
      %s = tt.reduce %qk : tensor<32x16xf32, #mma> loc(#loc4)
"""


def test_ttgir_dot_work_sums_2mnk_over_every_dot_and_reads_the_mma_warps():
    found = ttgir_dots(TTGIR)
    assert found["dots"] == 3
    assert found["dot_flops"] == 2 * 32 * 16 * 512 + 2 * 32 * 512 * 16 + 2 * (2 * 16 * 8) * 32
    assert found["mma_warps"] == [1, 8]
    assert ttgir_dots("tt.func @f() { tt.return }") == {"dot_flops": 0, "dots": 0, "mma_warps": None}
