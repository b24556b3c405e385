"""Long test steps report progress: pip's byte counts become lines, and ``pytest -q`` shows them without ``-s``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests import helpers

REPO = Path(__file__).resolve().parents[2]

FAKE_PIP = textwrap.dedent(
    """\
    import sys, time
    print("Collecting x", flush=True)
    for done in (0, 2 * 2**20, 4 * 2**20):
        print(f"Progress {done} of {4 * 2**20}", flush=True)
        time.sleep(0.05)
    print("Saved ./x.whl", flush=True)
    sys.exit(int(sys.argv[1]))
    """
)


def test_pip_byte_counts_become_progress_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    lines: list[str] = []
    monkeypatch.setattr(helpers, "_progress_sink", lines.append)
    helpers.run_with_progress([sys.executable, "-c", FAKE_PIP, "0"], "downloading x==1", interval=0)
    assert lines[0] == "[t4patch tests] downloading x==1 ..."
    assert any("downloading x==1: 2 MiB of 4 MiB (" in line for line in lines[1:-1]), lines
    assert lines[-1].startswith("[t4patch tests] downloading x==1: done in ") and lines[-1].endswith(", 4 MiB")


def test_a_failing_command_raises_with_its_output_but_not_its_byte_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(helpers, "_progress_sink", lambda line: None)
    with pytest.raises(RuntimeError, match="downloading x==1 failed \\(exit 3\\)") as info:
        helpers.run_with_progress([sys.executable, "-c", FAKE_PIP, "3"], "downloading x==1", interval=0)
    assert "Collecting x" in str(info.value) and "Saved ./x.whl" in str(info.value)
    assert f"Progress {2 * 2**20} of" not in str(info.value)


def test_pytest_q_shows_progress_and_heartbeats_past_capture(tmp_path: Path) -> None:
    """A real ``pytest -q`` run (no ``-s``) with the suite's conftest: our lines appear, test output stays captured."""
    (tmp_path / "conftest.py").write_text("from tests.conftest import *  # noqa: F403\n")
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(
        """\
        import time
        from tests.helpers import progress

        def test_fast():
            pass

        def test_slow():
            print("ordinary output stays captured")
            progress("halfway there")
            time.sleep(2.6)
        """
    ))
    env = {**os.environ, "PYTHONPATH": str(REPO), "T4PATCH_TEST_HEARTBEAT_S": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_inner.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert "[t4patch tests] halfway there" in lines, proc.stdout
    beats = [ln for ln in lines if ln.startswith("[t4patch tests] still running test_inner.py::test_slow (")]
    assert len(beats) >= 2, proc.stdout
    assert not any("test_fast" in ln for ln in lines if ln.startswith("[t4patch tests]")), proc.stdout
    assert "ordinary output stays captured" not in proc.stdout + proc.stderr
    assert "2 passed" in proc.stdout
