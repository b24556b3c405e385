"""Triton behind the engine interface: no attention driver and no Marlin provider of its own, only a doctor
check saying which dot path fp16 ``tl.dot`` takes on sm_75 in the target (the Triton patch set applied or not).

Triton is in doctor's package list already (it is part of every engine's stack), so it declares no
distributions of its own here; its patch sets are data under ``patches/triton/`` like every engine's, so
``apply``, ``status``, ``revert``, ``wheel`` and ``port`` need nothing from this module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from t4patch.contract import Engine

if TYPE_CHECKING:
    from t4patch.contract import Context, DoctorSection


class TritonEngine(Engine):
    name = "triton"
    label = "Triton"
    distributions = ()  # listed by doctor's stack (torch, triton, ...): not twice

    def doctor(self, ctx: Context) -> DoctorSection | None:
        from t4patch.engines.triton.doctor import section

        return section(ctx)
