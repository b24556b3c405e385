"""The runner's batch step (a torch extension's compiles): independent commands side by side, each command's output
one section of the log, progress per finished command, no new command after a failure, and Ctrl-C stopping
every running command's process tree."""

from __future__ import annotations

import io
import os
import time
from pathlib import Path

import pytest

from t4patch.builder.plan import PlannedStep
from t4patch.builder.runner import StatusPrinter, run_batch


def step(tmp: Path, *commands: str) -> PlannedStep:
    batch = tuple(("sh", "-c", c) for c in commands)
    return PlannedStep("compile", batch[0], tmp / "work", {}, "none", batch=batch)


def test_commands_run_side_by_side_in_order_of_the_plan(tmp_path):
    log = tmp_path / "build.log"
    log.write_text("")
    out = io.StringIO()
    started = time.monotonic()
    results = run_batch(step(tmp_path, "sleep 1; echo one", "sleep 1; echo two", "echo three", "sleep 1; echo four"),
                        log, StatusPrinter(out, interval=0), jobs=3, index=4, total=5)
    assert time.monotonic() - started < 2.8  # three of the 1 s commands overlapped
    assert [r.argv[-1].split("echo ")[-1] for r in results] == ["one", "two", "three", "four"] and all(r.ok for r in results)
    text = log.read_bytes()
    for r in results:  # each span holds exactly that command's output
        assert text[r.log_span[0]:r.log_span[1]].decode().strip() == r.argv[-1].split("echo ")[-1]
    assert "[4/4]" in out.getvalue() and "compile done" in out.getvalue()


def test_no_command_starts_after_a_failure(tmp_path):
    log = tmp_path / "build.log"
    log.write_text("")
    marker = tmp_path / "ran"
    results = run_batch(step(tmp_path, "echo ok", "echo bad; exit 3", f"touch {marker}"), log,
                        StatusPrinter(io.StringIO()), jobs=1, index=1, total=1)
    assert [r.returncode for r in results] == [0, 3] and not marker.exists()
    assert "bad" in log.read_text()


def test_an_interrupt_stops_the_running_commands(tmp_path):
    log = tmp_path / "build.log"
    log.write_text("")
    pidfile = tmp_path / "pid"

    class Interrupting(StatusPrinter):
        def update(self, name, started, progress):  # the quick command finishing: Ctrl-C arrives
            raise KeyboardInterrupt

    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_batch(step(tmp_path, f"echo $$ > {pidfile}; exec sleep 60", "sleep 0.5"), log,
                  Interrupting(io.StringIO()), jobs=2, index=1, total=1)
    assert time.monotonic() - started < 20
    pid = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
