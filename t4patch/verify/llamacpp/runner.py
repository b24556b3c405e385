"""Run llama.cpp's test-backend-ops for each op of the Gemma 4 E2B list and judge the results.

One process per op entry (``test-backend-ops test -b BACKEND -o OPS [-p REGEX]``), each with a time limit,
its output streamed so progress is shown while it runs (a head-512 flash-attention case JIT-compiles
for a while on a GPU that runs PTX). A case is a failure when llama.cpp says FAIL or the process died in it
(crashed); an op entry fails when its filter matched no case at all (the op list no longer fits this
llama.cpp), when it ran out of time (incomplete: what did not run is not proven), or when the process
exited non-zero without a failing case. "not supported" is not a failure; every not-supported case at a
shape Gemma 4 E2B produces is listed with what llama.cpp then does (the op list's ``on_not_supported``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from t4patch.data.locations import data_dir
from t4patch.data.reader import DataKind, ListOf, Number, Str, Table, optional, read
from t4patch.errors import DataFileError, MissingDependencyError, UsageError
from t4patch.verify.llamacpp import parse

BINARY = "test-backend-ops"
OPS_FILE = "llama-cpp-gemma4-e2b.toml"
OP_LIST = DataKind(
    label="llama.cpp op list",
    error=DataFileError,
)
OP_LIST_SCHEMA = Table({
    "schema": Number(),
    "name": Str(),
    "model": Str(),
    "llama_cpp": Str(),
    "op": ListOf(Table({
        "name": Str(), "o": Str(), "p": optional(Str()), "graph": Str(), "on_not_supported": Str(),
        "e2b_shape": optional(ListOf(Str())),
    }), nonempty=True),
})


@dataclass(frozen=True)
class OpSpec:
    name: str
    o: str
    p: str | None
    graph: str
    on_not_supported: str
    e2b_shape: tuple[str, ...] = ()

    def argv(self, binary: Path, backend: str) -> list[str]:
        return [str(binary), "test", "-b", backend, "-o", self.o, *(["-p", self.p] if self.p else [])]

    def is_e2b_shape(self, params: str) -> bool:
        return all(re.search(rx, params) for rx in self.e2b_shape)


@dataclass(frozen=True)
class OpList:
    path: Path
    name: str
    model: str
    llama_cpp: str
    ops: tuple[OpSpec, ...]


def load_ops(path: Path | None = None) -> OpList:
    path = path or data_dir("cases") / OPS_FILE
    doc = read(path, OP_LIST_SCHEMA, OP_LIST, version=1)
    ops, names = [], set()
    for i, entry in enumerate(doc["op"], start=1):
        where = f"op[{i}]"
        for rx in ([entry["p"]] if entry.get("p") else []) + list(entry.get("e2b_shape", [])):
            try:
                re.compile(rx)
            except re.error as exc:
                raise OP_LIST.fail(path, f"{where}: {rx!r} is not a regex ({exc})") from exc
        if entry["name"] in names:
            raise OP_LIST.fail(path, f"{where}.name: {entry['name']!r} is listed twice")
        names.add(entry["name"])
        ops.append(OpSpec(entry["name"], entry["o"], entry.get("p"), entry["graph"], entry["on_not_supported"],
                          tuple(entry.get("e2b_shape", []))))
    return OpList(path, doc["name"], doc["model"], doc["llama_cpp"], tuple(ops))


def find_binary(build: Path) -> Path:
    """``BUILD_DIR/bin/test-backend-ops`` (or the binary itself); MissingDependencyError with the build command."""
    candidates = [build] if build.is_file() else [build / "bin" / BINARY, build / BINARY]
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise MissingDependencyError(
        f"expected llama.cpp's {BINARY} in {build}/bin, found none",
        hint="t4patch build llama.cpp --with-tests (or cmake -DLLAMA_BUILD_TESTS=ON, target test-backend-ops)",
    )


def build_info(build: Path) -> dict[str, Any]:
    """What the build says about itself: CMake cache entries that matter, and llama.cpp's commit."""
    root = build.parent.parent if build.is_file() else build
    info: dict[str, Any] = {"build_dir": str(root)}
    cache = root / "CMakeCache.txt"
    if cache.is_file():
        wanted = ("CMAKE_CUDA_ARCHITECTURES", "GGML_CUDA", "GGML_NATIVE", "CMAKE_BUILD_TYPE", "CMAKE_CUDA_COMPILER_VERSION")
        for line in cache.read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition("=")
            name = key.split(":", 1)[0]
            if name in wanted:
                info[name] = value
    build_info_cpp = root / "common" / "build-info.cpp"
    if build_info_cpp.is_file():
        m = re.search(r'LLAMA_COMMIT = "([^"]*)"', build_info_cpp.read_text(encoding="utf-8", errors="replace"))
        if m:
            info["llama_commit"] = m.group(1)
    return info


