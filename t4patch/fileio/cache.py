"""The one rule for where t4patch keeps what it downloads, decompresses or compiles between runs.

Everything lives under ``$XDG_CACHE_HOME/t4patch`` (``~/.cache/t4patch`` when the variable is unset or empty),
one folder per kind. A kind may have its own environment variable that replaces its folder outright
(``T4PATCH_WHEEL_CACHE`` for released wheels, ``TRITON_CACHE_DIR`` for compiled Triton kernels), so a user who
already points Triton or a CI cache somewhere keeps that place. Nothing here creates a folder: the caller does,
at the moment it writes, so a read-only command never leaves an empty cache behind.
"""

from __future__ import annotations

import os
from pathlib import Path

# kind -> the environment variable that replaces its folder (kinds not listed have none)
_OVERRIDES = {
    "wheels": "T4PATCH_WHEEL_CACHE",
    "triton": "TRITON_CACHE_DIR",
}


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/t4patch``, or ``~/.cache/t4patch``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    return Path(base).expanduser() / "t4patch"


def cache_dir(kind: str) -> Path:
    """The folder for one kind of cached thing (``wheels``, ``sdists``, ``triton``, ``vllm-lib``, ...)."""
    override = _OVERRIDES.get(kind)
    if override and os.environ.get(override):
        return Path(os.environ[override]).expanduser()
    return cache_root() / kind
