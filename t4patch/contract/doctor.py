"""What an engine's doctor hook hands back: one check's answer, and the engine's section.

One hook per engine (:meth:`t4patch.contract.engine.Engine.doctor`) returns one :class:`DoctorSection`: its
ok / warn / fail checks, its advice lines, and (for engines with a doctor key) a text block and a JSON value.
Checks read files and metadata only (dist-info, fatbin headers, NVML, /proc, PATH): never torch, triton or an
engine import, so `doctor` stays well under a second. A check that does not apply says "ok" and why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

STATUSES = ("ok", "warn", "fail")


@dataclass(frozen=True)
class Check:
    """One check's answer, for doctor's readiness checks and any other ok / warn / fail list (a build's
    preflight): the status, the one line that says what was found, the fix, and the bare value found."""

    name: str  # stable key, e.g. "torch-cuda-arch"
    status: str  # ok | warn | fail
    reason: str  # one line: what was needed and what was found
    fix: str | None = None  # the command or change that fixes it (None when ok)
    found: str | None = None  # the bare value found (a version, "not found"), where a caller reports it apart

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"check {self.name}: status {self.status!r} is not one of {STATUSES}")

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "reason": self.reason, "fix": self.fix}


@dataclass(frozen=True)
class DoctorSection:
    """What one engine's doctor hook found: checks for the "checks:" list, advice for the "!" lines, and, for
    an engine with a ``doctor_key``, a text block (``title`` and indented ``lines``) and the JSON value."""

    checks: tuple[Check, ...] = ()  # appended to doctor's checks, in the engine table's order
    warnings: tuple[str, ...] = ()  # joined into doctor's advice (each names the command that fixes it)
    title: str | None = None  # the heading line of the text block; None: no block
    lines: tuple[str, ...] = ()  # the indented lines under it
    data: dict[str, Any] = field(default_factory=dict)  # the JSON value under the engine's doctor key
