"""The runner and the whole pipeline with a synthetic recipe whose steps are small Python programs.

This covers what every real build goes through (progress parsing from real-looking tool output, the full log,
the failure path with the log tail and a known-failure hint, artifact collection, the sm_75 check and the
build record) in about a second, with no compiler.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from t4patch.builder.pipeline import execute
from t4patch.builder.plan import plan_build
from t4patch.builder.recipe import parse_recipe
from t4patch.builder.runner import StatusPrinter, format_seconds, parse_progress
from t4patch.errors import BuildError, VerificationError
from tests.helpers import fake_recipe as _recipe


@pytest.mark.parametrize(
    "kind,line,percent,label",
    [
        ("ninja", "[42/168] Building CUDA object ggml/src/ggml-cuda/CMakeFiles/mmq.cu.o", 25.0, "Building CUDA object ggml/src/ggml-cuda/CMakeFiles/mmq.cu.o"),
        ("ninja", "[168/168] Linking CXX executable bin/llama-server", 100.0, "Linking CXX executable bin/llama-server"),
        ("make", "[ 42%] Building CXX object src/CMakeFiles/llama.dir/llama.cpp.o", 42.0, "Building CXX object src/CMakeFiles/llama.dir/llama.cpp.o"),
        ("cmake", "-- Using CMAKE_CUDA_ARCHITECTURES=75", None, "Using CMAKE_CUDA_ARCHITECTURES=75"),
        ("cargo", "   Compiling candle-kernels v0.9.2", None, "Compiling candle-kernels v0.9.2"),
        ("cargo", "    Building [=======>                 ] 120/480: candle-core, mistralrs-quant(build)", 25.0, "candle-core, mistralrs-quant(build)"),
        ("cargo", "    Finished `release` profile [optimized] target(s) in 41m 02s", None, "Finished `release` profile [optimized] target(s) in 41m 02s"),
        ("git", "Receiving objects:  42% (4200/10000), 1.20 MiB | 3.00 MiB/s", 42.0, "Receiving objects"),
    ],
)
def test_parse_progress(kind: str, line: str, percent: float | None, label: str) -> None:
    p = parse_progress(kind, line)
    assert p is not None and p.percent == percent and p.label == label


def test_parse_progress_ignores_other_lines() -> None:
    assert parse_progress("ninja", "nvcc warning : something") is None
    assert parse_progress("cargo", "warning: unused variable") is None
    assert parse_progress("none", "[1/2] x") is None
    assert format_seconds(59) == "59s" and format_seconds(61) == "1m01s" and format_seconds(3723) == "1h02m03s"


def _run(tmp: Path, recipe, arch: str = "75"):
    src = tmp / "src"
    src.mkdir(exist_ok=True)
    plan = plan_build(recipe, arch=arch, source_dir=src, out=tmp / "out", jobs=2)
    stream = io.StringIO()
    record, report = execute(plan, [], printer=StatusPrinter(stream, interval=0), command_line="t4patch build fake")
    return plan, stream.getvalue(), record, report


def test_successful_build_writes_log_record_and_checks_artifacts(tmp_path: Path) -> None:
    plan, shown, record, report = _run(tmp_path, _recipe(tmp_path))
    assert record is not None, shown
    assert "==> [1/2] configure" in shown and "==> [2/2] build" in shown
    assert " 25% Building CUDA object k1.cu.o" in shown and "100% Building CUDA object k4.cu.o" in shown
    assert "build done in" in shown
    log = plan.log_path.read_text()
    assert "-- configured for 75" in log and "[3/4] Building CUDA object k3.cu.o" in log and "progress 90%" in log
    assert "### env: FAKE_CAP=75" in log
    saved = json.loads(plan.record_path.read_text())
    assert saved == record
    assert record["status"] == "ok" and record["arch"] == "75" and record["env"] == {"FAKE_CAP": "75"}
    assert record["source"]["kind"] == "directory" and len(record["source"]["tree_sha256"]) == 64
    assert set(record["durations"]) == {"configure", "build", "total"}
    (art,) = record["artifacts"]
    assert art["path"] == "build/lib/libfake.so" and len(art["sha256"]) == 64
    assert art["cuda"]["sass"] == ["sm_75"]
    assert record["verification"]["ok"] is True and report.ok


def test_build_without_sm75_code_fails_loudly(tmp_path: Path) -> None:
    # The tool "ignores" the requested arch and emits sm_86 only: every step exits 0, the build still fails.
    recipe = _recipe(tmp_path, sm="86")
    src = tmp_path / "src"
    src.mkdir()
    plan = plan_build(recipe, arch="75", source_dir=src, out=tmp_path / "out")
    with pytest.raises(VerificationError) as info:
        execute(plan, [], printer=StatusPrinter(io.StringIO()))
    assert "no sm_75 SASS" in str(info.value) and "SASS only for sm_86" in str(info.value)
    assert info.value.exit_code == 12
    record = json.loads(plan.record_path.read_text())
    assert record["status"] == "failed" and record["verification"]["ok"] is False


def test_build_without_cuda_code_fails(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, sm="none")
    src = tmp_path / "src"
    src.mkdir()
    plan = plan_build(recipe, arch="75", source_dir=src, out=tmp_path / "out")
    with pytest.raises(VerificationError, match="carries no CUDA code|not a CUDA build"):
        execute(plan, [], printer=StatusPrinter(io.StringIO()))


def test_failed_step_shows_tail_log_path_and_known_cause(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, mode="fail")
    src = tmp_path / "src"
    src.mkdir()
    plan = plan_build(recipe, arch="75", source_dir=src, out=tmp_path / "out")
    stream = io.StringIO()
    with pytest.raises(BuildError) as info:
        execute(plan, [], printer=StatusPrinter(stream), command_line="t4patch build fake")
    message = str(info.value)
    assert "step 'build' failed (exit 3)" in message and str(plan.log_path) in message
    assert "mistral.rs #2092" in message and "\n" not in message
    shown = stream.getvalue()
    assert "last " in shown and "Unresolved extern function" in shown and "build FAILED in" in shown
    record = json.loads(plan.record_path.read_text())
    assert record["status"] == "failed" and [s["name"] for s in record["steps"]] == ["configure", "build"]
    assert record["steps"][1]["returncode"] == 3 and "build" in record["durations"]
    assert "exit 3" in record["error"]


def test_tool_that_cannot_start(tmp_path: Path) -> None:
    doc_recipe = _recipe(tmp_path)
    bad = parse_recipe({
        "schema": 1, "name": "fake", "summary": "s", "repository": "https://example.invalid/x", "default_ref": "v1",
        "build_dir": "build", "min_free_gib": 0,
        "step": [{"name": "build", "argv": ["/nonexistent/tool-t4patch"]}],
        "artifacts": {"files": ["x"]},
    })
    assert doc_recipe.name == bad.name
    src = tmp_path / "src"
    src.mkdir()
    plan = plan_build(bad, source_dir=src, out=tmp_path / "o")
    with pytest.raises(BuildError, match="could not start '/nonexistent/tool-t4patch'"):
        execute(plan, [], printer=StatusPrinter(io.StringIO()))


def test_missing_artifact_is_a_build_error(tmp_path: Path) -> None:
    recipe = parse_recipe({
        "schema": 1, "name": "fake", "summary": "s", "repository": "https://example.invalid/x", "default_ref": "v1",
        "build_dir": "build", "min_free_gib": 0,
        "step": [{"name": "build", "argv": [sys.executable, "-c", "pass"]}],
        "artifacts": {"files": ["bin/llama-server"]},
    })
    src = tmp_path / "src"
    src.mkdir()
    plan = plan_build(recipe, source_dir=src, out=tmp_path / "o")
    with pytest.raises(BuildError, match="produced no bin/llama-server"):
        execute(plan, [], printer=StatusPrinter(io.StringIO()))


def test_tty_progress_rewrites_one_line(tmp_path: Path) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    recipe = _recipe(tmp_path)
    src = tmp_path / "src"
    src.mkdir()
    plan = plan_build(recipe, source_dir=src, out=tmp_path / "out")
    stream = Tty()
    execute(plan, [], printer=StatusPrinter(stream))
    assert "\r" in stream.getvalue()


@pytest.mark.skipif(shutil.which("git") is None, reason="git not on PATH")
def test_clone_path_against_local_bare_repository(tmp_path: Path) -> None:
    """The clone + checkout steps and the ref verification, with a bare repository as the 'remote'."""
    work = tmp_path / "upstream"
    work.mkdir()

    def git(*args: str, cwd: Path = work) -> str:
        return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True,
                              env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
                                   "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid",
                                   "HOME": str(tmp_path), "PATH": "/usr/bin:/bin:/usr/local/bin"}).stdout.strip()

    git("init", "-q", "-b", "main")
    (work / "a.txt").write_text("one\n")
    git("add", "a.txt")
    git("commit", "-q", "-m", "one")
    first = git("rev-parse", "HEAD")
    git("tag", "v1")
    (work / "a.txt").write_text("two\n")
    git("commit", "-q", "-am", "two")
    second = git("rev-parse", "HEAD")
    bare = tmp_path / "remote.git"
    git("clone", "-q", "--bare", str(work), str(bare), cwd=tmp_path)

    recipe = _recipe(tmp_path)
    for ref, expected in (("v1", first), (second[:9], second), ("main", second)):
        out = tmp_path / f"out-{ref}"
        plan = plan_build(recipe, ref=ref, repository=f"file://{bare}", out=out)
        assert [s.name for s in plan.steps[:3]] == ["clone", "resolve-ref", "checkout"]
        record, _ = execute(plan, [], printer=StatusPrinter(io.StringIO()))
        src = record["source"]
        assert src["commit"] == expected and src["ref_verified"] is True and src["requested_ref"] == ref
        assert (out / "src" / "a.txt").read_text() == ("one\n" if ref == "v1" else "two\n")

    # A rebuild in the same output directory reuses the clone (fetch instead of clone).
    plan = plan_build(recipe, ref="v1", repository=f"file://{bare}", out=tmp_path / "out-main")
    assert [s.name for s in plan.steps[:3]] == ["fetch", "resolve-ref", "checkout"]
    record, _ = execute(plan, [], printer=StatusPrinter(io.StringIO()))
    assert record["source"]["commit"] == first

    # A ref that does not exist fails before the checkout step, naming the ref.
    plan = plan_build(recipe, ref="v9", repository=f"file://{bare}", out=tmp_path / "out-bad")
    with pytest.raises(BuildError, match="ref 'v9' does not name a commit"):
        execute(plan, [], printer=StatusPrinter(io.StringIO()))


def test_interrupt_stops_the_whole_process_group_and_records_it(tmp_path: Path) -> None:
    """SIGTERM/Ctrl-C during a step: the tool *and its children* stop, the record says 'interrupted'."""
    import os
    import signal
    import threading
    import time as _time

    pidfile = tmp_path / "child.pid"
    script = (f"import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
              f"open({str(pidfile)!r}, 'w').write(str(c.pid)); print('[1/2] started', flush=True); time.sleep(60)")
    recipe = parse_recipe({
        "schema": 1, "name": "fake", "summary": "s", "repository": "https://example.invalid/x", "default_ref": "v1",
        "build_dir": "build", "min_free_gib": 0,
        "step": [{"name": "build", "argv": [sys.executable, "-c", script], "progress": "ninja"}],
        "artifacts": {"files": ["x"]},
    })
    src = tmp_path / "src"
    src.mkdir()
    plan = plan_build(recipe, source_dir=src, out=tmp_path / "o")

    def interrupt() -> None:
        for _ in range(200):
            if pidfile.exists() and pidfile.read_text():
                break
            _time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)  # what a CI timeout or `kill` sends

    from t4patch.commands.build import _sigterm_as_interrupt

    previous = signal.getsignal(signal.SIGTERM)
    _sigterm_as_interrupt()
    try:
        threading.Thread(target=interrupt, daemon=True).start()
        started = _time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            execute(plan, [], printer=StatusPrinter(io.StringIO()))
        assert _time.monotonic() - started < 30  # stopped, not waited out (the step sleeps 60 s)
    finally:
        signal.signal(signal.SIGTERM, previous)
    grandchild = int(pidfile.read_text())
    for _ in range(100):
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        _time.sleep(0.05)
    else:
        os.kill(grandchild, signal.SIGKILL)
        pytest.fail("the step's child process survived the interrupt")
    record = json.loads(plan.record_path.read_text())
    assert record["status"] == "interrupted"
    assert "interrupted after" in plan.log_path.read_text()


def test_stop_reaches_children_in_their_own_process_groups(tmp_path: Path) -> None:
    """ninja starts each compile in a process group of its own: stopping the step must stop those too."""
    import os
    import subprocess
    import time as _time

    from t4patch.builder.runner import stop_process_group

    pidfile = tmp_path / "child.pid"
    # The child ignores SIGTERM, like a compiler stuck in I/O would not exit at once: only SIGKILL ends it.
    child = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
    script = (f"import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', {child!r}], "
              f"start_new_session=True); open({str(pidfile)!r}, 'w').write(str(c.pid)); time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    for _ in range(200):
        if pidfile.exists() and pidfile.read_text():
            break
        _time.sleep(0.05)
    grandchild = int(pidfile.read_text())
    assert os.getpgid(grandchild) not in (proc.pid, os.getpgid(0))  # really in a group of its own
    started = _time.monotonic()
    stop_process_group(proc)
    assert proc.returncode is not None and _time.monotonic() - started < 20
    for _ in range(100):  # it is re-parented and reaped by init; wait for that
        try:
            with open(f"/proc/{grandchild}/stat") as fh:
                if fh.read().split(")")[-1].split()[0] == "Z":
                    break
        except FileNotFoundError:
            break
        _time.sleep(0.05)
    else:
        pytest.fail(f"process {grandchild} (own process group) survived stop_process_group")
