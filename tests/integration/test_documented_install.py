"""The documented ways to install t4patch work as written on a fresh machine (t4patch is not on PyPI).

The docs show two: ``pip install /path/to/t4patch-checkout`` into a venv of t4patch's own, and a wheel built
with ``python -m build --wheel`` installed with ``pip install dist/t4patch-*.whl``. Each documented line is
taken from the Markdown, the placeholder replaced by this checkout and ``~`` by a scratch HOME, and run by the
shell; then the commands the docs run next (``t4patch --help``, ``t4patch list``) must work from that venv.
The ``[verify]`` extra (torch + Triton, gigabytes) is not installed here: ``.ci/run`` installs it itself.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PLACEHOLDER = "/path/to/t4patch-checkout"
CHECKOUT_INSTALL = re.compile(r"^python3 -m venv (?P<venv>~/\S+) && (?P=venv)/bin/pip install " + re.escape(PLACEHOLDER) + "$")


def documented_lines() -> list[tuple[str, int, str]]:
    found = []
    for page in sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md")]):
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1):
            if PLACEHOLDER in line or "pip install dist/t4patch-" in line:
                found.append((str(page.relative_to(REPO)), number, line.strip()))
    return found


def _run(command: str, home: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {"HOME": str(home), "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, cwd=cwd, env=env, timeout=900)


def test_every_documented_checkout_install_is_the_one_tested():
    """Each line naming the checkout placeholder is the tested install line, or prose around it."""
    lines = [entry for entry in documented_lines() if PLACEHOLDER in entry[2]]
    commands = [entry for entry in lines if entry[2].startswith("python3 -m venv")]
    assert len(commands) >= 3, f"expected the checkout install in the index and the engine pages, found {commands}"
    odd = [f"{page}:{number}: {text}" for page, number, text in commands if not CHECKOUT_INSTALL.match(text)]
    assert not odd, "documented checkout installs this test does not run:\n" + "\n".join(odd)


def test_checkout_install_as_documented(tmp_path):
    page, number, line = next(e for e in documented_lines() if CHECKOUT_INSTALL.match(e[2]))
    home = tmp_path / "home"
    home.mkdir()
    command = line.replace(PLACEHOLDER, str(REPO))
    result = _run(command, home, tmp_path)
    assert result.returncode == 0, f"{page}:{number}: {line}\n{result.stderr[-2000:]}"
    venv = CHECKOUT_INSTALL.match(line)["venv"].replace("~", str(home), 1)  # type: ignore[index]
    t4patch = Path(venv) / "bin" / "t4patch"
    assert _run(f"{t4patch} --help", home, tmp_path).returncode == 0
    listed = _run(f"{t4patch} list", home, tmp_path)
    assert listed.returncode == 0 and "vllm==0.33.0" in listed.stdout, listed.stderr


def test_wheel_install_as_documented(tmp_path):
    documented = [e for e in documented_lines() if "pip install dist/t4patch-" in e[2]]
    assert documented, "the docs no longer show the wheel install; update this test"
    checkout = tmp_path / "checkout"
    shutil.copytree(REPO, checkout, ignore=shutil.ignore_patterns(".git", ".venv*", ".scratch", "dist", "build",
                                                                   "t4patch-build", "__pycache__", ".pytest_cache"))
    home = tmp_path / "home"
    home.mkdir()
    built = _run(f"{sys.executable} -m build --wheel", home, checkout)
    assert built.returncode == 0, built.stderr[-2000:]
    venv = tmp_path / "venv"
    assert _run(f"python3 -m venv {venv}", home, checkout).returncode == 0
    installed = _run(f"{venv}/bin/pip install dist/t4patch-*.whl", home, checkout)
    assert installed.returncode == 0, installed.stderr[-2000:]
    listed = _run(f"{venv}/bin/t4patch list", home, tmp_path)
    assert listed.returncode == 0 and "sglang==0.5.23" in listed.stdout, listed.stderr
