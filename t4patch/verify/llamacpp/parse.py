"""Parse test-backend-ops' console output (mode ``test``) into per-case results.

The console printer of llama.cpp's tests/test-backend-ops.cpp writes, per backend::

    Backend 1/2: CUDA0
      Device description: NVIDIA H200
      ...
      OP(params): OK                          (green ANSI)
      OP(params): not supported [CUDA0]
      OP(params): [OP] ERR = 0.1 > 0.0005 FAIL (red ANSI; llama.cpp's own detail before the status)
      OP(params): skipping large tensors for speed
      N/M tests passed
      Backend CUDA0: OK
    Backend 2/2: CPU
      Skipping CPU backend
    2/2 backends passed
    OK

The prefix ``  OP(params): `` is printed and flushed before the case runs, so a crash (GGML_ABORT, a CUDA
error) leaves a line with no status: that case is reported as ``crashed``, never dropped. Anything the parser
does not recognise is kept in ``unparsed`` so a format change cannot silently pass.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_CASE = re.compile(r"^  (?P<op>[A-Z][A-Z0-9_]*)\((?P<params>.*)\): (?P<rest>.*)$")
_BACKEND = re.compile(r"^Backend (?P<i>\d+)/(?P<n>\d+): (?P<name>\S+)\s*$")
_PASSED = re.compile(r"^  (?P<passed>\d+)/(?P<total>\d+) tests passed\s*$")
_BACKEND_STATUS = re.compile(r"^  Backend (?P<name>\S+): (?P<status>OK|FAIL)\s*$")
_OVERALL = re.compile(r"^(?P<passed>\d+)/(?P<total>\d+) backends passed\s*$")
_NOT_SUPPORTED = re.compile(r"^(?P<detail>.*?)not supported \[(?P<why>[^\]]*)\]\s*$")
_KNOWN_NOISE = (
    re.compile(r"^Testing \d+ devices?\s*$"),
    re.compile(r"^  (Device description|Device memory|Backend memory|Skipping|Skipping CPU backend)\b.*$"),
    re.compile(r"^(OK|FAIL)\s*$"),
    re.compile(r"^\s*$"),
    re.compile(r"^ggml_cuda_init: .*$|^  Device \d+: .*$|^load_backend: .*$|^register_backend: .*$"),
)

STATUSES = ("ok", "fail", "not_supported", "skipped", "crashed")


@dataclass(frozen=True)
class Case:
    op: str
    params: str
    status: str  # one of STATUSES
    detail: str = ""  # llama.cpp's own text before the status (errors), or the not-supported reason
    backend: str = ""

    def to_json(self) -> dict[str, str]:
        out = {"op": self.op, "params": self.params, "status": self.status, "backend": self.backend}
        if self.detail:
            out["detail"] = self.detail
        return out


@dataclass
class Parsed:
    cases: list[Case] = field(default_factory=list)
    backends: dict[str, str] = field(default_factory=dict)  # name -> "OK" | "FAIL" (the backend's own verdict)
    tests_passed: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (passed, total)
    overall: tuple[int, int] | None = None  # (backends passed, backends)
    unparsed: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {status: sum(1 for c in self.cases if c.status == status) for status in STATUSES}


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


def _case(match: re.Match[str], backend: str) -> Case:
    rest = match.group("rest").rstrip()
    op, params = match.group("op"), match.group("params")
    if rest.endswith("OK") and not rest.endswith("NOT OK"):
        return Case(op, params, "ok", rest[: -len("OK")].strip(), backend)
    if rest.endswith("FAIL"):
        return Case(op, params, "fail", rest[: -len("FAIL")].strip(), backend)
    ns = _NOT_SUPPORTED.match(rest)
    if ns:
        return Case(op, params, "not_supported", (ns.group("detail").strip() + " " + ns.group("why")).strip(), backend)
    if rest.startswith("skipping large tensors"):
        return Case(op, params, "skipped", rest, backend)
    return Case(op, params, "crashed", rest, backend)  # a prefix with no status: the process died in this case


def parse(text: str) -> Parsed:
    """Parse the whole stdout of one test-backend-ops run (ANSI colours allowed)."""
    result = Parsed()
    backend = ""
    for raw in strip_ansi(text).splitlines():
        line = raw.rstrip("\r")
        m = _BACKEND.match(line)
        if m:
            backend = m.group("name")
            continue
        m = _CASE.match(line) or _CASE.match(line + " ")  # a crash right after "): " leaves "): " at the end
        if m and not _BACKEND_STATUS.match(line):
            result.cases.append(_case(m, backend))
            continue
        m = _PASSED.match(line)
        if m:
            result.tests_passed[backend] = (int(m.group("passed")), int(m.group("total")))
            continue
        m = _BACKEND_STATUS.match(line)
        if m:
            result.backends[m.group("name")] = m.group("status")
            continue
        m = _OVERALL.match(line)
        if m:
            result.overall = (int(m.group("passed")), int(m.group("total")))
            continue
        if any(p.match(line) for p in _KNOWN_NOISE):
            continue
        result.unparsed.append(line)
    return result
