"""Real released wheels for integration tests: downloaded once, cached, installed into temp dirs.

A patch set is only proven against the pristine released files, so tests fetch the real wheel with
``pip download --no-deps`` into ``$T4PATCH_WHEEL_CACHE`` (default ``~/.cache/t4patch/wheels``) and install it
with ``pip install --no-deps --no-compile --target`` so nothing of the engine is imported or compiled.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from packaging.utils import canonicalize_name


def cache_dir() -> Path:
    path = Path(os.environ.get("T4PATCH_WHEEL_CACHE", "~/.cache/t4patch/wheels")).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path


def _find_cached(name: str, version: str) -> Path | None:
    prefix = f"{canonicalize_name(name).replace('-', '_')}-{version}-"
    for wheel in sorted(cache_dir().glob("*.whl")):
        if wheel.name.lower().startswith(prefix):
            return wheel
    return None


def wheel_path(name: str, version: str) -> Path:
    """The cached wheel of ``name==version``, downloading it (no dependencies) on first use."""
    cached = _find_cached(name, version)
    if cached is not None:
        return cached
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q",
         "-d", str(cache_dir()), f"{name}=={version}"],
        check=True,
    )
    cached = _find_cached(name, version)
    if cached is None:
        raise RuntimeError(f"pip download {name}=={version} produced no wheel in {cache_dir()}")
    return cached


def install_wheel_to(target: Path, wheel: Path) -> Path:
    """Install ``wheel`` into ``target`` (created) without dependencies or bytecode; return ``target``."""
    target.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
         "--disable-pip-version-check", "--target", str(target), str(wheel)],
        check=True,
    )
    return target
