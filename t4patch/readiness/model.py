"""What readiness checks read from an installed distribution's files: its requirements, its shared libraries.

The check's answer and the context it looks at (:class:`Check`, :class:`Context`) are part of the engine
contract (:mod:`t4patch.contract`); they are re-exported here for the checks that import them with
these helpers. Everything here reads files only: no engine, torch or triton import.
"""

from __future__ import annotations

from email.parser import Parser

from packaging.requirements import InvalidRequirement, Requirement

from t4patch.contract.doctor import STATUSES as STATUSES
from t4patch.contract.doctor import Check as Check
from t4patch.contract.engine import Context as Context
from t4patch.environment.target import InstalledDistribution


def requirement(dist: InstalledDistribution, name: str) -> Requirement | None:
    """``dist``'s unconditional ``Requires-Dist`` on ``name`` (the first, parsed by packaging), or None: the one
    reader of ``Requires-Dist`` lines."""
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
