"""The one interface every engine t4patch knows implements, and the lookups on a table of them.

An engine is what the verbs need to know about one serving engine, and nothing about a release: which
installed distributions belong to it (for `doctor`), which `verify attention` drivers it has (the case table
names them), which `verify marlin` providers it offers and which options they take, and what `doctor` checks
for it. Release facts (which companion release a patch set needs, which versions have patch sets) stay in the
patch-set data and are read from there by the implementations.

The table itself (which engines exist, in which order) is ``t4patch/commands/engine_table.py``; generic code
receives an :class:`EngineTable` (or one entry) as a parameter. Every ``engine.py`` imports only the standard
library and t4patch's light core at import time: `doctor` must stay under a second.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from t4patch.contract.marlin import MarlinScope, MarlinSpec

if TYPE_CHECKING:
    from t4patch.contract.doctor import DoctorSection
    from t4patch.cuda.gpu import Gpu, GpuReport
    from t4patch.environment.target import TargetEnvironment

TURING_BELOW = (8, 0)  # compute capabilities below this have no bf16 and take the engines' Turing paths


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
    # where this engine's Marlin kernels come from, for the report's scope statement, or None
    marlin_scope: MarlinScope | None = None
    # the key of this engine's readiness section in `doctor --json` (present, null when not installed), or None
    doctor_key: str | None = None
    # why the engine compiles kernels at run time (so needs nvcc on the serving box), or None
    runtime_nvcc: str | None = None
    # what the engine still uses FlashInfer for on sm_75, and the flags that avoid it, or None
    flashinfer_on_turing: str | None = None
    # the tensor-parallel flags that work on GPUs without peer-to-peer (several T4s over PCIe), or None
    multi_gpu_without_p2p: str | None = None

    def doctor(self, ctx: Context) -> DoctorSection | None:
        """The engine's readiness findings on ``ctx.target`` (files and metadata only: no heavy imports); None
        when there is nothing to say (for an engine with a ``doctor_key``: when it is not installed there)."""
        return None

    def __repr__(self) -> str:
        return f"<engine {self.name}>"


@dataclass(frozen=True)
class EngineTable:
    """Engines in the order people think about them (doctor lists them so; the first Marlin provider is the
    default), with the lookups generic code asks instead of naming engines."""

    engines: tuple[Engine, ...]

    def __post_init__(self) -> None:
        names = [e.name for e in self.engines]
        if len(set(names)) != len(names):
            raise ValueError(f"engine table: an engine is listed twice ({', '.join(names)})")
        drivers = [d for e in self.engines for d in e.attention_drivers]
        providers = [s.name for e in self.engines for s in e.marlin]
        for kind, found in (("attention driver", drivers), ("Marlin provider", providers)):
            if len(set(found)) != len(found):
                raise ValueError(f"engine table: a {kind} name is used twice ({', '.join(found)})")

    def __iter__(self) -> Iterator[Engine]:
        return iter(self.engines)

    def __len__(self) -> int:
        return len(self.engines)

    def __getitem__(self, index: int) -> Engine:
        return self.engines[index]

    def get(self, name: str) -> Engine | None:
        """The engine called ``name`` (a canonical distribution name), or None."""
        return next((engine for engine in self.engines if engine.name == name), None)

    def attention_drivers(self) -> dict[str, str]:
        """Every `verify attention` driver the engines provide: name -> "module:Class" (the case table may
        name only these; the worker imports the class in the target's interpreter)."""
        return {driver: where for engine in self.engines for driver, where in engine.attention_drivers.items()}

    def attention_driver_names(self) -> tuple[str, ...]:
        return tuple(self.attention_drivers())

    def marlin_specs(self) -> tuple[MarlinSpec, ...]:
        """Every `verify marlin` provider, in table order (the first is the default)."""
        return tuple(spec for engine in self.engines for spec in engine.marlin)

    def marlin_spec(self, name: str) -> tuple[Engine, MarlinSpec] | None:
        """The engine and provider called ``name`` (``--provider NAME``), or None."""
        for engine in self.engines:
            for spec in engine.marlin:
                if spec.name == name:
                    return engine, spec
        return None

    def marlin_kernels(self, provider: str | None) -> MarlinScope | None:
        """Where the kernels a provider runs come from: its engine's scope, or for a redirect the scope of the
        engine it forwards to (through this table); with no provider, the first engine's."""
        found = self.marlin_spec(provider) if provider else None
        if found is None:
            return self.engines[0].marlin_scope if self.engines else None
        engine, spec = found
        if spec.redirect_to is not None:
            target = self.get(spec.redirect_to)
            if target is not None and target.marlin_scope is not None:
                return target.marlin_scope
        return engine.marlin_scope

    def distributions(self) -> tuple[str, ...]:
        """Every distribution that belongs to an engine, in table order (for doctor's package list)."""
        return tuple(dist for engine in self.engines for dist in engine.distributions)


@dataclass(frozen=True)
class Context:
    """What `doctor`'s checks look at: the target environment, the GPUs, RAM and swap, and the engine table
    (handed in by the command: generic checks ask it which engine needs what, instead of naming engines)."""

    target: TargetEnvironment
    gpus: GpuReport
    memory: dict[str, int | None]
    engines: EngineTable

    @property
    def turing(self) -> list[Gpu]:
        return [g for g in self.gpus.gpus if g.cc_tuple < TURING_BELOW]

    @property
    def turing_relevant(self) -> bool:
        """Whether sm_75 code matters here: a Turing GPU is present, or no GPU was found (a T4 box being set up)."""
        return bool(self.turing) or not self.gpus.gpus

    def installed_engines(self) -> list[Engine]:
        """The table's engines that are installed in the target, in table order."""
        return [e for e in self.engines if self.target.find(e.name) is not None]
