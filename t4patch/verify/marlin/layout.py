"""The Marlin weight and scale layouts, computed in Python as the reference for the engine's repack.

Upstream tests demand that ``gptq_marlin_repack`` equal this layout exactly. It is a re-implementation of
vLLM 0.33.0's test utilities (``vllm/model_executor/layers/quantization/utils/marlin_utils_test.py``:
``get_weight_perm``, ``marlin_permute_weights``, ``marlin_weights``; and ``marlin_utils.py``:
``get_scale_perms``, ``marlin_permute_scales``) for 4-bit weights with fp16 activations (``is_a_8bit=False``),
written independently so no engine is imported:

1. cut the (K, N) code matrix into 16 x 16 tiles, tile-row-major (each row of the result is one 16-row slab
   of K, its N/16 tiles laid side by side, 256 codes each);
2. permute every run of 1024 codes (four tiles) by the fixed ``weight_perm`` that matches the
   ``mma.m16n8k16`` fragment order, with the nibble interleave 0 2 4 6 1 3 5 7 of the fp16 dequantizer;
3. pack eight consecutive codes into one int32, low nibble first.

It is expressed as a gather index (output code position -> source (k, n)), which also lets a mismatch be
reported at the (k, n) of the weight it belongs to.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

TILE = 16
PERM_BLOCK = 1024  # codes per permutation block: four 16 x 16 tiles
_INTERLEAVE_4BIT = (0, 2, 4, 6, 1, 3, 5, 7)


@cache
def weight_perm_4bit() -> tuple[int, ...]:
    """The 1024-entry permutation of one block of four tiles (4-bit weights, fp16 activations)."""
    perm: list[int] = []
    for i in range(32):  # 32 threads of a warp
        per_thread: list[int] = []
        col = i // 4
        for block in (0, 1):
            for row in (2 * (i % 4), 2 * (i % 4) + 1, 2 * (i % 4 + 4), 2 * (i % 4 + 4) + 1):
                per_thread.append(16 * row + col + 8 * block)
        for j in range(4):  # the four tiles of the block
            perm.extend(p + 256 * j for p in per_thread)
    interleaved: list[int] = []
    for start in range(0, len(perm), len(_INTERLEAVE_4BIT)):
        chunk = perm[start : start + len(_INTERLEAVE_4BIT)]
        interleaved.extend(chunk[i] for i in _INTERLEAVE_4BIT)
    return tuple(interleaved)


@cache
def scale_perms() -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(grouped, per-channel) scale permutations: 64 and 32 entries."""
    grouped = tuple(i + 8 * j for i in range(8) for j in range(8))
    single = tuple(2 * i + j for i in range(4) for j in (0, 1, 8, 9, 16, 17, 24, 25))
    return grouped, single


def _check_shape(k: int, n: int) -> None:
    if k % TILE or n % TILE:
        raise ValueError(f"K = {k} and N = {n} must be multiples of {TILE}")
    if (n * TILE) % PERM_BLOCK:
        raise ValueError(f"N = {n}: N * 16 must be a multiple of {PERM_BLOCK} (N % 64 == 0)")


