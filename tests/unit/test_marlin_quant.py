"""GPTQ packing, Q4_0-grid quantization and dequantization: t4patch's own reference code, on the CPU."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from t4patch.verify.marlin import metrics, quant  # noqa: E402
from t4patch.verify.marlin.scalar_type import UINT4B8, scalar_type_id  # noqa: E402


def test_gptq_pack_puts_row_8r_plus_i_at_nibble_i():
    codes = torch.arange(8, dtype=torch.int32).reshape(8, 1).repeat(1, 2)
    codes[7, 1] = 15
    packed = quant.gptq_pack(codes)
    assert packed.dtype == torch.int32 and tuple(packed.shape) == (1, 2)
    assert packed[0, 0].item() == 0x76543210
    assert packed[0, 1].item() == 0xF6543210 - (1 << 32)  # top nibble set: negative as int32


def test_pack_unpack_round_trip():
    g = torch.Generator().manual_seed(11)
    codes = torch.randint(0, 16, (1024, 192), generator=g, dtype=torch.int32)
    packed = quant.gptq_pack(codes)
    assert tuple(packed.shape) == (128, 192)
    assert torch.equal(quant.gptq_unpack(packed), codes)


@pytest.mark.parametrize("bad", [torch.full((8, 4), 16, dtype=torch.int32), torch.full((8, 4), -1, dtype=torch.int32)])
def test_pack_rejects_codes_outside_uint4(bad):
    with pytest.raises(ValueError):
        quant.gptq_pack(bad)


def test_pack_rejects_k_not_multiple_of_8():
    with pytest.raises(ValueError):
        quant.gptq_pack(torch.zeros(12, 4, dtype=torch.int32))


def test_q4_0_grid_properties():
    g = torch.Generator().manual_seed(5)
    w = torch.randn(256, 64, generator=g) * 0.02
    codes, scales = quant.q4_0_quantize(w, 32)
    assert codes.dtype == torch.int32 and scales.dtype == torch.float16
    assert tuple(scales.shape) == (8, 64)
    assert int(codes.min()) >= 0 and int(codes.max()) <= 15
    deq = quant.dequantize(codes, scales, 32).float()
    # Q4_0: the group's largest-magnitude value is stored as code 0 (value -8 * d) and reproduced up to fp16
    grouped = w.reshape(8, 32, 64)
    idx = grouped.abs().argmax(dim=1)
    picked_codes = codes.reshape(8, 32, 64).gather(1, idx.unsqueeze(1)).squeeze(1)
    assert bool((picked_codes == 0).all())
    # every value is within half a step of the grid (plus the fp16 rounding of the dequantized value, <= 8 steps x 2^-11), except Q4_0's clip:
    # a value of the opposite sign near the group's extreme would need code 16 and is stored as 15
    step = scales.float().abs().repeat_interleave(32, dim=0)
    error = (deq - w).abs()
    clipped = codes == 15
    assert bool((error[~clipped] <= step[~clipped] * 0.5 + 5e-3 * step[~clipped] + 1e-7).all())
    assert bool((error[clipped] <= step[clipped] * 1.0 + 5e-3 * step[clipped] + 1e-7).all())


def test_q4_0_all_zero_group_is_code_8_scale_0():
    w = torch.zeros(64, 64)
    w[32:, :] = 0.5
    codes, scales = quant.q4_0_quantize(w, 32)
    assert bool((codes[:32] == 8).all()) and bool((scales[0] == 0).all())
    assert bool((quant.dequantize(codes, scales, 32)[:32] == 0).all())


def test_dequantize_equals_fp16_multiply():
    g = torch.Generator().manual_seed(9)
    codes = torch.randint(0, 16, (128, 64), generator=g, dtype=torch.int32)
    scales = (torch.rand(4, 64, generator=g) * 0.01 - 0.005).half()
    deq = quant.dequantize(codes, scales, 32)
    assert deq.dtype == torch.float16
    expected = (codes.to(torch.float16) - 8) * scales.repeat_interleave(32, dim=0)
    assert torch.equal(deq, expected)
    assert deq[0, 0].item() == pytest.approx((codes[0, 0].item() - 8) * scales[0, 0].item(), rel=1e-3)


def test_dequantize_checks_scale_shape():
    with pytest.raises(ValueError):
        quant.dequantize(torch.zeros(64, 64, dtype=torch.int32), torch.zeros(3, 64, dtype=torch.float16), 32)


def test_weights_are_reproducible_and_label_dependent():
    a = quant.random_q4_0_weight(128, 64, group_size=32, std=0.02, seed=7, label="x")
    b = quant.random_q4_0_weight(128, 64, group_size=32, std=0.02, seed=7, label="x")
    c = quant.random_q4_0_weight(128, 64, group_size=32, std=0.02, seed=7, label="y")
    assert torch.equal(a.codes, b.codes) and torch.equal(a.scales, b.scales)
    assert not torch.equal(a.codes, c.codes)
    assert quant.sha256_tensor(quant.gptq_pack(a.codes)) == quant.sha256_tensor(quant.gptq_pack(b.codes))


def test_derive_seed_is_stable():
    # pinned: changing the derivation would silently change every reported weight digest
    assert quant.derive_seed(0, "qkv_proj.sliding") == 310418046518805404
    assert quant.derive_seed(1, "qkv_proj.sliding") != quant.derive_seed(0, "qkv_proj.sliding")


def test_uint4b8_id_matches_vllm_and_sgl_kernel():
    # vllm/scalar_type.py and sgl_kernel/scalar_type.py both give 1125899907892224 for uint4b8
    assert UINT4B8.id == 1125899907892224
    assert UINT4B8.size_bits == 4 and UINT4B8.bias == 8
    # float16 (exponent 5, mantissa 10, signed) is 1125899906910725 in vLLM
    assert scalar_type_id(exponent=5, mantissa=10, signed=True, bias=0, finite_values_only=False, nan_repr=1) == 1125899906910725


def test_metric_values():
    ref = torch.tensor([[1.0, -2.0, 3.0, -4.0]])
    out = ref + torch.tensor([[0.1, 0.1, -0.1, -0.1]])
    assert metrics.relative_mean_abs_error(out, ref) == pytest.approx(0.1 / 2.5)
    assert metrics.relative_mean_abs_error(ref, ref) == 0.0
    assert metrics.relative_mean_abs_error(torch.tensor([[1.0, float("nan")]]), torch.ones(1, 2)) == float("inf")
    assert metrics.relative_mean_abs_error(torch.tensor([[1.0, float("inf")]]), torch.ones(1, 2)) == float("inf")
    nan = metrics.relative_mean_abs_error(torch.ones(1, 2), torch.zeros(1, 2))
    assert nan != nan
    with pytest.raises(ValueError):
        metrics.relative_mean_abs_error(torch.ones(2, 2), torch.ones(1, 2))


@pytest.mark.parametrize(
    ("value", "status"),
    [(0.0, "pass"), (5e-3, "pass"), (5.1e-3, "flag"), (0.04, "flag"), (0.0401, "fail"), (float("inf"), "fail"), (float("nan"), "fail")],
)
def test_classify(value, status):
    assert metrics.classify(value, fail_above=0.04, flag_above=5e-3) == status
