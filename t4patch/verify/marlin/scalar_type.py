"""The ``b_q_type`` id that Marlin ops take, computed the way vLLM and sgl_kernel encode it.

vLLM's ``vllm/scalar_type.py`` (ScalarType.id, lines 135-160 in 0.33.0) and sgl_kernel's copy pack the type's
fields into one int64; the compiled op decodes it. t4patch computes it itself so the check does not need either
engine's Python package, and cross-checks it against the engine's own file when that file is at hand.
"""

from __future__ import annotations

from dataclasses import dataclass

# NanRepr.IEEE_754: the default of vLLM's ScalarType dataclass, which integer types keep.
_NAN_REPR_IEEE_754 = 1


def scalar_type_id(
    *, exponent: int, mantissa: int, signed: bool, bias: int, finite_values_only: bool, nan_repr: int
) -> int:
    """Fields packed low to high: exponent 8 bits, mantissa 8, signed 1, bias 32, finite-only 1, nan_repr 8."""
    value = 0
    offset = 0
    for member, width in (
        (exponent, 8),
        (mantissa, 8),
        (int(signed), 1),
        (bias, 32),
        (int(finite_values_only), 1),
        (nan_repr, 8),
    ):
        value |= (int(member) & ((1 << width) - 1)) << offset
        offset += width
    return value


@dataclass(frozen=True)
class MarlinWeightType:
    """Stand-in for an engine ScalarType: the wrappers (vLLM's marlin_gemm, SGLang's gptq_marlin_gemm) read
    only ``.id`` and ``.size_bits``."""

    name: str
    id: int
    size_bits: int
    bias: int


def uint(size_bits: int, bias: int) -> MarlinWeightType:
    """vLLM's ``ScalarType.uint(size_bits, bias)``: unsigned, exponent 0, mantissa = size_bits."""
    return MarlinWeightType(
        name=f"uint{size_bits}b{bias}" if bias else f"uint{size_bits}",
        id=scalar_type_id(
            exponent=0,
            mantissa=size_bits,
            signed=False,
            bias=bias,
            finite_values_only=False,
            nan_repr=_NAN_REPR_IEEE_754,
        ),
        size_bits=size_bits,
        bias=bias,
    )


UINT4B8 = uint(4, 8)
