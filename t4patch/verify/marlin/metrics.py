"""The accuracy metric of upstream's Marlin tests and how a figure is judged.

``mean(|out - ref|) / mean(|ref|)`` is what vLLM's and sgl-kernel's tests assert below 0.04; using the same
figure lets a t4patch result be read against upstream's. Any non-finite output is a failure, never a number
that happens to compare False.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

Status = Literal["pass", "flag", "fail"]


def relative_mean_abs_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """mean|out - ref| / mean|ref| in float64; inf when ``out`` has inf/NaN, nan when ``ref`` is all zero."""
    import torch

    if out.shape != ref.shape:
        raise ValueError(f"output shape {tuple(out.shape)} != reference shape {tuple(ref.shape)}")
    o = out.detach().to(torch.float64)
    r = ref.detach().to(torch.float64)
    if not bool(torch.isfinite(o).all()):
        return math.inf
    denom = float(r.abs().mean())
    if denom == 0.0 or not math.isfinite(denom):
        return math.nan
    return float((o - r).abs().mean()) / denom


def classify(value: float, *, fail_above: float, flag_above: float) -> Status:
    """pass <= flag_above < flag <= fail_above < fail; NaN and inf fail."""
    if not math.isfinite(value) or value > fail_above:
        return "fail"
    if value > flag_above:
        return "flag"
    return "pass"


def finite_or_none(value: float) -> float | None:
    """JSON has no inf/NaN: report those as null (the status field says why)."""
    return value if math.isfinite(value) else None
