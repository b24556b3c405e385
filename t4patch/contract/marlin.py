"""The `verify marlin` side of the engine contract: a provider reduced to three calls, and its typed hooks.

An engine offers providers (:class:`MarlinSpec`, ``--provider NAME``); building one gives a
:class:`MarlinProvider`: repack, GEMM and workspace, plus typed optional hooks for what only that engine can
check (its probes, its extra checks, its own scope statement). A provider whose engine forwards Marlin to
another engine's op (a redirect) also carries that direct op, so the shared checks compare the two bitwise and
time one against the other, with the labels the messages use and the exceptions that mean the engine's own
kernel was reached instead. Nothing here imports torch: the types are only named for the checker.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from t4patch.environment.target import TargetEnvironment

MARLIN_MAX_BLOCKS_PER_SM = 4  # get_marlin_workspace allocates sms * 4 (the engines' marlin_utils.py)

# gemm(a, c, b_q_weight, scales, workspace, m, n, k, use_atomic_add, use_fp32_reduce) -> out
GemmFn = Callable[..., "torch.Tensor"]
# (capability, GPU name) -> (what this run proves, what it does not)
ScopeFn = Callable[[tuple[int, int], str], tuple[list[str], list[str]]]


class FailureSink(Protocol):
    """Where a check records a failure: ``add(kind, message)`` (the runner's ``Failures``)."""

    def add(self, kind: str, message: str) -> None: ...


# (per-shape results, the shape table, the run's settings, failures) -> JSON keys merged into the report;
# the table and settings are verify.marlin's ShapeTable and Settings (named Any here: that package is above)
ExtraChecks = Callable[[list[dict[str, Any]], Any, Any, FailureSink], dict[str, Any]]


@dataclass(frozen=True)
class ProviderOption:
    """A command-line option of `verify marlin` that one engine's provider reads (e.g. a library path)."""

    flag: str  # "--some-lib"
    dest: str  # the argparse destination, also the key in the provider's options
    metavar: str
    help: str
    is_path: bool = False  # made absolute before the command re-runs under another interpreter


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
    redirect: RedirectLabels | None = None
    own_path_errors: tuple[type[BaseException], ...] = ()  # raised when the engine's own kernel was reached
    # engine probes: act-order refusal (failures, device) and the switch-off path (capability, failures)
    act_order_probe: Callable[[FailureSink, torch.device], dict[str, Any]] | None = None
    switch_off_probe: Callable[[tuple[int, int], FailureSink], dict[str, Any] | None] | None = None
    # checks only this provider can run after the shared ones (their JSON keys are merged into the report)
    extra_checks: ExtraChecks | None = None
    # the provider's own "proves / does not prove" statement, replacing the generic one
    scope: ScopeFn | None = None


# (target, the provider's options by dest, the GPU's capability) -> the provider; imports lazily
BuildFn = Callable[["TargetEnvironment", Mapping[str, "str | None"], tuple[int, int]], MarlinProvider]


@dataclass(frozen=True)
class MarlinSpec:
    """One `verify marlin` provider an engine offers (``--provider NAME``)."""

    name: str
    help: str  # one line for --help
    build: BuildFn
    summary: Callable[[dict[str, Any]], str]  # the provider's JSON -> which code ran, in one line
    options: tuple[ProviderOption, ...] = ()
    redirect_to: str | None = None  # the engine whose op this provider's redirect forwards to (report columns)


@dataclass(frozen=True)
class MarlinScope:
    """Where an engine's Marlin kernels come from, for the report's "does not prove" statement.

    An engine that redirects to another engine's kernels leaves ``numerics_reference`` and ``library`` unset:
    the report takes them from the engine its provider's ``redirect_to`` names, through the table.
    """

    numerics_reference: str | None = None  # the source saying sm_75 Marlin accumulates in fp16
    library: str | None = None  # whose compiled library holds the sm_75 kernels
    redirect_clause: str | None = None  # what a non-Turing run proves about a redirect, when the engine has one
