"""Helpers shared by the test suite, in one module: ``from tests.helpers import ...``.

Tests never import other test modules (or ``conftest``); whatever two test files need lives here. pytest finds
this module through ``pythonpath = ["."]`` in pyproject.toml (``tests`` is a package), so no test touches
``sys.path``.

- A synthetic installed engine and patch set: "fakeengine" 1.2.0 is a real distribution as pip leaves it (a
  package plus a .dist-info with METADATA and a RECORD holding sha256 of every file); the patch set is made the
  way a maintainer makes one: edit a copy, ``diff -u``, pin both hashes.
- Synthetic CUDA fatbins (containers, entries, cubin headers) and the small CUDA kernel nvcc compiles.
- A synthetic build recipe whose build step is a small Python program printing ninja-style progress.
- Real released wheels: ``pip download --no-deps`` once into ``$T4PATCH_WHEEL_CACHE`` (default
  ``~/.cache/t4patch/wheels``), installed with ``pip install --no-deps --no-compile --target`` so nothing of the
  engine is imported or compiled. Downloads and installs print progress lines through :func:`progress`, which
  reaches the terminal past pytest's output capture (conftest wires it), so ``pytest -q`` never sits silent
  while ~330 MB wheels arrive.
"""

from __future__ import annotations

import base64
import difflib
import hashlib
import importlib.metadata
import inspect
import json
import os
import re
import shutil
import stat
import struct
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from packaging.version import InvalidVersion, Version

from t4patch.builder.recipe import Recipe, parse_recipe
from t4patch.cuda.fatbin import FATBIN_MAGIC
from t4patch.cuda.gpu import Gpu

# ----------------------------------------------------------------------------------------------- progress

_progress_sink: Callable[[str], None] | None = None


def set_progress_sink(sink: Callable[[str], None] | None) -> None:
    """Route :func:`progress` lines (conftest points this at the terminal, past pytest's capture)."""
    global _progress_sink
    _progress_sink = sink


def progress(message: str) -> None:
    """One progress line for a long step, shown even under ``pytest -q`` without ``-s``."""
    line = f"[t4patch tests] {message}"
    if _progress_sink is not None:
        _progress_sink(line)
    else:  # outside pytest (a helper used from a script): plain stderr
        print(line, file=sys.__stderr__, flush=True)


# ------------------------------------------------------------------------ synthetic engine and patch set

KERNEL = textwrap.dedent(
    '''\
    """A stand-in engine kernel module."""


    def tile_size(head_size, capability):
        tile = 32
        return tile


    def other():
        return "unchanged"
    '''
)
KERNEL_PATCHED = KERNEL.replace(
    "    tile = 32\n",
    "    tile = 32\n    # t4patch: cc < 8.0 gets a smaller tile\n"
    "    if capability < (8, 0):\n        tile = 16\n",
)
CONFIG = "MIN_CAPABILITY = 80\nNAME = 'fake'\n"
CONFIG_PATCHED = "MIN_CAPABILITY = 75\nNAME = 'fake'\n"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def record_hash(data: bytes) -> str:
    """A RECORD row's hash field: ``sha256=`` and the urlsafe base64 digest without padding."""
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_dist(site: Path, name: str = "fakeengine", version: str = "1.2.0", files: dict[str, str] | None = None) -> Path:
    """Write an installed distribution (package files, METADATA, RECORD) into ``site``; return ``site``."""
    files = files if files is not None else {
        f"{name}/__init__.py": "",
        f"{name}/kernel.py": KERNEL,
        f"{name}/config.py": CONFIG,
    }
    site.mkdir(parents=True, exist_ok=True)
    dist_info = site / f"{name}-{version}.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    rows = []
    for rel, text in files.items():
        path = site / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        rows.append(f"{rel},{record_hash(text.encode())},{len(text.encode())}")
    rows.append(f"{dist_info.name}/METADATA,,")
    rows.append(f"{dist_info.name}/RECORD,,")
    (dist_info / "RECORD").write_text("\n".join(rows) + "\n")
    return site


