"""The built t4patch wheel carries its data: installed in a fresh venv, it finds its patch sets."""

from __future__ import annotations

import json
import subprocess
import sys
import venv
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def test_built_wheel_ships_patch_sets(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(REPO)], check=True
    )
    (wheel,) = dist.glob("t4patch-*.whl")
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel)], check=True)
    out = subprocess.run(
        [str(env_dir / "bin" / "t4patch"), "list", "--json"], capture_output=True, text=True, check=True, cwd=tmp_path
    ).stdout
    specs = {f"{p['distribution']}=={p['version']}" for p in json.loads(out)["patch_sets"]}
    assert "vllm==0.33.0" in specs
    location = subprocess.run(
        [str(py), "-c", "from t4patch.data.locations import data_dir; print(data_dir('patches'))"],
        capture_output=True, text=True, check=True, cwd=tmp_path,
    ).stdout.strip()
    assert "_data" in location and str(REPO) not in location, location
    assert subprocess.run([str(py), "-m", "t4patch", "--version"], capture_output=True, text=True).returncode == 0
