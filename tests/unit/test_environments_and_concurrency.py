"""Targeting another interpreter, concurrent runs, and keeping light commands light."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import venv
from pathlib import Path

import pytest

from t4patch.errors import LockBusyError, TargetEnvironmentError, UsageError
from t4patch.patching.execute import environment_lock
from tests.helpers import KERNEL_PATCHED, make_dist

REPO = Path(__file__).resolve().parents[2]


def run_t4patch(*argv: str, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "t4patch", *argv], capture_output=True, text=True, env=env)


def test_python_option_targets_a_second_venv(tmp_path, env, cli):
    """t4patch runs here; the engine lives in another venv, reached through --python."""
    serving = tmp_path / "serving"
    venv.EnvBuilder(with_pip=False).create(serving)
    py = serving / "bin" / "python"
    purelib = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], capture_output=True, text=True,
        check=True,
    ).stdout.strip()
    make_dist(Path(purelib))

    result = cli("apply", "fakeengine", "--python", str(py))
    assert result.code == 0, result.err
    assert (Path(purelib) / "fakeengine" / "kernel.py").read_text() == KERNEL_PATCHED
    status = json.loads(cli("status", "--json", "--python", str(py)).out)
    assert status["engines"][0]["state"] == "applied"
    assert status["target"]["python"].startswith(str(serving))
    # the env fixture's own site (not targeted) is untouched
    assert "tile = 16" not in (env.site / "fakeengine" / "kernel.py").read_text()


def test_bad_targets(tmp_path, cli):
    missing = cli("status", "--python", str(tmp_path / "nope"))
    assert missing.code == TargetEnvironmentError.exit_code and "expected an executable" in missing.err
    not_dir = tmp_path / "f"
    not_dir.write_text("")
    assert cli("status", "--site-packages", str(not_dir)).code == TargetEnvironmentError.exit_code
    from t4patch.environment.target import resolve_target

    with pytest.raises(UsageError):
        resolve_target(python=sys.executable, site_packages=str(tmp_path))


def test_lock_is_exclusive_and_times_out(tmp_path):
    holder_ready = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with environment_lock(tmp_path):
            holder_ready.set()
            release.wait(5)

    thread = threading.Thread(target=hold)
    thread.start()
    holder_ready.wait(5)
    try:
        with pytest.raises(LockBusyError, match="another t4patch run"), environment_lock(tmp_path, timeout_s=0.2):
            pass
    finally:
        release.set()
        thread.join()
    with environment_lock(tmp_path, timeout_s=0.2):  # free again
        pass


def test_concurrent_applies_do_not_interleave(env):
    """Eight processes apply at once: all succeed, exactly one writes, the result is the patched file."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "t4patch", "apply", "fakeengine", "--site-packages", str(env.site), "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": str(REPO), "T4PATCH_PATCHES": str(env.patches)},
        )
        for _ in range(8)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * 8, [o[1] for o in outputs]
    writers = [json.loads(out)["results"][0]["already_done"] for out, _ in outputs].count(False)
    assert writers == 1
    assert (env.site / "fakeengine" / "kernel.py").read_text() == KERNEL_PATCHED


LIGHT_COMMANDS_PROBE = textwrap.dedent(
    """
    import json, sys
    from t4patch.cli import main
    site = sys.argv[1]
    for argv in (["list"], ["status", "--site-packages", site], ["doctor", "--site-packages", site],
                 ["apply", "fakeengine", "--site-packages", site], ["revert", "fakeengine", "--site-packages", site]):
        assert main(argv) == 0, argv
    heavy = sorted(m for m in ("torch", "triton", "vllm", "sglang", "numpy") if m in sys.modules)
    print(json.dumps(heavy))
    """
)


def test_light_commands_import_no_heavy_modules(env):
    proc = subprocess.run(
        [sys.executable, "-c", LIGHT_COMMANDS_PROBE, str(env.site)],
        capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "T4PATCH_PATCHES": str(env.patches)},
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []


def test_user_errors_are_one_line_without_traceback(env):
    proc = run_t4patch("apply", "fakeengine==9", "--site-packages", str(env.site),
                       env_extra={"T4PATCH_PATCHES": str(env.patches)})
    assert proc.returncode == 5
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    debug = run_t4patch("--debug", "apply", "fakeengine==9", "--site-packages", str(env.site),
                        env_extra={"T4PATCH_PATCHES": str(env.patches)})
    assert "Traceback" in debug.stderr and debug.returncode == 5


def test_internal_errors_are_labelled_as_bugs(monkeypatch, env, cli):
    import t4patch.commands.list as list_command

    monkeypatch.setattr(list_command, "all_patch_sets", lambda: (_ for _ in ()).throw(RuntimeError("kaboom")))
    result = cli("list")
    assert result.code == 70 and "internal error" in result.err and "this is a bug" in result.err