def marlin_tile_index(k: int, n: int) -> torch.Tensor:
    """int64 (K/16, N*16): for each code position of the Marlin layout, the flat index k * N + n it holds."""
    import torch

    _check_shape(k, n)
    index = torch.arange(k * n, dtype=torch.int64).reshape(k // TILE, TILE, n // TILE, TILE)
    index = index.permute(0, 2, 1, 3).reshape(k // TILE, n * TILE)
    perm = torch.tensor(weight_perm_4bit(), dtype=torch.int64)
    return index.reshape(-1, PERM_BLOCK)[:, perm].reshape(k // TILE, n * TILE)


def pack_columns(codes: torch.Tensor) -> torch.Tensor:
    """(R, C) 4-bit codes -> (R, C/8) int32, code 8c + i at bits 4i of column c."""
    import torch

    rows, cols = codes.shape
    if cols % 8:
        raise ValueError(f"{cols} columns is not a multiple of 8")
    wide = codes.to(torch.int64)
    packed = torch.zeros(rows, cols // 8, dtype=torch.int64, device=codes.device)
    for i in range(8):
        packed |= (wide[:, i::8] & 0xF) << (4 * i)
    return torch.where(packed >= (1 << 31), packed - (1 << 32), packed).to(torch.int32)


def unpack_columns(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_columns`: (R, C/8) int32 -> (R, C) int32 codes."""
    import torch

    rows, cols = packed.shape
    bits = packed.to(torch.int64) & 0xFFFFFFFF
    parts = [(bits >> (4 * i)) & 0xF for i in range(8)]
    return torch.stack(parts, dim=2).reshape(rows, cols * 8).to(torch.int32)


def marlin_reference_repack(codes: torch.Tensor) -> torch.Tensor:
    """What ``gptq_marlin_repack(gptq_pack(codes), K, N, 4)`` must return: int32 (K/16, N*16/8)."""
    k, n = codes.shape
    index = marlin_tile_index(k, n)
    return pack_columns(codes.reshape(-1)[index.to(codes.device)])


def marlin_reference_unrepack(packed: torch.Tensor, k: int, n: int) -> torch.Tensor:
    """Inverse of :func:`marlin_reference_repack`: Marlin-layout int32 -> (K, N) int32 codes."""
    import torch

    index = marlin_tile_index(k, n).reshape(-1).to(packed.device)
    codes = torch.empty(k * n, dtype=torch.int32, device=packed.device)
    codes[index] = unpack_columns(packed).reshape(-1)
    return codes.reshape(k, n)


@dataclass(frozen=True)
class RepackComparison:
    exact: bool
    shape_ok: bool
    mismatched_words: int
    mismatched_codes: int
    first_mismatches: tuple[tuple[int, int], ...]  # (k, n) of the first few wrong codes

    def to_json(self) -> dict[str, object]:
        return {
            "exact": self.exact,
            "shape_ok": self.shape_ok,
            "mismatched_words": self.mismatched_words,
            "mismatched_codes": self.mismatched_codes,
            "first_mismatches_kn": [list(p) for p in self.first_mismatches],
        }


def compare_repack(engine: torch.Tensor, reference: torch.Tensor, k: int, n: int, limit: int = 5) -> RepackComparison:
    """Exact comparison (bit patterns) on the CPU; on a mismatch, locate the first wrong codes as (k, n)."""
    import torch

    engine = engine.detach().cpu()
    reference = reference.detach().cpu()
    if engine.shape != reference.shape or engine.dtype != reference.dtype:
        return RepackComparison(False, False, -1, -1, ())
    if torch.equal(engine, reference):
        return RepackComparison(True, True, 0, 0, ())
    words = int((engine != reference).sum())
    wrong = unpack_columns(engine) != unpack_columns(reference)
    positions = torch.nonzero(wrong.reshape(-1))[:limit, 0]
    flat = marlin_tile_index(k, n).reshape(-1)[positions]
    first = tuple((int(f) // n, int(f) % n) for f in flat)
    return RepackComparison(False, True, words, int(wrong.sum()), first)


def marlin_permute_scales(scales: torch.Tensor, k: int, n: int, group_size: int) -> torch.Tensor:
    """vLLM/SGLang ``marlin_permute_scales`` for fp16 activations: (K/g, N) -> (K/g, N), contiguous."""
    import torch

    grouped, single = scale_perms()
    if group_size != -1 and group_size < k:
        perm = torch.tensor(grouped, dtype=torch.int64, device=scales.device)
    else:
        perm = torch.tensor(single, dtype=torch.int64, device=scales.device)
    return scales.reshape(-1, perm.numel())[:, perm].reshape(-1, n).contiguous()


def marlin_unpermute_scales(scales: torch.Tensor, k: int, n: int, group_size: int) -> torch.Tensor:
    """Inverse of :func:`marlin_permute_scales`."""
    import torch

    grouped, single = scale_perms()
    chosen = grouped if group_size != -1 and group_size < k else single
    inverse = torch.argsort(torch.tensor(chosen, dtype=torch.int64)).to(scales.device)
    return scales.reshape(-1, len(chosen))[:, inverse].reshape(-1, n).contiguous()
