"""Synthetic W4A16 weights on Google's QAT Q4_0 grid, and GPTQ packing, unpacking and dequantization.

The verification must not trust the engine for its own reference, so the weights, their checkpoint format
(GPTQ ``qweight``: eight 4-bit codes per int32 along K) and the dequantized fp16 matrix are computed here.
Weights are drawn on the CPU from a seed derived from (seed, label), so a run is reproducible on any GPU; the
packed bytes' sha256 is reported so two runs can be compared. torch is imported inside the functions.

Q4_0 (ggml's ``quantize_row_q4_0``): per group of 32 inputs, ``d`` is the signed value of largest magnitude
divided by -8, ``q = min(15, floor(w / d + 8.5))``; the stored code is uint4b8 (value = code - 8), the same
symmetric int4 that GPTQ checkpoints store with ``sym=true``. ``d`` is stored as fp16, so codes are computed
against the fp16 scale and ``(code - 8) * d16`` is exactly the value the kernel sees.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

PACK_FACTOR_4BIT = 8  # 32 bits / 4 bits
UINT4B8_BIAS = 8


def derive_seed(seed: int, label: str) -> int:
    """A 63-bit seed from the run seed and a label (shape name, m): independent streams, reproducible."""
    digest = hashlib.sha256(f"t4patch-marlin:{seed}:{label}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def cpu_generator(seed: int, label: str) -> torch.Generator:
    import torch

    generator = torch.Generator(device="cpu")
    generator.manual_seed(derive_seed(seed, label))
    return generator


def _to_int32_wrapping(values: torch.Tensor) -> torch.Tensor:
    """int64 holding uint32 bit patterns -> int32 with the same bits (what checkpoints store)."""
    import torch

    return torch.where(values >= (1 << 31), values - (1 << 32), values).to(torch.int32)


def q4_0_quantize(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize a (K, N) float matrix along K in groups; return (codes int32 (K, N) in 0..15, scales fp16 (K/g, N))."""
    import torch

    k, n = w.shape
    if k % group_size:
        raise ValueError(f"K = {k} is not a multiple of group_size {group_size}")
    grouped = w.float().reshape(k // group_size, group_size, n)
    index = grouped.abs().argmax(dim=1, keepdim=True)
    signed_max = grouped.gather(1, index).squeeze(1)  # (K/g, N)
    scales = (signed_max / -8.0).to(torch.float16)
    d = scales.float().unsqueeze(1)  # quantize against the stored (fp16) scale
    safe = torch.where(d == 0, torch.ones_like(d), d)
    codes = torch.floor(grouped / safe + 8.5).clamp(0, 15)
    codes = torch.where(d == 0, torch.full_like(codes, UINT4B8_BIAS), codes)
    return codes.reshape(k, n).to(torch.int32), scales


@dataclass(frozen=True)
class QuantizedWeight:
    """One linear layer's weights: uint4b8 codes (K, N), fp16 group scales (K/g, N), and provenance."""

    codes: torch.Tensor
    scales: torch.Tensor
    group_size: int
    label: str
    seed: int

    @property
    def k(self) -> int:
        return int(self.codes.shape[0])

    @property
    def n(self) -> int:
        return int(self.codes.shape[1])


def random_q4_0_weight(k: int, n: int, *, group_size: int, std: float, seed: int, label: str) -> QuantizedWeight:
    """Gaussian weights (std ``std``) quantized to Q4_0, drawn on the CPU from derive_seed(seed, label)."""
    import torch

    w = torch.randn(k, n, generator=cpu_generator(seed, label), dtype=torch.float32) * std
    codes, scales = q4_0_quantize(w, group_size)
    return QuantizedWeight(codes=codes, scales=scales, group_size=group_size, label=label, seed=seed)


def gptq_pack(codes: torch.Tensor, num_bits: int = 4) -> torch.Tensor:
    """GPTQ ``qweight``: (K, N) codes -> (K * bits / 32, N) int32; code k = 8r + i sits at bits 4i of row r."""
    import torch

    if num_bits != 4:
        raise ValueError("only 4-bit codes are supported")
    k, n = codes.shape
    if k % PACK_FACTOR_4BIT:
        raise ValueError(f"K = {k} is not a multiple of {PACK_FACTOR_4BIT}")
    if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) > 15):
        raise ValueError("codes must lie in 0..15")
    rows = codes.to(torch.int64).reshape(k // PACK_FACTOR_4BIT, PACK_FACTOR_4BIT, n)
    packed = torch.zeros(k // PACK_FACTOR_4BIT, n, dtype=torch.int64, device=codes.device)
    for i in range(PACK_FACTOR_4BIT):
        packed |= rows[:, i, :] << (num_bits * i)
    return _to_int32_wrapping(packed)


def gptq_unpack(packed: torch.Tensor, num_bits: int = 4) -> torch.Tensor:
    """Inverse of :func:`gptq_pack`: (K/8, N) int32 -> (K, N) int32 codes."""
    import torch

    if num_bits != 4:
        raise ValueError("only 4-bit codes are supported")
    rows, n = packed.shape
    bits = packed.to(torch.int64) & 0xFFFFFFFF
    parts = [(bits >> (num_bits * i)) & 0xF for i in range(PACK_FACTOR_4BIT)]
    return torch.stack(parts, dim=1).reshape(rows * PACK_FACTOR_4BIT, n).to(torch.int32)


def dequantize(codes: torch.Tensor, scales: torch.Tensor, group_size: int, bias: int = UINT4B8_BIAS) -> torch.Tensor:
    """fp16 (K, N) weights as the kernel sees them: (code - bias) * scale, rounded once to fp16.

    The fp32 product of a small integer and an fp16 scale is exact, so one rounding to fp16 equals the
    kernel's fp16 multiply.
    """
    import torch

    k, n = codes.shape
    if scales.shape != (k // group_size, n):
        raise ValueError(f"scales shape {tuple(scales.shape)} != ({k // group_size}, {n})")
    expanded = scales.float().repeat_interleave(group_size, dim=0)
    return ((codes.float() - bias) * expanded).to(torch.float16)


def sha256_tensor(t: torch.Tensor) -> str:
    """sha256 of a tensor's bytes (CPU, contiguous, native byte order) for run-to-run comparison."""
    return hashlib.sha256(t.detach().cpu().contiguous().numpy().tobytes()).hexdigest()