def companions_standin(site: Path, patch_set: Any) -> Path:
    """A stand-in for each companion ``patch_set`` requires ([[requires]]): its metadata at the required release,
    the released (pristine) files its own patch set targets, from the real wheel, and an empty file where its
    compiled library goes. For real-wheel tests of something else (apply/revert, options, wheels, the redirect)
    whose ``status --check`` would otherwise fail on the missing companion, as it must; the real companions are
    proven in tests/integration/test_status_check_real.py."""
    from t4patch.errors import T4PatchError
    from t4patch.patching.registry import find_patch_set

    for needed in patch_set.requires:
        files = {needed.library or f"{needed.distribution}/__init__.py": ""}
        try:
            own = find_patch_set(needed.distribution, needed.version)
        except T4PatchError:
            own = None
        if own is not None:
            tree = extracted_wheel(wheel_path(needed.distribution, needed.version))
            files.update({t.path: (tree / t.path).read_text(encoding="utf-8") for t in own.targets})
        make_dist(site, name=needed.distribution, version=needed.version, files=files)
    return site


def unified(path: str, old: str, new: str) -> str:
    """A ``diff -u`` of ``old`` -> ``new`` with ``a/<path>`` / ``b/<path>`` headers."""
    return "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True), new.splitlines(keepends=True), fromfile=f"a/{path}", tofile=f"b/{path}"
        )
    )


def make_patch_set(
    root: Path,
    name: str = "fakeengine",
    version: str = "1.2.0",
    changes: list[tuple[str, str, str]] | None = None,
    packages: str | None = None,
) -> Path:
    """Write patches/<name>/<version>/ with one diff per (path, old, new) change."""
    changes = changes if changes is not None else [
        (f"{name}/kernel.py", KERNEL, KERNEL_PATCHED),
        (f"{name}/config.py", CONFIG, CONFIG_PATCHED),
    ]
    directory = root / name / version
    directory.mkdir(parents=True)
    lines = [
        "schema = 1",
        f'distribution = "{name}"',
        f'version = "{version}"',
        f'packages = {packages or repr([name]).replace(chr(39), chr(34))}',
        'summary = "synthetic patch set for tests"',
    ]
    for number, (path, old, new) in enumerate(changes, start=1):
        file = f"{number:04d}-change-{number}.diff"
        (directory / file).write_text(unified(path, old, new))
        lines += [
            "", "[[patch]]", f'file = "{file}"', f'title = "change {number}"',
            'fixes = "a failure"', 'gpus = "cc < 8.0"', 'references = ["https://example.invalid/1"]',
        ]
    for path, old, new in changes:
        lines += [
            "", "[[target]]", f'path = {json.dumps(path)}',
            f'pristine_sha256 = "{sha(old.encode())}"', f'patched_sha256 = "{sha(new.encode())}"',
        ]
    (directory / "manifest.toml").write_text("\n".join(lines) + "\n")
    return directory


@dataclass
class Env:
    """The ``env`` fixture: a site-packages with fakeengine installed and the patch-set root it is pointed at."""

    site: Path
    patches: Path

    def file(self, rel: str) -> Path:
        return self.site / rel

    def snapshot(self) -> dict[str, bytes]:
        return {str(p.relative_to(self.site)): p.read_bytes() for p in sorted(self.site.rglob("*")) if p.is_file()}


@dataclass
class Result:
    """What the ``cli`` fixture returns: exit code and captured stdout / stderr."""

    code: int
    out: str
    err: str


# A Tesla T4 as the CUDA driver reports it (compute capability 7.5, 64 KiB opt-in shared memory per block).
T4 = Gpu(0, "Tesla T4", "7.5", 65536, 40, 16 * 2**30)

# ----------------------------------------------------------------------------------------- CUDA fatbins

NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH: the CUDA toolkit compiler is needed to "
                                "compile the real test objects (synthetic fatbin tests still run)")

# A kernel plus an extern "C" launcher; NAME is replaced per object so several can be linked together.
CUDA_KERNEL = """
__global__ void axpy(float *y, const float *x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += a * x[i];
}
extern "C" void launch_NAME(float *y, const float *x, float a, int n) { axpy<<<(n + 255) / 256, 256>>>(y, x, a, n); }
"""


