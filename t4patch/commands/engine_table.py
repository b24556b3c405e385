"""The one table of engines t4patch knows, and its lookups; read only by the command layer.

Adding an engine is a subpackage ``t4patch/engines/<engine>/`` with an ``engine.py`` implementing
:class:`t4patch.contract.Engine`, and one line here; adding a release is data under ``patches/``. Only
``t4patch/commands/*`` and ``t4patch/cli.py`` import this module (tests/unit/test_import_layers.py checks it):
generic code receives :data:`ENGINES` (an :class:`~t4patch.contract.EngineTable`) or one spec as a parameter.
"""

from __future__ import annotations

from t4patch.contract import Engine, EngineTable, MarlinSpec
from t4patch.engines.sglang.engine import SglangEngine
from t4patch.engines.triton.engine import TritonEngine
from t4patch.engines.vllm.engine import VllmEngine

# In the order people think about them (doctor lists them so; the first Marlin provider is the default).
ENGINES = EngineTable((VllmEngine(), SglangEngine(), TritonEngine()))


def get(name: str) -> Engine | None:
    """The engine called ``name`` (a canonical distribution name), or None."""
    return ENGINES.get(name)


def attention_drivers() -> dict[str, str]:
    """Every `verify attention` driver: name -> "module:Class"."""
    return ENGINES.attention_drivers()


def attention_driver_names() -> tuple[str, ...]:
    """Every `verify attention` driver the engines provide (the case table may name only these)."""
    return ENGINES.attention_driver_names()


def marlin_specs() -> tuple[MarlinSpec, ...]:
    """Every `verify marlin` provider, in table order (the first is the default)."""
    return ENGINES.marlin_specs()


def marlin_spec(name: str) -> tuple[Engine, MarlinSpec] | None:
    """The engine and provider called ``name`` (``--provider NAME``), or None."""
    return ENGINES.marlin_spec(name)


def engine_distributions() -> tuple[str, ...]:
    """Every distribution that belongs to an engine, in table order (for doctor's package list)."""
    return ENGINES.distributions()


def example_name(index: int = 0) -> str:
    """An engine name for help texts and hints (the table's ``index``-th engine)."""
    return ENGINES[index % len(ENGINES)].name


def example_spec(index: int = 0) -> str:
    """A real pinned spec for help texts and hints: that engine at the newest version t4patch has a patch set
    for (read from the shipped patch-set directories, so the example is always one that works)."""
    from t4patch.patching.registry import newest_supported

    name = example_name(index)
    newest = newest_supported(name)
    return f"{name}=={newest}" if newest else name
