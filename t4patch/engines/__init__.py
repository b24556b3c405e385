"""Engine-specific knowledge, one subpackage per engine, behind one interface (:class:`t4patch.engines.base.Engine`).

:data:`ENGINES` is the one table: generic code (doctor, verify attention, verify marlin) asks it for an
engine's distributions, drivers, providers and checks, and never names an engine itself. Adding an engine is a
new subpackage with an ``engine.py`` and one line here; adding a release is data under ``patches/``.
"""

from __future__ import annotations

from t4patch.engines.base import Engine, MarlinSpec
from t4patch.engines.sglang.engine import SglangEngine
from t4patch.engines.vllm.engine import VllmEngine

# In the order people think about them (doctor lists them so; the first Marlin provider is the default).
ENGINES: tuple[Engine, ...] = (VllmEngine(), SglangEngine())


def get(name: str) -> Engine | None:
    """The engine called ``name`` (a canonical distribution name), or None."""
    return next((engine for engine in ENGINES if engine.name == name), None)


def attention_driver_names() -> tuple[str, ...]:
    """Every `verify attention` driver the engines provide (the case table may name only these)."""
    return tuple(driver for engine in ENGINES for driver in engine.attention_drivers)


def attention_driver(driver: str) -> type:
    """The class of the `verify attention` driver called ``driver``."""
    for engine in ENGINES:
        if driver in engine.attention_drivers:
            return engine.attention_driver(driver)
    raise ValueError(f"unknown driver {driver!r}; known: {', '.join(attention_driver_names())}")


def marlin_specs() -> tuple[MarlinSpec, ...]:
    """Every `verify marlin` provider, in table order (the first is the default)."""
    return tuple(spec for engine in ENGINES for spec in engine.marlin)


def marlin_spec(name: str) -> tuple[Engine, MarlinSpec] | None:
    """The engine and provider called ``name`` (``--provider NAME``), or None."""
    for engine in ENGINES:
        for spec in engine.marlin:
            if spec.name == name:
                return engine, spec
    return None


def engine_distributions() -> tuple[str, ...]:
    """Every distribution that belongs to an engine, in table order (for doctor's package list)."""
    return tuple(dist for engine in ENGINES for dist in engine.distributions)


def example_name(index: int = 0) -> str:
    """An engine name for help texts and hints (the table's ``index``-th engine)."""
    return ENGINES[index % len(ENGINES)].name


def example_spec(index: int = 0) -> str:
    """A real pinned spec for help texts and hints: that engine at the newest version t4patch has a patch set
    for (read from the shipped patch-set directories, so the example is always one that works)."""
    from t4patch.patching.registry import supported_versions

    name = example_name(index)
    versions = supported_versions(name)
    return f"{name}=={versions[-1]}" if versions else name
