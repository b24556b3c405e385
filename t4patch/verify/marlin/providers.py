"""Providers: whose Marlin is verified, reduced to three calls (repack, GEMM, workspace).

Each engine that has one builds it (``Engine.marlin_provider`` in ``t4patch/engines/<engine>/``); this module
holds the shape every provider has and picks the engine from the one table. A provider whose engine forwards
Marlin to another engine's op (a redirect) also carries that direct op, so the checks can compare the two
bitwise and time one against the other, the labels the messages use, the exceptions that mean the engine's
own kernel was reached instead, and the engine's extra probes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from t4patch import engines
from t4patch.environment.target import TargetEnvironment
from t4patch.errors import UsageError

if TYPE_CHECKING:
    import torch

MARLIN_MAX_BLOCKS_PER_SM = 4  # get_marlin_workspace allocates sms * 4 (the engine's marlin_utils.py)


# gemm(a, c, b_q_weight, scales, workspace, m, n, k, use_atomic_add, use_fp32_reduce) -> out
GemmFn = Callable[..., "torch.Tensor"]


@dataclass(frozen=True)
class RedirectLabels:
    """How the messages and JSON keys of a redirect's checks name the two sides."""

    engine: str  # the redirecting engine, as people write it
    direct: str  # the engine whose op is called, as a JSON key part
    direct_label: str  # the same, as people write it
    own_path: str  # what reaching the engine's own kernel means, for failure messages


@dataclass(frozen=True)
class MarlinProvider:
    name: str
    repack: Callable[[torch.Tensor, int, int], torch.Tensor]
    gemm: GemmFn
    make_workspace: Callable[[torch.device], torch.Tensor]
    info: dict[str, Any]
    direct_gemm: GemmFn | None = None  # a redirect: the op it must forward to
    direct_workspace: Callable[[torch.device], torch.Tensor] | None = None
    raw: dict[str, Any] = field(default_factory=dict)  # engine callables for the engine's own probes
    redirect: RedirectLabels | None = None
    own_path_errors: tuple[type[BaseException], ...] = ()  # raised when the engine's own kernel was reached
    # engine probes: act-order refusal (failures, device) and the switch-off path (capability, failures)
    act_order_probe: Callable[[Any, Any], dict[str, Any]] | None = None
    switch_off_probe: Callable[[tuple[int, int], Any], dict[str, Any] | None] | None = None


def provider_names() -> tuple[str, ...]:
    """The names `--provider` accepts, from the engine table (the first is the default)."""
    return tuple(spec.name for spec in engines.marlin_specs())


def sms(device: torch.device) -> int:
    import torch

    return int(torch.cuda.get_device_properties(device).multi_processor_count)


def make_provider(
    name: str, target: TargetEnvironment, options: Mapping[str, str | None], capability: tuple[int, int]
) -> MarlinProvider:
    found = engines.marlin_spec(name)
    if found is None:
        raise UsageError(f"--provider {name}: expected one of {', '.join(provider_names())}")
    return found[1].build(target, options, capability)