def cubin(sm: int, abi: int = 8) -> bytes:
    """A minimal ELF64 cubin header: e_machine 190 (CUDA), SM in e_flags as the given ABI version stores it."""
    ident = b"\x7fELF" + bytes([2, 1, 1, 0x41 if abi >= 8 else 0x33, abi]) + b"\0" * 7
    flags = (sm << 8) | 0x6000004 if abi >= 8 else sm | 0x500
    header = ident + struct.pack("<HHIQQQIHHHHHH", 2, 190, 1, 0, 0, 0, flags, 64, 0, 0, 64, 0, 0)
    return header + b"\0" * 8


def fatbin_entry(kind: int, arch: int, payload: bytes, *, flags: int = 0x11, csize: int = 0, usize: int = 0) -> bytes:
    """One fatbin entry (kind 1 PTX, 2 ELF) with its 64-byte header; the payload padded to 8 bytes."""
    payload += b"\0" * (-len(payload) % 8)
    header = struct.pack("<HHIQIIHHI", kind, 0x0101, 64, len(payload), csize, 0, 0, 1, arch)
    header += struct.pack("<II", 0, 0) + struct.pack("<QQQ", flags, 0, usize)
    assert len(header) == 64
    return header + payload


def fatbin_container(*entries: bytes) -> bytes:
    """A fatbin container: magic, version 1, 16-byte header, the entries."""
    body = b"".join(entries)
    return struct.pack("<IHHQ", FATBIN_MAGIC, 1, 16, len(body)) + body


# ------------------------------------------------------------------------------ synthetic build recipe

# A fake "build tool": prints ninja-style progress (with a \r-redrawn line), writes the artifact given by
# argv[1] (raw fatbin with sm_<argv[2]> SASS, or a file without CUDA code for "none"), or fails if told to.
# The fatbin writers above are pasted in as source, so the child process imports nothing from the tests.
_FAKE_TOOL_BODY = r'''
out, sm, mode = sys.argv[1], sys.argv[2], sys.argv[3]
for i in range(1, 5):
    sys.stdout.write(f"[{i}/4] Building CUDA object k{i}.cu.o\n")
    sys.stdout.flush()
sys.stdout.write("progress 10%\rprogress 90%\r")
if mode == "fail":
    print("ptxas fatal   : Unresolved extern function '_Z13dequant_valueI13__nv_bfloat16ET_jS1_S1_'")
    sys.exit(3)
import os
os.makedirs(os.path.dirname(out), exist_ok=True)
with open(out, "wb") as fh:
    fh.write(b"no gpu code" if sm == "none" else fatbin_container(fatbin_entry(2, int(sm), cubin(int(sm)))))
print("done")
'''


def fake_tool_source() -> str:
    """The fake build tool's program text (self-contained: stdlib and t4patch only)."""
    writers = "\n\n".join(inspect.getsource(f) for f in (cubin, fatbin_entry, fatbin_container))
    return ("import struct, sys\nfrom t4patch.cuda.fatbin import FATBIN_MAGIC\n\n\n" + writers + _FAKE_TOOL_BODY)


def fake_recipe(tmp: Path, *, sm: str = "{arch}", mode: str = "ok", require: tuple[str, ...] = ("sass",)) -> Recipe:
    """A recipe "fake": configure prints, build runs the fake tool (artifact with sm_<sm> SASS, or failing)."""
    tool = tmp / "faketool.py"
    tool.write_text(fake_tool_source())
    doc = {
        "schema": 1, "name": "fake", "summary": "synthetic", "repository": "https://example.invalid/fake",
        "default_ref": "v1", "build_dir": "build", "min_free_gib": 0, "cpu_variant": False,
        "cuda_env": {"FAKE_CAP": "{arch}"},
        "step": [
            {"name": "configure", "argv": [sys.executable, "-c", "print('-- configured for {arch}')"], "progress": "cmake"},
            {"name": "build", "progress": "ninja",
             "argv": [sys.executable, str(tool), "{build}/lib/libfake.so", sm, mode]},
        ],
        "artifacts": {"files": ["lib/*.so"], "cuda": ["lib/libfake.so"], "require": list(require)},
        "known_failure": [{"pattern": "Unresolved extern function '_Z13dequant_value",
                           "explanation": "mistral.rs #2092: build v0.9.5 or newer"}],
    }
    return parse_recipe(doc)


