"""The one interface every engine t4patch knows implements, so generic code can ask instead of naming engines.

An engine is what the verbs need to know about one serving engine, and nothing about a release: which
installed distributions belong to it (for `doctor`), which `verify attention` drivers it has (the case table
names them), whether `verify marlin` has a provider for it and which options that provider takes, and which
readiness checks `doctor` runs for it. Release facts (which companion release a patch set needs, which
versions have patch sets) stay in the patch-set data and are read from there by the implementations.

This module and every ``engine.py`` import only the standard library and t4patch's light core at import time:
the attention worker loads the table before it has imported torch, and `doctor` must stay under a second.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from t4patch.environment.target import TargetEnvironment
    from t4patch.readiness.model import Check, Context
    from t4patch.verify.marlin.providers import MarlinProvider


@dataclass(frozen=True)
class ProviderOption:
    """A command-line option of `verify marlin` that one engine's provider reads (e.g. a library path)."""

    flag: str  # "--some-lib"
    dest: str  # the argparse destination, also the key in the provider's options
    metavar: str
    help: str
    is_path: bool = False  # made absolute before the command re-runs under another interpreter


@dataclass(frozen=True)
class DoctorSection:
    """What one engine's readiness checks found, in the two forms `doctor` prints."""

    title: str  # the heading line of the text section
    lines: tuple[str, ...]  # the indented lines under it
    warnings: tuple[str, ...]  # joined into doctor's advice
    data: dict[str, Any] = field(default_factory=dict)  # the JSON value under the engine's doctor key


@dataclass(frozen=True)
class MarlinSpec:
    """One `verify marlin` provider an engine offers (``--provider NAME``)."""

    name: str
    help: str  # one line for --help
    build: Callable[..., MarlinProvider]  # (target, options, capability) -> MarlinProvider; imports lazily
    summary: Callable[[dict[str, Any]], str]  # the provider's JSON -> which code ran, in one line
    options: tuple[ProviderOption, ...] = ()
    redirect_to: str | None = None  # the engine whose op this provider's redirect forwards to (report columns)


class Engine:
    """One serving engine. Subclasses set the class attributes and override what they support."""

    name: str  # canonical distribution name; also the CLI's spelling (`verify attention NAME`, --provider NAME)
    label: str  # as people write it, for messages
    distributions: tuple[str, ...]  # installed distributions `doctor` lists for this engine, in reading order
    # `verify attention` drivers named by the case table: driver name -> "module:Class", imported in the worker
    attention_drivers: Mapping[str, str] = {}
    attention_summary: str | None = None  # which launchers the drivers call, for `verify attention --help`
    # `verify marlin` providers of this engine, in --help order
    marlin: tuple[MarlinSpec, ...] = ()
    # the key of this engine's readiness section in `doctor --json` (present, null when not installed), or None
    doctor_key: str | None = None

    def marlin_scope(self) -> MarlinScope | None:
        """What a Marlin run on a non-Turing GPU does not prove about this engine's kernels, or None."""
        return None

    # why the engine compiles kernels at run time (so needs nvcc on the serving box), or None
    runtime_nvcc: str | None = None
    # what the engine still uses FlashInfer for on sm_75, and the flags that avoid it, or None
    flashinfer_on_turing: str | None = None
    # the tensor-parallel flags that work on GPUs without peer-to-peer (several T4s over PCIe), or None
    multi_gpu_without_p2p: str | None = None

    def doctor_checks(self, ctx: Context) -> list[Check]:
        """The engine's own ok / warn / fail checks (only files and metadata: no imports of heavy modules)."""
        return []

    def doctor(self, target: TargetEnvironment) -> DoctorSection | None:
        """The engine's readiness checks on ``target`` (None when it is not installed there)."""
        return None

    def attention_driver(self, driver: str) -> type:
        """The driver class named ``driver``, imported now (in the worker, after torch)."""
        module_name, _, class_name = self.attention_drivers[driver].partition(":")
        return getattr(importlib.import_module(module_name), class_name)

    def __repr__(self) -> str:
        return f"<engine {self.name}>"


@dataclass(frozen=True)
class MarlinScope:
    """Where the Marlin kernels an engine runs come from, for the report's "does not prove" statement."""

    numerics_reference: str  # the source saying sm_75 Marlin accumulates in fp16
    library: str  # whose compiled library holds the sm_75 kernels
    redirect_clause: str | None = None  # what a non-Turing run proves about a redirect, when the engine has one
