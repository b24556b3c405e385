"""The reference Marlin layout against digests computed with vLLM 0.33.0's own test utilities.

The digests below were produced on 2026-11-29 by running, from the vllm-0.33.0 wheel,
``marlin_utils_test.marlin_weights(codes, K, N, 4, get_weight_perm(4))`` and
``marlin_utils.marlin_permute_scales(s, K, N, 32)`` on the formula inputs of this file (the functions were
extracted with ``ast`` and run with numpy + torch CPU; vLLM itself was not imported). Any divergence of
t4patch's re-implementation from upstream's layout changes a digest and fails here.
"""

from __future__ import annotations

import hashlib

import pytest

torch = pytest.importorskip("torch")

from t4patch.verify.marlin import layout, quant  # noqa: E402

VLLM_LAYOUT_SHA256 = {
    (128, 64): "1542aa19111500f7050d8fa53406a9f5137434ebb3d1ab1452f66c95a6e8983e",
    (256, 128): "2f2cdb47c573b37f339263c57fa083bfeae17010904a8e2c3717d85bb38fdf7e",
    (512, 192): "dc823074bb0533a30a42226933756c63ef86b55843a585314e1efd6bb7efc282",
    (1536, 256): "1202745b7532c3e3d9ea5e05c8e2c7eb8efe4dd6b1e7cef355ffdea94e290e21",
    (256, 1536): "647cc5b1af409f416fe6aa7091128fe6050f8c7062dfd628e7162742420b0c15",
}
VLLM_SCALES_SHA256 = {
    (256, 128): "083b10a9e93796002775f377fef1109b6d37937a6920441346437f51751648c7",
    (1536, 256): "2f9bf40ccf3bf991dd15b527164597969e2c766d0aa687fb15ebd9a4031aadce",
}


def formula_codes(k: int, n: int) -> torch.Tensor:
    kk = torch.arange(k).reshape(k, 1)
    nn = torch.arange(n).reshape(1, n)
    return ((kk * 7 + nn * 13 + (kk * nn) % 5) % 16).to(torch.int32)


def formula_scales(k: int, n: int) -> torch.Tensor:
    return ((torch.arange(k // 32 * n, dtype=torch.float32).reshape(k // 32, n) % 97) / 64).half()


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()


def test_weight_perm_is_a_permutation_with_upstreams_start():
    perm = layout.weight_perm_4bit()
    assert sorted(perm) == list(range(1024))
    assert perm[:16] == (0, 128, 8, 136, 16, 144, 24, 152, 256, 384, 264, 392, 272, 400, 280, 408)


@pytest.mark.parametrize(("k", "n"), sorted(VLLM_LAYOUT_SHA256))
def test_reference_layout_matches_vllm_test_utilities(k, n):
    out = layout.marlin_reference_repack(formula_codes(k, n))
    assert out.dtype == torch.int32
    assert tuple(out.shape) == (k // 16, n * 16 // 8)  # vLLM's gptq_marlin_repack fake shape
    assert digest(out) == VLLM_LAYOUT_SHA256[(k, n)]


@pytest.mark.parametrize(("k", "n"), sorted(VLLM_SCALES_SHA256))
def test_scale_permutation_matches_vllm(k, n):
    s = formula_scales(k, n)
    permuted = layout.marlin_permute_scales(s, k, n, 32)
    assert digest(permuted) == VLLM_SCALES_SHA256[(k, n)]
    assert torch.equal(layout.marlin_unpermute_scales(permuted, k, n, 32), s)


def test_unrepack_inverts_repack_on_random_codes():
    g = torch.Generator().manual_seed(3)
    codes = torch.randint(0, 16, (384, 128), generator=g, dtype=torch.int32)
    packed = layout.marlin_reference_repack(codes)
    assert torch.equal(layout.marlin_reference_unrepack(packed, 384, 128), codes)


def test_tile_index_is_a_bijection():
    index = layout.marlin_tile_index(256, 128).reshape(-1)
    assert torch.equal(torch.sort(index).values, torch.arange(256 * 128))


def test_pack_columns_low_nibble_first():
    codes = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7], [15, 0, 0, 0, 0, 0, 0, 15]], dtype=torch.int32)
    packed = layout.pack_columns(codes)
    assert packed.tolist() == [[0x76543210], [0xF000000F - (1 << 32)]]
    assert torch.equal(layout.unpack_columns(packed), codes)


def test_compare_repack_locates_a_flipped_nibble():
    k, n = 256, 128
    codes = formula_codes(k, n)
    reference = layout.marlin_reference_repack(codes)
    wrong_codes = codes.clone()
    wrong_codes[37, 101] = (wrong_codes[37, 101] + 1) % 16
    engine = layout.marlin_reference_repack(wrong_codes)
    result = layout.compare_repack(engine, reference, k, n)
    assert not result.exact and result.shape_ok
    assert result.mismatched_codes == 1 and result.mismatched_words == 1
    assert result.first_mismatches == ((37, 101),)
    assert layout.compare_repack(reference.clone(), reference, k, n).exact


def test_compare_repack_reports_wrong_shape():
    reference = layout.marlin_reference_repack(formula_codes(128, 64))
    result = layout.compare_repack(reference.reshape(-1), reference, 128, 64)
    assert not result.exact and not result.shape_ok


@pytest.mark.parametrize(("k", "n"), [(128, 48), (120, 64)])
def test_layout_rejects_shapes_marlin_cannot_tile(k, n):
    with pytest.raises(ValueError):
        layout.marlin_tile_index(k, n)


def test_gptq_pack_then_reference_equals_direct_reference():
    # the engine receives GPTQ-packed rows; unpacking them must give back the codes the reference used
    codes = formula_codes(512, 192)
    assert torch.equal(quant.gptq_unpack(quant.gptq_pack(codes)), codes)
