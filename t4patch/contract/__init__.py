"""The engine contract: what every engine t4patch knows provides, and the types its hooks hand back.

This package sits low in the tree (above ``patching``, below ``readiness``, ``verify`` and ``builder``) and
imports no engine and no command. Engines (``t4patch/engines/<engine>/``) implement it; the command layer holds
the one table of engines (``t4patch/commands/engine_table.py``) and hands it, or one entry of it, to the generic
code as a parameter. So generic code never imports an engine and an engine never imports a command.

- :mod:`t4patch.contract.engine`: :class:`Engine`, :class:`EngineTable` (the lookups on a tuple of engines),
  :class:`Context` (what the doctor hook and the generic checks look at)
- :mod:`t4patch.contract.doctor`: :class:`Check`, :class:`DoctorSection` (what the doctor hook returns)
- :mod:`t4patch.contract.marlin`: :class:`MarlinSpec`, :class:`MarlinProvider`, :class:`MarlinScope`,
  :class:`ProviderOption`, :class:`RedirectLabels`, the Marlin constants (the `verify marlin` hooks)
"""

from __future__ import annotations

from t4patch.contract.doctor import STATUSES, Check, DoctorSection
from t4patch.contract.engine import Context, Engine, EngineTable
from t4patch.contract.marlin import (
    MARLIN_MAX_BLOCKS_PER_SM,
    ExtraChecks,
    FailureSink,
    GemmFn,
    MarlinProvider,
    MarlinScope,
    MarlinSpec,
    ProviderOption,
    RedirectLabels,
    ScopeFn,
)

__all__ = [
    "MARLIN_MAX_BLOCKS_PER_SM",
    "STATUSES",
    "Check",
    "Context",
    "DoctorSection",
    "Engine",
    "EngineTable",
    "ExtraChecks",
    "FailureSink",
    "GemmFn",
    "MarlinProvider",
    "MarlinScope",
    "MarlinSpec",
    "ProviderOption",
    "RedirectLabels",
    "ScopeFn",
]
