"""One readiness check's answer (ok / warn / fail, why, the fix) and what every check may look at.

Checks read files and metadata only (dist-info, fatbin headers, NVML, /proc, PATH): never torch, triton or an
engine import, so `doctor` stays well under a second. A check that does not apply says "ok" and why.
"""

from __future__ import annotations

from dataclasses import dataclass
from email.parser import Parser
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement

from t4patch.cuda.gpu import GpuReport
from t4patch.environment.target import InstalledDistribution, TargetEnvironment

STATUSES = ("ok", "warn", "fail")


@dataclass(frozen=True)
class Check:
    name: str  # stable key, e.g. "torch-cuda-arch"
    status: str  # ok | warn | fail
    reason: str  # one line: what was found
    fix: str | None = None  # the command or change that fixes it (None when ok)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"check {self.name}: status {self.status!r} is not one of {STATUSES}")

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "reason": self.reason, "fix": self.fix}


@dataclass(frozen=True)
class Context:
    """What the checks look at: the target environment, the GPUs, RAM and swap."""

    target: TargetEnvironment
    gpus: GpuReport
    memory: dict[str, int | None]

    @property
    def turing(self) -> list[Any]:
        return [g for g in self.gpus.gpus if g.cc_tuple < (8, 0)]

    @property
    def turing_relevant(self) -> bool:
        """Whether sm_75 code matters here: a Turing GPU is present, or no GPU was found (a T4 box being set up)."""
        return bool(self.turing) or not self.gpus.gpus


def requirement(dist: InstalledDistribution, name: str) -> Requirement | None:
    """``dist``'s unconditional ``Requires-Dist`` on ``name``, or None."""
    try:
        text = (dist.dist_info / "METADATA").read_text(encoding="utf-8")
    except OSError:
        return None
    for line in Parser().parsestr(text, headersonly=True).get_all("Requires-Dist") or []:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.name.lower() == name and (req.marker is None or req.marker.evaluate({"extra": ""})):
            return req
    return None


def shared_libraries(dist: InstalledDistribution, prefix: str = "") -> list[str]:
    """RECORD paths of the distribution's shared libraries (``.so`` files), optionally under ``prefix``."""
    try:
        record = dist.record()
    except OSError:
        return []
    return sorted(p for p in record if p.startswith(prefix) and (p.endswith(".so") or ".so." in p.rsplit("/", 1)[-1]))