# ------------------------------------------------------------------------------------ real released wheels


def cache_dir() -> Path:
    """Where downloaded wheels are kept between runs: t4patch's own wheel cache (``cache_dir("wheels")``:
    ``$T4PATCH_WHEEL_CACHE``, else ``$XDG_CACHE_HOME/t4patch/wheels``), the one ``wheel`` and ``port`` use."""
    from t4patch.fileio.cache import cache_dir as t4patch_cache_dir

    path = t4patch_cache_dir("wheels")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _find_cached(name: str, version: str) -> Path | None:
    from t4patch.fileio.wheeltools import cached_release

    return cached_release(name, version, cache_dir())


_RAW_PROGRESS = re.compile(r"Progress (\d+) of (\d+)")
PROGRESS_INTERVAL_S = 10.0


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def run_with_progress(argv: list[str], label: str, *, interval: float = PROGRESS_INTERVAL_S) -> None:
    """Run a pip command, reporting through :func:`progress` at start, every ``interval`` seconds and at the end.

    With ``--progress-bar raw`` pip prints ``Progress <bytes> of <total>`` lines; those become byte counts.
    Any other output is kept and shown if the command fails.
    """
    progress(f"{label} ...")
    start = last = time.monotonic()
    tail: list[str] = []
    done = total = 0
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            match = _RAW_PROGRESS.search(line)
            if match:
                done, total = int(match[1]), int(match[2])
            else:
                tail = [*tail[-40:], line.rstrip("\n")]
            now = time.monotonic()
            if now - last >= interval:
                last = now
                amount = f": {_mib(done)} of {_mib(total)}" if total else ""
                progress(f"{label}{amount} ({now - start:.0f} s)")
        code = proc.wait()
    if code != 0:
        raise RuntimeError(f"{label} failed (exit {code}): {' '.join(argv)}\n" + "\n".join(tail))
    size = f", {_mib(total)}" if total else ""
    progress(f"{label}: done in {time.monotonic() - start:.0f} s{size}")


# ``--progress-bar raw`` (byte counts) came with pip 24.1; the pip that ``python3 -m venv`` bundles with Python
# 3.11 (23.2.1) knows only on/off and refuses the option, so older pips get the elapsed-time heartbeat alone.
RAW_PROGRESS_PIP = Version("24.1")


def pip_progress_args() -> list[str]:
    """The progress option this interpreter's pip accepts: byte counts where it can print them, else none."""
    try:
        pip_version = Version(importlib.metadata.version("pip"))
    except (importlib.metadata.PackageNotFoundError, InvalidVersion):
        return ["--progress-bar", "off"]
    return ["--progress-bar", "raw" if pip_version >= RAW_PROGRESS_PIP else "off"]


def pip_download(spec: str, dest: Path, *, binary_only: bool = True) -> None:
    """``pip download --no-deps spec`` into ``dest`` with progress (bytes where pip can report them)."""
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
            *pip_progress_args(), "-d", str(dest), spec]
    if binary_only:
        argv.insert(5, "--only-binary=:all:")
    run_with_progress(argv, f"downloading {spec} into {dest}")


def wheel_path(name: str, version: str) -> Path:
    """The cached wheel of ``name==version``, downloading it (no dependencies) on first use."""
    cached = _find_cached(name, version)
    if cached is not None:
        return cached
    pip_download(f"{name}=={version}", cache_dir())
    cached = _find_cached(name, version)
    if cached is None:
        raise RuntimeError(f"pip download {name}=={version} produced no wheel in {cache_dir()}")
    return cached


def install_wheel_to(target: Path, wheel: Path) -> Path:
    """Install ``wheel`` into ``target`` (created) without dependencies or bytecode; return ``target``."""
    target.mkdir(parents=True, exist_ok=True)
    run_with_progress(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
         "--disable-pip-version-check", "--target", str(target), str(wheel)],
        f"installing {wheel.name} ({_mib(wheel.stat().st_size)}) into {target}",
    )
    return target


