"""The one place that finds the CUDA compiler: nvcc on PATH, else under $CUDA_HOME, $CUDA_PATH, /usr/local/cuda.

Used by ``t4patch build`` (preflight, the torch-extension toolchain) and by doctor's readiness check, so both name
the same nvcc for the same machine.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable

_RELEASE = re.compile(r"release (\d+\.\d+)")


def find_nvcc(which: Callable[[str], str | None] = shutil.which, environ: dict[str, str] | None = None) -> str | None:
    """nvcc on PATH, else $CUDA_HOME/bin/nvcc, $CUDA_PATH/bin/nvcc, /usr/local/cuda/bin/nvcc (executable); or None."""
    environ = dict(os.environ) if environ is None else environ
    found = which("nvcc")
    if found:
        return found
    for root in (environ.get("CUDA_HOME"), environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and os.access(os.path.join(root, "bin", "nvcc"), os.X_OK):
            return os.path.join(root, "bin", "nvcc")
    return None


def nvcc_release(nvcc: str | None = None, *, timeout: float = 5.0) -> tuple[str | None, str | None]:
    """(path, CUDA release such as "13.0") of ``nvcc`` (default: :func:`find_nvcc`'s); (None, None) without one,
    (path, None) when it does not say its release."""
    path = nvcc or find_nvcc()
    if path is None:
        return None, None
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=timeout, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return path, None
    match = _RELEASE.search(out or "")
    return path, match.group(1) if match else None
