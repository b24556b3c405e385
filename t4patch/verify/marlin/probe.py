"""The small helpers every Marlin check and every engine's provider probe shares: one home, public names.

The shared checks (:mod:`t4patch.verify.marlin.checks`), the runner and the engines' providers
(``t4patch/engines/<engine>/marlin*_provider.py``) all wait for the GPU, turn an exception into one report
line, round figures for JSON and count bitwise-distinct results the same way; they import these from here
instead of reaching into each other's private names. torch is imported inside each function only.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

ERROR_CHARS = 400  # one report line per exception, never a traceback


def device_for(kind: str) -> torch.device:
    """The device a run uses: the current CUDA device for "cuda", else that device kind (unit tests: "cpu")."""
    import torch

    if kind == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(kind)


def sync(device: torch.device) -> None:
    """Wait for the GPU (kernel errors surface here, inside the caller's try); a no-op on the CPU."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def sms(device: torch.device) -> int:
    """The number of multiprocessors of ``device`` (Marlin workspaces are sized per SM)."""
    import torch

    return int(torch.cuda.get_device_properties(device).multi_processor_count)


def err(exc: BaseException) -> str:
    """``Type: first line`` of an exception, at most ERROR_CHARS characters."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:ERROR_CHARS]


def rounded(value: float | None, digits: int = 4) -> float | None:
    """``value`` to ``digits`` significant digits for JSON; None for None, NaN and infinities."""
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.{digits}g}")


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, dtype and bytes: NaN payloads and the sign of zero count, unlike ``==``."""
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)))


def distinct(outputs: list[torch.Tensor]) -> int:
    """How many bitwise-different results among ``outputs``."""
    representatives: list[torch.Tensor] = []
    for out in outputs:
        if not any(bitwise_equal(out, r) for r in representatives):
            representatives.append(out)
    return len(representatives)