def extracted_wheel(wheel: Path, *, python_only: bool = True) -> Path:
    """The wheel's site-packages files, extracted once into ``<cache>/extracted/<wheel stem>[-py]/`` and reused.

    A vLLM wheel is ~330 MB, mostly compiled libraries that no CPU proof of a patch set reads; with
    ``python_only`` only ``.py`` files and the ``.dist-info`` directory are extracted (a few MB), so a test
    tree is ready in seconds and the whole wheel is read once per cache, not once per test. Files are laid out
    as pip would (``.data/`` directories skipped) and each one is checked against the wheel's RECORD. The
    tree is shared: copy it with :func:`site_from_extracted` before changing anything.
    """
    from t4patch.fileio.wheeltools import Expected, open_release, wheel_release  # t4patch's own wheel reader

    target = cache_dir() / "extracted" / (wheel.name[: -len(".whl")] + ("-py" if python_only else ""))
    if (target / ".complete").is_file():
        return target
    staging = target.with_name(f"{target.name}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    said = wheel_release(wheel)
    if said is None:
        raise RuntimeError(f"{wheel} is not named like a wheel")
    # open_release checks every member against RECORD (streamed); read() checks each extracted file again
    with open_release(wheel, Expected(said[0], str(said[1]), role="cached wheel")) as opened:
        members = [
            n for n in (i.filename for i in opened.infos if not i.is_dir())
            if ".data/" not in n.split(".dist-info/")[0]
            and (not python_only or n.endswith(".py") or ".dist-info/" in n)
        ]
        progress(f"extracting {len(members)} files of {wheel.name} into {target}")
        for name in members:
            path = staging / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(opened.read(name))
    (staging / ".complete").write_text(f"{len(members)}\n")
    try:
        staging.rename(target)
    except OSError:  # another run finished first: use its tree
        shutil.rmtree(staging, ignore_errors=True)
    return target


def site_from_extracted(extracted: Path, site: Path, private: list[str] | tuple[str, ...] = ()) -> Path:
    """A site-packages for one test: hard links to the shared extracted tree, with ``private`` paths (the files
    the test changes) as real copies. t4patch replaces files by rename, never in place, so even a hard-linked
    file would not change the cache; the copies make that independent of how a file is written."""
    shutil.copytree(extracted, site, copy_function=os.link, ignore=shutil.ignore_patterns(".complete"))
    for rel in private:
        path = site / rel
        if path.exists():
            data = path.read_bytes()
            path.unlink()
            path.write_bytes(data)
    return site

# ------------------------------------------------------------------ bad-input and recovery fault suites

# the synthetic engine of the fault suites (tests/fault/) and the uid an unprivileged child drops to
SPEC = "fakeengine"
DIST_INFO = "fakeengine-1.2.0.dist-info"
NOBODY = 65534


def tree(root: Path) -> dict[str, tuple[object, ...]]:
    """Everything under ``root``: kind, bytes or link target, mode, owner, group (FIFOs are never opened)."""
    out: dict[str, tuple[object, ...]] = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        if stat.S_ISLNK(info.st_mode):
            body: object = ("link", os.readlink(path))
        elif stat.S_ISREG(info.st_mode):
            body = ("file", path.read_bytes())
        else:
            body = ("other", stat.S_IFMT(info.st_mode))
        out[str(path.relative_to(root))] = (body, stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid)
    return out


def site_args(env: Env) -> list[str]:
    """The targeting options for ``env``'s site-packages."""
    return ["--site-packages", str(env.site)]


def run_as_nobody(argv: list[str], stderr: Path) -> int:
    """Run the CLI in a forked child that has dropped to uid/gid nobody; return its exit code."""
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            fd = os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
            os.dup2(fd, 2)
            sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115 - the child's whole life
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            from t4patch.cli import main

            code = main(argv)
        except BaseException:  # noqa: BLE001 - report it; never return into pytest from the child
            import traceback

            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)
