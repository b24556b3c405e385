"""Providers: whose Marlin is verified, picked by name from the engine table the command hands in.

The shape every provider has (:class:`~t4patch.contract.MarlinProvider`, three calls and typed optional hooks)
is part of the engine contract, :mod:`t4patch.contract.marlin`; each engine builds its own
(``MarlinSpec.build`` in ``t4patch/engines/<engine>/``). This module never imports the table: it is given one.
"""

from __future__ import annotations

from collections.abc import Mapping

from t4patch.contract import EngineTable
from t4patch.contract import MarlinProvider as MarlinProvider
from t4patch.contract import RedirectLabels as RedirectLabels
from t4patch.environment.target import TargetEnvironment
from t4patch.errors import UsageError


def provider_names(engines: EngineTable) -> tuple[str, ...]:
    """The names `--provider` accepts, from the engine table (the first is the default)."""
    return tuple(spec.name for spec in engines.marlin_specs())


def make_provider(
    name: str,
    target: TargetEnvironment,
    options: Mapping[str, str | None],
    capability: tuple[int, int],
    engines: EngineTable,
) -> MarlinProvider:
    found = engines.marlin_spec(name)
    if found is None:
        raise UsageError(f"--provider {name}: expected one of {', '.join(provider_names(engines))}")
    return found[1].build(target, options, capability)
