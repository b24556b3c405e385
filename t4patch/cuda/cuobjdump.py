"""The one wrapper around NVIDIA's ``cuobjdump``: finding it, running it, reading its listings.

t4patch reads fatbins itself (:mod:`t4patch.cuda.fatbin`) because cuobjdump is often not installed (the pip
CUDA wheels do not ship it); where it is, it is an independent second reader, so the artifact check, the
SGLang doctor check and ``verify attention``'s register count all ask it through here. Every failure to run
it (missing, not executable, a timeout, a non-zero exit on a file it cannot read) is "no answer" (None), never
an error: a cross-check that is not available is reported as such by the caller.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from t4patch.cuda.arch import Arch

TOOL = "cuobjdump"
LIST_TIMEOUT = 600  # seconds: listing a 300 MB engine library takes a while on a small CPU
# The architecture in a listing's file name ("ELF file 1: libx.1.sm_75.cubin"): only the suffix, so an artifact
# whose own name contains "sm_80" cannot add an architecture.
_LISTED_ARCH = re.compile(r"\.sm_(\d+)[af]?\.(?:cubin|ptx)\b")
_NO_DEVICE_CODE = "does not contain device code"
_RES_USAGE = re.compile(r"REG:(?P<reg>\d+)\s+STACK:(?P<stack>\d+)\s+SHARED:(?P<shared>\d+)\s+LOCAL:(?P<local>\d+)")


def find_cuobjdump() -> str | None:
    """The cuobjdump on PATH, or None."""
    return shutil.which(TOOL)


@dataclass(frozen=True)
class CodeListing:
    """What ``cuobjdump --list-elf`` / ``--list-ptx`` named in one file: one architecture per listed entry."""

    sass_entries: tuple[int, ...] = ()  # e.g. (75, 75, 80): the SM of every cubin listed
    ptx_entries: tuple[int, ...] = ()  # the target of every PTX file listed

    @property
    def sass(self) -> list[str]:
        """Sorted SASS architecture names: ``["sm_75", "sm_80"]``."""
        return [f"sm_{n}" for n in sorted(set(self.sass_entries))]

    @property
    def ptx(self) -> list[str]:
        """Sorted PTX architecture names: ``["compute_75"]``."""
        return [f"compute_{n}" for n in sorted(set(self.ptx_entries))]

    def cubins_for(self, arch: Arch) -> int:
        """How many cubins (one per fatbin container) carry SASS for ``arch``."""
        return sum(1 for n in self.sass_entries if n == arch.capability)

    def to_dict(self) -> dict[str, list[str]]:
        return {"sass": self.sass, "ptx": self.ptx}


def _listed(tool: str, flag: str, path: Path, timeout: float) -> tuple[int, ...] | None:
    try:
        proc = subprocess.run([tool, flag, str(path)], capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    text = proc.stdout + proc.stderr
    if proc.returncode != 0 and _NO_DEVICE_CODE not in text:
        return None
    return tuple(int(m) for line in text.splitlines() if " file " in line for m in _LISTED_ARCH.findall(line))


def list_code(path: str | Path, *, tool: str | None = None, ptx: bool = True,
              timeout: float = LIST_TIMEOUT) -> CodeListing | None:
    """cuobjdump's listing of ``path`` (SASS from --list-elf, PTX from --list-ptx unless ``ptx`` is False).

    ``tool`` is the cuobjdump to run (default: the one on PATH). None when there is none or it cannot read the
    file; a file without device code lists nothing (an empty listing, not None).
    """
    tool = tool or find_cuobjdump()
    if tool is None:
        return None
    sass_entries = _listed(tool, "--list-elf", Path(path), timeout)
    if sass_entries is None:
        return None
    if not ptx:
        return CodeListing(sass_entries, ())
    ptx_entries = _listed(tool, "--list-ptx", Path(path), timeout)
    return None if ptx_entries is None else CodeListing(sass_entries, ptx_entries)


@dataclass(frozen=True)
class ResourceUsage:
    registers: int
    stack: int  # bytes per thread (spills and local arrays)
    shared: int
    local: int


def resource_usage(cubin: bytes, *, tool: str) -> tuple[ResourceUsage | None, str | None]:
    """``cuobjdump -res-usage`` of a single-kernel cubin: (usage, None) or (None, why there is none)."""
    if not os.path.exists(tool):
        return None, f"{tool} does not exist"
    fd, name = tempfile.mkstemp(suffix=".cubin")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(cubin)
        try:
            proc = subprocess.run([tool, "-res-usage", name], capture_output=True, text=True, check=False,
                                  timeout=LIST_TIMEOUT)
        except (OSError, subprocess.SubprocessError) as exc:
            return None, f"cuobjdump -res-usage could not run ({exc})"
    finally:
        os.unlink(name)
    match = _RES_USAGE.search(proc.stdout)
    if proc.returncode != 0 or match is None:
        return None, f"cuobjdump -res-usage gave no resource line (exit {proc.returncode})"
    return ResourceUsage(int(match["reg"]), int(match["stack"]), int(match["shared"]), int(match["local"])), None
