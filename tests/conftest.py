"""Shared fixtures (a synthetic installed engine and patch set, the CLI runner) and progress for long tests.

Helpers live in ``tests/helpers.py``; this file holds only fixtures and hooks. Progress: ``helpers.progress``
lines (wheel downloads and installs) and a heartbeat for any test running longer than ``HEARTBEAT_AFTER_S``
(60 s) are written to a duplicate of the terminal's file descriptor taken before pytest starts capturing, so
``pytest -q`` shows them without ``-s`` and a run never sits silent for minutes (tests/unit/test_progress.py).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from t4patch.cli import main
from tests import helpers
from tests.helpers import Env, Result, make_dist, make_patch_set

# The first "still running" line after this many seconds of one test, then one per interval
# (T4PATCH_TEST_HEARTBEAT_S sets both; the test of this machinery uses a short one).
HEARTBEAT_AFTER_S = HEARTBEAT_EVERY_S = float(os.environ.get("T4PATCH_TEST_HEARTBEAT_S", "60"))


class _Terminal:
    """Writes whole lines to the terminal pytest itself writes to, past fd-level output capture.

    pytest has suspended capture while plugins configure, so fd 1 is the real terminal then; a duplicate of it
    keeps pointing there after capture redirects fd 1. A lock keeps the heartbeat thread's lines whole.
    """

    def __init__(self, config: pytest.Config) -> None:
        self._config = config
        self._fd = os.dup(1)
        self._lock = threading.Lock()
        self._width_after_last = -1

    def line(self, text: str) -> None:
        writer = self._config.get_terminal_writer()
        with self._lock:
            # pytest -q prints one character per test on the current line: start ours on a fresh line, unless
            # pytest has written nothing since our last one (its column count does not see our writes).
            width = writer.width_of_current_line
            lead = "\n" if width and width != self._width_after_last else ""
            writer.flush()
            os.write(self._fd, f"{lead}{text}\n".encode())
            self._width_after_last = width

    def close(self) -> None:
        os.close(self._fd)


_terminal: _Terminal | None = None


def pytest_addoption(parser: pytest.Parser) -> None:
    # tests/fault/: random-timing kill trials per case (x5 for in-process kills); the CI-sized default is 8
    parser.addoption("--fault-trials", type=int, default=8, help="random-kill trials per fault-injection case")


@pytest.hookimpl(trylast=True)  # after the terminal plugin has registered its reporter
def pytest_configure(config: pytest.Config) -> None:
    global _terminal
    if config.pluginmanager.get_plugin("terminalreporter") is None:
        return
    _terminal = _Terminal(config)
    helpers.set_progress_sink(_terminal.line)


def pytest_unconfigure(config: pytest.Config) -> None:
    global _terminal
    helpers.set_progress_sink(None)
    if _terminal is not None:
        _terminal.close()
        _terminal = None


def _heartbeat(nodeid: str, stop: threading.Event, say: Callable[[str], None]) -> None:
    start = time.monotonic()
    wait = HEARTBEAT_AFTER_S
    while not stop.wait(wait):
        say(f"[t4patch tests] still running {nodeid} ({time.monotonic() - start:.0f} s)")
        wait = HEARTBEAT_EVERY_S


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Run a heartbeat thread beside each test (setup, call and teardown: fixtures download wheels too)."""
    if _terminal is None:
        yield
        return
    stop = threading.Event()
    thread = threading.Thread(target=_heartbeat, args=(item.nodeid, stop, _terminal.line), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Env:
    site = make_dist(tmp_path / "site")
    patches = tmp_path / "patches"
    make_patch_set(patches)
    monkeypatch.setenv("T4PATCH_PATCHES", str(patches))
    return Env(site, patches)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., Result]:
    def run(*argv: str) -> Result:
        code = main(list(argv))
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run