@dataclass
class OpResult:
    spec: OpSpec
    argv: list[str]
    seconds: float
    returncode: int | None
    timed_out: bool
    parsed: parse.Parsed
    stderr_tail: str
    problems: list[str] = field(default_factory=list)  # op-level failures

    def e2b_not_supported(self) -> list[parse.Case]:
        return [c for c in self.parsed.cases if c.status == "not_supported" and self.spec.is_e2b_shape(c.params)]

    def failed_cases(self) -> list[parse.Case]:
        return [c for c in self.parsed.cases if c.status in ("fail", "crashed")]

    def to_json(self) -> dict[str, Any]:
        counts = self.parsed.counts()
        e2b_ns = self.e2b_not_supported()
        return {
            "name": self.spec.name,
            "argv": self.argv,
            "graph": self.spec.graph,
            "seconds": round(self.seconds, 1),
            "returncode": self.returncode,
            "timed_out": self.timed_out,
            "cases": len(self.parsed.cases),
            **counts,
            "e2b_shape_cases": sum(1 for c in self.parsed.cases if self.spec.is_e2b_shape(c.params)),
            "e2b_not_supported": [c.params for c in e2b_ns],
            "on_not_supported": self.spec.on_not_supported if e2b_ns else None,
            "failures": [c.to_json() for c in self.failed_cases()],
            "not_supported_cases": [c.to_json() for c in self.parsed.cases if c.status == "not_supported"],
            "backend_verdicts": self.parsed.backends,
            "unparsed_lines": self.parsed.unparsed[:20],
            "stderr_tail": self.stderr_tail,
            "problems": self.problems,
        }


def judge(result: OpResult, backend: str) -> None:
    """Op-level problems (case-level failures are counted from the parse)."""
    if result.timed_out:
        result.problems.append(f"ran out of time after {result.seconds:.0f} s ({len(result.parsed.cases)} cases done): the rest is not proven")
    if not result.parsed.cases and not result.timed_out:
        result.problems.append(f"filter -o {result.spec.o!r}" + (f" -p {result.spec.p!r}" if result.spec.p else "") + f" matched no case on {backend}: the op list does not fit this llama.cpp")
    if result.returncode not in (0, None) and not result.failed_cases() and not result.timed_out:
        result.problems.append(f"{BINARY} exited {result.returncode} without a failing case")


def run_op(binary: Path, backend: str, spec: OpSpec, timeout: float, progress: Callable[[str], None], env: dict[str, str] | None = None, log: Path | None = None) -> OpResult:
    argv = spec.argv(binary, backend)
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True, env=env)
    out_lines: list[str] = []
    err_lines: list[str] = []

    def pump(stream: Any, sink: list[str]) -> None:
        for line in stream:
            sink.append(line)

    threads = [threading.Thread(target=pump, args=(proc.stdout, out_lines), daemon=True),
               threading.Thread(target=pump, args=(proc.stderr, err_lines), daemon=True)]
    for t in threads:
        t.start()
    timed_out = False
    last = started
    while proc.poll() is None:
        time.sleep(0.2)
        now = time.monotonic()
        if now - started > timeout:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            break
        if now - last >= 10:
            last = now
            counts = parse.parse("".join(out_lines)).counts()
            progress(f"    {spec.name}: {counts['ok']} ok, {counts['fail']} fail, {counts['not_supported']} not supported ({now - started:.0f} s)")
    for t in threads:
        t.join(timeout=5)
    seconds = time.monotonic() - started
    result = OpResult(spec, argv, seconds, None if timed_out else proc.returncode, timed_out, parse.parse("".join(out_lines)), "".join(err_lines)[-2000:])
    if timed_out and result.parsed.cases and result.parsed.cases[-1].status == "crashed":
        # the case in progress when the time ran out did not crash: it was stopped
        last_case = result.parsed.cases.pop()
        result.parsed.cases.append(parse.Case(last_case.op, last_case.params, "skipped", "stopped at the time limit", last_case.backend))
    if log is not None:
        with log.open("a", encoding="utf-8") as handle:
            handle.write(f"==== {spec.name}: $ {' '.join(argv)}\n==== exit {result.returncode}{' (timed out)' if timed_out else ''}, {seconds:.1f} s\n")
            handle.write("".join(out_lines))
            handle.write("==== stderr\n" + "".join(err_lines) + "\n")
    judge(result, backend)
    return result


def gpu_capability() -> tuple[str | None, str | None]:
    """(compute capability "9.0", "NAME (cc 9.0)") of the first GPU, or (None, None) without one (informational:
    the run itself says whether the backend exists; :func:`t4patch.cuda.gpu.detect` never raises for a missing
    GPU or driver)."""
    from t4patch.cuda.gpu import detect

    report = detect()
    if not report.gpus:
        return None, None
    gpu = report.gpus[0]
    return gpu.compute_capability, f"{gpu.name} (cc {gpu.compute_capability})"


BUILD_INFO = "==== build-info "


