"""Run build steps: stream progress to the user, keep every byte of output in the log file.

A build prints tens of thousands of lines; showing them all hides the one that matters, showing none looks
like a hang. So the runner shows one status per step (timer, percentage where the tool reports one:
ninja's ``[123/456]``, make/CMake's ``[ 42%]``, cargo's ``Building [==>  ] 120/480`` bar, git's ``42%``)
and writes the complete output to the log. On failure it prints the log's tail and raises BuildError naming
the log, plus the explanation of a known failure pattern when one matches.

A command's outcome is a :class:`StepResult` (what ran, how long, its exit status, where its output lies in
the log): the runner reports, the pipeline decides. :class:`LogRunner` is the real runner; anything with the
same ``run`` method (:class:`StepRunner`) can stand in for it, which is how tests check that a build executes
exactly the commands its dry run shows.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TextIO

from t4patch.builder.plan import PlannedStep
from t4patch.builder.recipe import KnownFailure
from t4patch.errors import BuildError

TAIL_LINES = 30

_NINJA = re.compile(r"^\[(\d+)/(\d+)\]\s*(.*)")
_MAKE = re.compile(r"^\[\s*(\d+)%\]\s*(.*)")
_CARGO_BAR = re.compile(r"Building \[[^\]]*\]\s*(\d+)/(\d+)(?::\s*(.*))?")
_CARGO_LINE = re.compile(r"^\s*(Compiling|Checking|Finished|Downloaded|Downloading|Updating|Fresh|Locking)\s+(.*)")
_GIT = re.compile(r"^([A-Za-z ]+):\s+(\d+)%")


@dataclass(frozen=True)
class Progress:
    percent: float | None
    label: str | None


def parse_progress(kind: str, line: str) -> Progress | None:
    """Progress information in one output line of a ``kind`` tool (see recipe ``progress``), or None."""
    text = line.strip()
    if not text:
        return None
    if kind in ("ninja", "cmake", "make"):
        m = _NINJA.match(text)
        if m and int(m.group(2)) > 0:
            return Progress(100.0 * int(m.group(1)) / int(m.group(2)), m.group(3) or None)
        m = _MAKE.match(text)
        if m:
            return Progress(float(m.group(1)), m.group(2) or None)
        if kind == "cmake" and text.startswith("-- "):
            return Progress(None, text[3:])
        return None
    if kind == "cargo":
        m = _CARGO_BAR.search(text)
        if m and int(m.group(2)) > 0:
            return Progress(100.0 * int(m.group(1)) / int(m.group(2)), m.group(3) or None)
        m = _CARGO_LINE.match(text)
        if m:
            return Progress(None, f"{m.group(1)} {m.group(2)}")
        return None
    if kind == "git":
        m = _GIT.match(text)
        if m:
            return Progress(float(m.group(2)), m.group(1).strip())
        return None
    return None


def format_seconds(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    minutes, sec = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{sec:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{sec:02d}s"


class StatusPrinter:
    """Progress display: one rewritten line on a terminal, sparse plain lines otherwise (CI logs)."""

    def __init__(self, stream: TextIO | None = None, *, interval: float = 15.0, clock: Callable[[], float] = time.monotonic):
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval = interval
        self.clock = clock
        self._last_print = 0.0
        self._last_percent: float | None = None
        self.last_percent: float | None = None  # the step's latest reported percentage
        self._width = 0

    def start(self, index: int, total: int, name: str, argv: tuple[str, ...]) -> None:
        self._finish_line()
        self.stream.write(f"==> [{index}/{total}] {name}: {' '.join(argv)}\n")
        self.stream.flush()
        self._last_print = float("-inf")  # the step's first status shows at once
        self._last_percent = None

    def update(self, name: str, started: float, progress: Progress) -> None:
        now = self.clock()
        pct = f"{progress.percent:3.0f}% " if progress.percent is not None else ""
        label = (progress.label or "")[:90]
        text = f"    {name} {format_seconds(now - started)} {pct}{label}"
        if self.tty:
            if now - self._last_print < 0.2:
                return
            pad = max(0, self._width - len(text))
            self.stream.write("\r" + text + " " * pad)
            self._width = len(text)
        else:
            # Plain output: every 10 percentage points, or every `interval` seconds, whichever comes first.
            crossed = (progress.percent is not None and
                       (self._last_percent is None or progress.percent // 10 > self._last_percent // 10))
            if not crossed and now - self._last_print < self.interval:
                return
            if progress.percent is not None:
                self._last_percent = progress.percent
            self.stream.write(text + "\n")
        self._last_print = now
        self.stream.flush()

    def done(self, name: str, seconds: float, ok: bool) -> None:
        self._finish_line()
        word = "done" if ok else "FAILED"
        self.stream.write(f"    {name} {word} in {format_seconds(seconds)}\n")
        self.stream.flush()

    def _finish_line(self) -> None:
        if self.tty and self._width:
            self.stream.write("\n")
            self._width = 0


@dataclass(frozen=True)
class StepResult:
    """What one command of a step did: the exact argv that ran, its time, exit status and log section."""

    name: str  # the plan step it belongs to
    argv: tuple[str, ...]  # as executed (every StepOutput bound)
    cwd: str
    env: dict[str, str]
    seconds: float
    returncode: int | None  # None: the command could not be started (``start_error`` says why)
    last_percent: float | None = None
    log_span: tuple[int, int] = (0, 0)  # byte offsets [start, end) of the command's output in the build log
    output: str | None = None  # captured standard output (lookup commands only)
    start_error: str | None = None
    action: str | None = None  # a step t4patch did itself (no command): what it did

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def to_dict(self) -> dict[str, object]:
        doc: dict[str, object] = {"name": self.name, "argv": list(self.argv), "cwd": self.cwd, "env": self.env,
                                  "seconds": round(self.seconds, 2), "returncode": self.returncode,
                                  "log_span": list(self.log_span)}
        if self.output is not None:
            doc["output"] = self.output
        if self.start_error is not None:
            doc["start_error"] = self.start_error
        if self.action is not None:
            doc["action"] = self.action
        return doc


class StepRunner(Protocol):
    """Runs one command of a plan step and reports it; never raises for a non-zero exit."""

    def run(self, step: PlannedStep, argv: tuple[str, ...], *, index: int, total: int,
            capture: bool = False) -> StepResult: ...

    def run_batch(self, step: PlannedStep, *, jobs: int, index: int, total: int) -> list[StepResult]:
        """Every command of ``step.batch``, up to ``jobs`` at a time; stops starting new ones after a failure."""
        ...


class LogRunner:
    """The real runner: subprocesses in their own process groups, output appended to the build log."""

    def __init__(self, log: Path, printer: StatusPrinter) -> None:
        self.log = log
        self.printer = printer

    def run(self, step: PlannedStep, argv: tuple[str, ...], *, index: int, total: int,
            capture: bool = False) -> StepResult:
        return run_step(step, argv, self.log, self.printer, index=index, total=total, capture=capture)

    def run_batch(self, step: PlannedStep, *, jobs: int, index: int, total: int) -> list[StepResult]:
        return run_batch(step, self.log, self.printer, jobs=jobs, index=index, total=total)


def run_batch(step: PlannedStep, log: Path, printer: StatusPrinter, *, jobs: int, index: int,
              total: int) -> list[StepResult]:
    """Run the independent commands of ``step.batch``, ``jobs`` at a time (an extension's compiles).

    Each command's whole output is appended to ``log`` as one section when it ends (so sections never
    interleave); the status line counts finished commands. After the first failure no new command starts,
    the running ones finish, and the results so far are returned (the pipeline raises for the failed one).
    Ctrl-C / SIGTERM stop every running command's process tree and propagate."""
    import threading
    from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

    commands = list(step.batch)
    printer.start(index, total, step.name, (f"{len(commands)} commands, up to {jobs} at a time",))
    started = time.monotonic()
    lock = threading.Lock()
    running: set[subprocess.Popen] = set()
    results: list[StepResult] = []
    failed = threading.Event()

    def one(argv: tuple[str, ...]) -> StepResult:
        t0 = time.monotonic()
        try:
            proc = subprocess.Popen(list(argv), cwd=step.cwd, env={**os.environ, **step.env}, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:
            failed.set()
            return StepResult(step.name, argv, str(step.cwd), dict(step.env), time.monotonic() - t0, None,
                              start_error=exc.strerror or str(exc))
        with lock:
            running.add(proc)
        output, _ = proc.communicate()
        with lock:
            running.discard(proc)
        seconds = time.monotonic() - t0
        with lock, log.open("ab") as fh:
            fh.write(f"\n### t4patch step {step.name} ({time.strftime('%Y-%m-%d %H:%M:%S')})\n### cwd: {step.cwd}\n"
                     f"### argv: {argv!r}\n".encode())
            span_start = fh.tell()
            fh.write(output)
            span_end = fh.tell()
            fh.write(f"\n### t4patch step {step.name}: exit {proc.returncode} after {seconds:.1f}s\n".encode())
        if proc.returncode != 0:
            failed.set()
        return StepResult(step.name, argv, str(step.cwd), dict(step.env), seconds, proc.returncode,
                          log_span=(span_start, span_end))

    step.cwd.mkdir(parents=True, exist_ok=True)
    pending = list(commands)
    futures: set[Future[StepResult]] = set()
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        try:
            while pending or futures:
                while pending and len(futures) < jobs and not failed.is_set():
                    futures.add(pool.submit(one, pending.pop(0)))
                if not futures:
                    break
                done, futures = wait(futures, return_when=FIRST_COMPLETED)
                for future in done:
                    result = future.result()
                    results.append(result)
                    ok = sum(r.ok for r in results)
                    printer.update(step.name, started, Progress(100.0 * ok / len(commands),
                                   f"[{ok}/{len(commands)}] {_batch_label(result.argv)}"
                                   f" ({result.seconds:.0f}s)" + ("" if result.ok else " FAILED")))
                    printer.last_percent = 100.0 * ok / len(commands)
        except BaseException:
            failed.set()
            with lock:
                live = list(running)
            for proc in live:
                stop_process_group(proc)
            printer.done(step.name, time.monotonic() - started, False)
            raise
    printer.done(step.name, time.monotonic() - started, all(r.ok for r in results) and len(results) == len(commands))
    order = {argv: i for i, argv in enumerate(commands)}
    return sorted(results, key=lambda r: order.get(r.argv, len(order)))


def run_step(step: PlannedStep, argv: tuple[str, ...], log: Path, printer: StatusPrinter, *, index: int,
             total: int, capture: bool = False) -> StepResult:
    """Run ``argv`` (one command of ``step``), appending its output to ``log``.

    With ``capture`` the standard output is kept (StepResult.output) as well as logged, and no progress
    is parsed from it. Returns the result whatever the exit status; Ctrl-C / SIGTERM stop the command's
    whole process tree and propagate.
    """
    printer.start(index, total, step.name, argv)
    env = {**os.environ, **step.env}
    step.cwd.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    printer.last_percent = None
    captured = b""
    with log.open("ab") as fh:
        header = (f"\n### t4patch step {step.name} ({time.strftime('%Y-%m-%d %H:%M:%S')})\n### cwd: {step.cwd}\n"
                  f"### env: {' '.join(f'{k}={v}' for k, v in sorted(step.env.items()))}\n### argv: {argv!r}\n")
        fh.write(header.encode())
        fh.flush()
        span_start = fh.tell()
        try:
            # Own process group: cmake -> ninja -> nvcc -> cicc can then be stopped together (see below).
            proc = subprocess.Popen(list(argv), cwd=step.cwd, env=env, stdout=subprocess.PIPE,
                                    stderr=fh if capture else subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        except OSError as exc:
            seconds = time.monotonic() - started
            printer.done(step.name, seconds, False)
            fh.write(f"### t4patch step {step.name}: could not start ({exc.strerror})\n".encode())
            return StepResult(step.name, argv, str(step.cwd), dict(step.env), seconds, None,
                              log_span=(span_start, span_start), start_error=exc.strerror or str(exc))
        assert proc.stdout is not None
        pending = b""
        try:
            while True:
                chunk = proc.stdout.read1(65536) if hasattr(proc.stdout, "read1") else proc.stdout.read(65536)
                if not chunk:
                    break
                fh.write(chunk)
                fh.flush()  # a killed t4patch must not lose the end of the log
                if capture:
                    captured += chunk
                else:
                    pending = _consume(pending + chunk, step, started, printer)
        except BaseException:
            # Ctrl-C / SIGTERM (see commands/build.py) / an internal error: never leave the compilers running.
            stop_process_group(proc)
            fh.write(f"### t4patch step {step.name}: interrupted after {time.monotonic() - started:.1f}s\n".encode())
            printer.done(step.name, time.monotonic() - started, False)
            raise
        last_percent = printer.last_percent
        returncode = proc.wait()
        seconds = time.monotonic() - started
        span_end = fh.tell()
        fh.write(f"\n### t4patch step {step.name}: exit {returncode} after {seconds:.1f}s\n".encode())
    printer.done(step.name, seconds, returncode == 0)
    return StepResult(step.name, argv, str(step.cwd), dict(step.env), seconds, returncode, last_percent,
                      (span_start, span_end), captured.decode("utf-8", "replace") if capture else None)


def _batch_label(argv: tuple[str, ...]) -> str:
    """What a batch command works on, for the status line: the file after ``-c`` (a compile), else the tool."""
    if "-c" in argv[:-1]:
        return Path(argv[argv.index("-c") + 1]).name
    return Path(argv[0]).name


def step_failure(result: StepResult, log: Path, stream: TextIO, known_failures: tuple[KnownFailure, ...] = (),
                 rerun: str = "") -> BuildError:
    """BuildError for a failed command, after printing the last lines of its log section to ``stream``."""
    if result.returncode is None:
        return BuildError(f"step {result.name!r} could not start {result.argv[0]!r} ({result.start_error}); log: {log}",
                          hint="run the preflight again: the tool vanished or is not executable")
    tail = log_tail(log, result.log_span)
    stream.write(f"---- last {len(tail)} lines of {log} ----\n")
    for line in tail:
        stream.write(line + "\n")
    stream.write("----\n")
    stream.flush()
    explanation = match_known_failure(log, known_failures)
    hint = explanation or f"read {log}, fix the cause, then rerun{': ' + rerun if rerun else ''}"
    return BuildError(f"step {result.name!r} failed (exit {result.returncode}) after "
                      f"{format_seconds(result.seconds)}; log: {log}", hint=hint)


def log_tail(log: Path, span: tuple[int, int], lines: int = TAIL_LINES) -> list[str]:
    """The last non-blank lines of one command's section of the log (\\r counts as a line end)."""
    start, end = span
    with log.open("rb") as fh:
        fh.seek(max(start, end - (1 << 20)))
        data = fh.read(end - fh.tell())
    text = [line for line in re.split(r"\r\n|\r|\n", data.decode("utf-8", "replace")) if line.strip()]
    return text[-lines:]


def stop_process_group(proc: subprocess.Popen) -> None:
    """Stop a step and everything it started: SIGTERM, then SIGKILL to what is left after 5 s.

    The step runs in its own process group, but ninja starts every compile in a process group of its own,
    so a signal to the step's group alone reaches cmake and ninja, not nvcc/cicc. The groups of all
    descendants (read from /proc before anything is signalled) are therefore signalled too; only processes
    this step started are touched."""
    groups = [proc.pid] + [g for g in _descendant_groups(proc.pid) if g != proc.pid]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [g for g in groups if _signal_group(g, sig)]
        deadline = time.monotonic() + 5.0
        while alive and time.monotonic() < deadline:
            proc.poll()  # reap the leader, or its zombie keeps its group "alive"
            alive = [g for g in alive if _signal_group(g, 0)]
            if alive:
                time.sleep(0.05)
        if not alive:
            break
    try:
        proc.wait(timeout=5.0)
    except subprocess.TimeoutExpired:
        pass


def _signal_group(group: int, sig: int) -> bool:
    """Send ``sig`` to a process group; False when the group no longer exists (or is not ours to signal)."""
    try:
        os.killpg(group, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _descendant_groups(pid: int) -> list[int]:
    """Process groups of every descendant of ``pid`` (Linux /proc; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    groups: dict[int, int] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read().decode("utf-8", "replace")
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses, so split after the last ")".
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) < 3:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
        groups[int(entry)] = int(fields[2])
    found: list[int] = []
    todo = list(children.get(pid, []))
    while todo:
        child = todo.pop()
        if groups.get(child) is not None and groups[child] not in found:
            found.append(groups[child])
        todo.extend(children.get(child, []))
    return found


def _consume(pending: bytes, step: PlannedStep, started: float, printer: StatusPrinter) -> bytes:
    """Split complete lines off ``pending``, feed them to the progress display; return the rest."""
    # Tools redraw progress bars with \r; treat it as a line end so the latest state is seen.
    parts = re.split(rb"\r\n|\r|\n", pending)
    rest = parts.pop()
    for raw in parts:
        line = raw.decode("utf-8", "replace")
        progress = parse_progress(step.progress, line)
        if progress is not None:
            if progress.percent is not None:
                printer.last_percent = progress.percent
            printer.update(step.name, started, progress)
    return rest


def match_known_failure(log: Path, known_failures: tuple[KnownFailure, ...]) -> str | None:
    """The explanation of the first known failure whose pattern occurs in the log (last 4 MiB), or None."""
    if not known_failures:
        return None
    with log.open("rb") as fh:
        size = fh.seek(0, 2)
        fh.seek(max(0, size - (4 << 20)))
        text = fh.read().decode("utf-8", "replace")
    for failure in known_failures:
        if failure.pattern.search(text):
            return failure.explanation
    return None