def write_build_info(log: Path, info: dict[str, Any]) -> None:
    """Append the run's header line (what was built, the GPU, the backend, the binary) to a ``--log`` file."""
    with log.open("a", encoding="utf-8") as handle:
        handle.write(BUILD_INFO + json.dumps(info) + "\n")


def read_build_info(text: str, origin: Path) -> dict[str, Any]:
    """The last header line of a ``--log`` file ({} when it has none).

    The file is read back from disk, so it is untrusted: a header that is not a JSON object of the fields
    :func:`write_build_info` writes is a UsageError naming the file, never a traceback.
    """
    info: dict[str, Any] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.startswith(BUILD_INFO):
            continue
        try:
            doc = json.loads(line[len(BUILD_INFO):])
        except ValueError as exc:
            raise _bad_log(origin, number, f"its header is not JSON ({exc})") from exc
        if not isinstance(doc, dict):
            raise _bad_log(origin, number, f"its header is a JSON {type(doc).__name__}, expected an object")
        if not isinstance(doc.get("build", {}), dict):
            raise _bad_log(origin, number, "its header's 'build' is not an object")
        for key in ("gpu", "capability", "backend", "binary"):
            if doc.get(key) is not None and not isinstance(doc[key], str):
                raise _bad_log(origin, number, f"its header's {key!r} is not a string")
        info = doc
    return info


def _bad_log(origin: Path, line: int, what: str) -> UsageError:
    return UsageError(f"--from-log {origin}: line {line}: {what}", hint="pass the file a --log run wrote, unedited")


_LOG_HEAD = re.compile(r"^==== (?P<name>.+?): \$ (?P<argv>.*)$")
_LOG_EXIT = re.compile(r"^==== exit (?P<rc>-?\d+|None)(?P<to> \(timed out\))?, (?P<s>[0-9.]+) s$")


def from_log(text: str, ops: OpList) -> list[OpResult]:
    """Re-derive the results from a ``--log`` file (each op's command line, exit, stdout and stderr)."""
    by_name = {s.name: s for s in ops.ops}
    results: list[OpResult] = []
    blocks = re.split(r"(?m)^(?===== .+?: \$ )", text)
    for block in blocks:
        lines = block.splitlines(keepends=True)
        if not lines:
            continue
        head = _LOG_HEAD.match(lines[0].rstrip("\n"))
        if not head:
            continue
        spec = by_name.get(head.group("name"))
        if spec is None:
            raise OP_LIST.fail(ops.path, f"the log names op {head.group('name')!r}, which this op list does not have (use the op list the run used)")
        exit_line = _LOG_EXIT.match(lines[1].rstrip("\n")) if len(lines) > 1 else None
        if exit_line is None:
            raise OP_LIST.fail(ops.path, f"the log block for {spec.name} has no '==== exit' line (not a --log file of this command)")
        body = "".join(lines[2:])
        stdout, _, stderr = body.partition("==== stderr\n")
        rc = None if exit_line.group("rc") == "None" else int(exit_line.group("rc"))
        result = OpResult(spec, head.group("argv").split(" "), float(exit_line.group("s")), rc, bool(exit_line.group("to")),
                          parse.parse(stdout), stderr[-2000:])
        judge(result, result.argv[result.argv.index("-b") + 1] if "-b" in result.argv else "?")
        results.append(result)
    return results


def run(binary: Path, backend: str, ops: OpList, *, timeout: float, selected: tuple[str, ...] = (), progress: Callable[[str], None], log: Path | None = None, budget: float | None = None) -> list[OpResult]:
    """Every chosen op in list order; with ``budget`` (seconds for the whole run) an op gets at most what is
    left, and ops that cannot start any more are reported as not run (a failure: nothing about them is proven)."""
    chosen = [s for s in ops.ops if not selected or s.name in selected or s.o in selected]
    results = []
    started = time.monotonic()
    for i, spec in enumerate(chosen, 1):
        left = None if budget is None else budget - (time.monotonic() - started)
        if left is not None and left < 5:
            result = OpResult(spec, spec.argv(binary, backend), 0.0, None, False, parse.Parsed(), "")
            result.problems.append(f"not run: the time budget of {budget:.0f} s was used up")
            progress(f"[{i}/{len(chosen)}] {spec.name}: not run (time budget used up)")
            results.append(result)
            continue
        progress(f"[{i}/{len(chosen)}] {spec.name}: {' '.join(spec.argv(binary, backend)[1:])}")
        result = run_op(binary, backend, spec, timeout if left is None else min(timeout, left), progress, log=log)
        counts = result.parsed.counts()
        progress(f"    -> {len(result.parsed.cases)} cases: {counts['ok']} ok, {counts['fail']} fail, {counts['crashed']} crashed, "
                 f"{counts['not_supported']} not supported ({len(result.e2b_not_supported())} at E2B shapes) in {result.seconds:.0f} s"
                 + (f"; {'; '.join(result.problems)}" if result.problems else ""))
        results.append(result)
    return results
