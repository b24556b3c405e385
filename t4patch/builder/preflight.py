"""Preflight: every tool, library and gigabyte a build needs, checked in seconds before it starts.

A CUDA build of llama.cpp runs for many minutes and mistral.rs for much longer; failing at minute 40 on a
missing cuBLAS or an nvcc that cannot emit sm_75 wastes the hour. Each check yields one line: what was
needed, what was found, and the command that fixes it. All checks run (so one pass shows every problem);
:func:`enforce` then raises one ToolMissingError.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from t4patch.builder.plan import BuildPlan
from t4patch.contract.doctor import Check
from t4patch.cuda.arch import Arch
from t4patch.cuda.nvcc import find_nvcc
from t4patch.errors import ToolMissingError

Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]
Which = Callable[[str], "str | None"]
__all__ = ["Check", "check", "check_json", "enforce", "line", "find_nvcc", "run_preflight", "tool_version"]  # find_nvcc: t4patch.cuda.nvcc's

# How to ask each tool its version, and the first version-looking number in the answer.
VERSION_COMMANDS: dict[str, tuple[tuple[str, ...], re.Pattern[str]]] = {
    "git": (("git", "--version"), re.compile(r"git version (\d+(?:\.\d+)+)")),
    "cmake": (("cmake", "--version"), re.compile(r"cmake version (\d+(?:\.\d+)+)")),
    "ninja": (("ninja", "--version"), re.compile(r"^(\d+(?:\.\d+)+)", re.MULTILINE)),
    "make": (("make", "--version"), re.compile(r"GNU Make (\d+(?:\.\d+)+)")),
    "cargo": (("cargo", "--version"), re.compile(r"cargo (\d+(?:\.\d+)+)")),
    "rustc": (("rustc", "--version"), re.compile(r"rustc (\d+(?:\.\d+)+)")),
    "nvcc": (("nvcc", "--version"), re.compile(r"release (\d+\.\d+), V(\d+(?:\.\d+)+)")),
    # The host compilers CMake, nvcc (-ccbin) and cargo's cc crate run. gcc: "cc (Debian 12.2.0-14) 12.2.0";
    # clang: "clang version 17.0.6".
    "cc": (("cc", "--version"), re.compile(r"(?:\) |version )(\d+(?:\.\d+)+)")),
    "c++": (("c++", "--version"), re.compile(r"(?:\) |version )(\d+(?:\.\d+)+)")),
}

INSTALL_HINTS = {
    "git": "apt-get install git",
    "cmake": "pip install 'cmake>={v}' (or apt-get install cmake)",
    "ninja": "pip install ninja (or apt-get install ninja-build)",
    "make": "apt-get install make",
    "cargo": "install Rust >= {v} with rustup (https://rustup.rs), then: rustup update stable",
    "rustc": "install Rust >= {v} with rustup (https://rustup.rs), then: rustup update stable",
    "nvcc": "install the CUDA toolkit >= {v} and put its bin/ on PATH (or set CUDA_HOME)",
    "cc": "apt-get install build-essential (a C compiler >= {v} as `cc`: gcc or clang)",
    "c++": "apt-get install build-essential (a C++17 compiler >= {v} as `c++`: g++ or clang++)",
}

# Library file names (any version suffix) and the header a build compiles against.
LIBRARIES: dict[str, tuple[str, str | None, str]] = {
    "cudart": ("libcudart.so", "cuda_runtime.h", "the CUDA runtime"),
    "cublas": ("libcublas.so", "cublas_v2.h", "cuBLAS"),
    "curand": ("libcurand.so", "curand.h", "cuRAND"),
    "nvrtc": ("libnvrtc.so", "nvrtc.h", "NVRTC"),
    "cuda_driver": ("libcuda.so", None, "the CUDA driver library"),
    "cudnn": ("libcudnn.so", "cudnn.h", "cuDNN"),
}


def check(name: str, ok: bool, found: str, message: str, fix: str | None = None) -> Check:
    """One preflight finding as the one ``Check`` every ok / warn / fail list uses (t4patch.contract): a
    preflight check either passes or fails the build (no warnings), and always reports the bare value found."""
    return Check(name, "ok" if ok else "fail", message, fix, found)


def line(found: Check) -> str:
    """The preflight's text line: ``ok   NAME: what`` or ``FAIL NAME: what; fix: ...``."""
    status = "ok  " if found.ok else "FAIL"
    tail = f"; fix: {found.fix}" if (found.fix and not found.ok) else ""
    return f"{status} {found.name}: {found.reason}{tail}"


def check_json(found: Check) -> dict[str, object]:
    """The preflight's JSON object (``build --dry-run --json``, the build record's ``preflight``)."""
    return {"name": found.name, "ok": found.ok, "found": found.found, "message": found.reason, "fix": found.fix}


def parse_version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".") if p.isdigit())


def _default_run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=60, check=False)


def tool_version(tool: str, *, which: Which = shutil.which, run: Runner = _default_run,
                 executable: str | None = None) -> tuple[str | None, str | None]:
    """(path, version) of ``tool``; (None, None) if not on PATH; (path, None) if its version is unreadable."""
    argv, pattern = VERSION_COMMANDS[tool]
    path = executable or which(argv[0])
    if path is None:
        return None, None
    try:
        proc = run([path, *argv[1:]])
    except (OSError, subprocess.SubprocessError):
        return path, None
    match = pattern.search((proc.stdout or "") + (proc.stderr or ""))
    if match is None:
        return path, None
    return path, match.group(match.lastindex or 1) if tool == "nvcc" else match.group(1)


def nvcc_toolkit_root(nvcc: str, run: Runner = _default_run) -> Path | None:
    """The toolkit directory nvcc itself uses (its ``TOP``), which a wrapper script or symlink can hide."""
    try:
        proc = run([nvcc, "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull])
    except (OSError, subprocess.SubprocessError):
        return None
    text = (proc.stdout or "") + (proc.stderr or "")
    match = re.search(r"^#\$ TOP=(.+)$", text, re.MULTILINE) or re.search(r"^#\$ _HERE_=(.+)$", text, re.MULTILINE)
    if match is None:
        return None
    top = Path(match.group(1).strip())
    return (top if match.group(0).startswith("#$ TOP") else top / "..").resolve()


def cuda_roots(nvcc: str | None, environ: dict[str, str] | None = None, run: Runner = _default_run) -> list[Path]:
    """Toolkit roots to search for libraries and headers, most specific first."""
    environ = dict(os.environ) if environ is None else environ
    roots: list[Path] = []
    for value in (environ.get("CUDAToolkit_ROOT"), environ.get("CUDA_HOME"), environ.get("CUDA_PATH")):
        if value:
            roots.append(Path(value))
    if nvcc:
        top = nvcc_toolkit_root(nvcc, run)
        if top is not None:
            roots.append(top)
        roots.append(Path(nvcc).resolve().parent.parent)
    unique: list[Path] = []
    for r in roots:
        if r not in unique:
            unique.append(r)
    return unique


# Where the system's linker finds libraries outside any CUDA toolkit (the NVIDIA driver puts libcuda.so here).
SYSTEM_LIBRARY_DIRS = (
    Path("/usr/lib/x86_64-linux-gnu"), Path("/usr/lib/aarch64-linux-gnu"), Path("/usr/lib64"), Path("/usr/lib"),
)


def _library_dirs(roots: list[Path], environ: dict[str, str]) -> list[Path]:
    dirs: list[Path] = []
    for root in roots:
        dirs += [root / "lib64", root / "lib", root / "lib64" / "stubs", root / "lib" / "stubs"]
        dirs += [Path(p) for p in sorted(glob.glob(str(root / "targets" / "*" / "lib")))]
        dirs += [Path(p) for p in sorted(glob.glob(str(root / "targets" / "*" / "lib" / "stubs")))]
    for value in environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) + environ.get("LIBRARY_PATH", "").split(os.pathsep):
        if value:
            dirs.append(Path(value))
    dirs += list(SYSTEM_LIBRARY_DIRS)
    return dirs


def _include_dirs(roots: list[Path]) -> list[Path]:
    dirs: list[Path] = []
    for root in roots:
        dirs.append(root / "include")
        dirs += [Path(p) for p in sorted(glob.glob(str(root / "targets" / "*" / "include")))]
    dirs += [Path("/usr/include"), Path("/usr/include/x86_64-linux-gnu"), Path("/usr/include/aarch64-linux-gnu")]
    return dirs


def find_library(lib: str, roots: list[Path], environ: dict[str, str] | None = None) -> tuple[Path | None, Path | None]:
    """(library file, header file) for ``lib`` (a key of LIBRARIES); None where not found."""
    environ = dict(os.environ) if environ is None else environ
    filename, header, _ = LIBRARIES[lib]
    lib_path = None
    # The unversioned name is what CMake's find_library and the linker's -l look for; a runtime-only install
    # (libcublas.so.13 without libcublas.so) cannot be linked against.
    for d in _library_dirs(roots, environ):
        if (d / filename).exists():
            lib_path = d / filename
            break
    header_path = None
    if header is not None:
        for d in _include_dirs(roots):
            if (d / header).is_file():
                header_path = d / header
                break
    return lib_path, header_path


def free_gib(path: Path) -> float:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free / 2**30


def run_preflight(
    plan: BuildPlan,
    *,
    which: Which = shutil.which,
    run: Runner = _default_run,
    environ: dict[str, str] | None = None,
    disk_free: Callable[[Path], float] = free_gib,
) -> list[Check]:
    """All checks for ``plan``; nothing is raised here (see :func:`enforce`)."""
    environ = dict(os.environ) if environ is None else environ
    recipe = plan.recipe
    checks: list[Check] = []

    tools = dict(recipe.tools)
    if plan.source.mode in ("clone", "reuse"):
        tools.setdefault("git", "2.20")
    if plan.cuda:
        tools.update(recipe.cuda_tools)
    for tool, minimum in tools.items():
        executable = (plan.nvcc or find_nvcc(which, environ)) if tool == "nvcc" else None
        path, version = tool_version(tool, which=which, run=run, executable=executable)
        fix = INSTALL_HINTS[tool].format(v=minimum)
        if path is None:
            checks.append(check(tool, False, "not found", f"needs {tool} >= {minimum}, found none on PATH", fix))
        elif version is None:
            checks.append(check(tool, False, path, f"needs {tool} >= {minimum}, {path} did not report a version", fix))
        elif parse_version(version) < parse_version(minimum):
            checks.append(check(tool, False, version, f"needs {tool} >= {minimum}, found {version} ({path})", fix))
        else:
            checks.append(check(tool, True, version, f"{version} ({path})"))

    if plan.arch is not None:
        nvcc = plan.nvcc or find_nvcc(which, environ)
        checks.append(_nvcc_targets(nvcc, plan.arch, run))
        if recipe.nvcc_on_path:
            checks.append(_nvcc_on_path(nvcc, which))
        roots = cuda_roots(nvcc, environ, run)
        libraries = list(recipe.cuda_libraries)
        for feature in plan.features:
            libraries += [lib for lib in recipe.feature_libraries.get(feature, ()) if lib not in libraries]
        for lib in libraries:
            checks.append(_library_check(lib, roots, environ))

    if plan.source.mode == "directory":
        checks.append(_source_check(plan))
    if plan.recipe.extension is not None:
        checks.extend(_extension_checks(plan))

    free = disk_free(plan.out)
    need = recipe.min_free_gib
    if free < need:
        checks.append(check("disk", False, f"{free:.1f} GiB", f"needs {need:g} GiB free under {plan.out}, found {free:.1f} GiB",
                            "free disk space or choose another --out DIR"))
    else:
        checks.append(check("disk", True, f"{free:.1f} GiB", f"{free:.1f} GiB free under {plan.out} (needs {need:g})"))
    return checks


def _nvcc_targets(nvcc: str | None, arch: Arch, run: Runner) -> Check:
    sm = arch.sass
    name = f"nvcc {sm}"
    if nvcc is None:
        return check(name, False, "no nvcc", f"needs nvcc able to emit {sm}, found no nvcc",
                     INSTALL_HINTS["nvcc"].format(v="11.8"))
    try:
        proc = run([nvcc, "--list-gpu-code"])
    except (OSError, subprocess.SubprocessError) as exc:
        return check(name, False, "error", f"`{nvcc} --list-gpu-code` failed ({exc})", "reinstall the CUDA toolkit")
    codes = set(re.findall(r"\bsm_\d+[af]?\b", proc.stdout or ""))
    if proc.returncode != 0 or not codes:
        return check(name, False, "unknown", f"`{nvcc} --list-gpu-code` listed no targets (exit {proc.returncode})",
                     "use a CUDA toolkit >= 11.8 (older nvcc lacks --list-gpu-code)")
    if sm not in codes:
        lowest = min(codes, key=lambda c: int(re.sub(r"\D", "", c)))
        return check(name, False, ", ".join(sorted(codes)), f"{nvcc} cannot emit {sm} (lowest it lists: {lowest})",
                     f"use a CUDA toolkit that still targets {sm} (CUDA 11.8 to 13.x target sm_75)")
    return check(name, True, sm, f"{nvcc} lists {sm} in --list-gpu-code")


def _nvcc_on_path(nvcc: str | None, which: Which) -> Check:
    on_path = which("nvcc")
    if on_path is None:
        return check("nvcc on PATH", False, "not on PATH", "the build runs `nvcc` from PATH (bindgen_cuda) and PATH "
                     f"has none{f' (found {nvcc} outside PATH)' if nvcc else ''}",
                     f"export PATH={Path(nvcc).parent}:$PATH" if nvcc else INSTALL_HINTS["nvcc"].format(v="11.8"))
    if nvcc and Path(on_path).resolve() != Path(nvcc).resolve():
        return check("nvcc on PATH", False, on_path, f"`nvcc` on PATH is {on_path}, not the checked {nvcc}",
                     f"export PATH={Path(nvcc).parent}:$PATH")
    return check("nvcc on PATH", True, on_path, f"{on_path} (the build runs `nvcc` from PATH)")


def _library_check(lib: str, roots: list[Path], environ: dict[str, str]) -> Check:
    filename, header, label = LIBRARIES[lib]
    lib_path, header_path = find_library(lib, roots, environ)
    where = ", ".join(str(r) for r in roots) or "no CUDA toolkit root"
    fix = (f"install {label} (and its headers) for this CUDA toolkit, e.g. from NVIDIA's apt repository, "
           "or set CUDAToolkit_ROOT to a complete toolkit")
    if lib == "cuda_driver":
        fix = "install the NVIDIA driver, or use a CUDA toolkit that ships lib64/stubs/libcuda.so"
    if lib_path is None:
        runtime_only = [Path(h) for d in _library_dirs(roots, environ) for h in sorted(glob.glob(str(d / (filename + ".*"))))]
        if runtime_only:
            return check(lib, False, str(runtime_only[0]), f"found {runtime_only[0]} but not {filename} (the development "
                         "link a build links against)", f"install the -dev package of {label}, or create the link "
                         f"{runtime_only[0].parent / filename} -> {runtime_only[0].name}")
        return check(lib, False, "not found", f"needs {label} ({filename}), found none under {where} or the "
                     "system library directories", fix)
    if header is not None and header_path is None:
        return check(lib, False, str(lib_path), f"found {lib_path} but not its header {header} (looked under {where})", fix)
    return check(lib, True, str(lib_path), f"{lib_path}" + (f" + {header_path}" if header_path else ""))


def _source_check(plan: BuildPlan) -> Check:
    src = plan.source.path
    if not src.is_dir():
        return check("source", False, "missing", f"--source {src} is not a directory", "pass the unpacked source tree")
    missing = [m for m in plan.recipe.source_markers if not (src / m).exists()]
    if missing:
        return check("source", False, "not a match", f"--source {src} does not look like a {plan.recipe.name} tree "
                     f"(missing {', '.join(missing)})", f"pass the top directory of a {plan.recipe.name} checkout")
    return check("source", True, str(src), f"{src} has {', '.join(plan.recipe.source_markers) or 'no markers to check'}")


def _extension_checks(plan: BuildPlan) -> list[Check]:
    """A torch extension also needs torch's stable-ABI headers and libraries, <cublas_v2.h>, what the archive's
    generator imports, and the archive itself (its sha256 is checked here, in a second, not after the tree)."""
    from t4patch.builder.extension import CUBLAS_INCLUDE_ENV, cublas_candidates
    from t4patch.builder.sdist import sdist_hint
    from t4patch.fileio.hashing import sha256_file

    spec, tc = plan.recipe.extension, plan.toolchain
    assert spec is not None and tc is not None
    checks: list[Check] = []
    if tc.torch_include is None:
        checks.append(check("torch", False, "not found" if tc.torch_version is None else tc.torch_version,
                            f"needs torch >= 2.10 with its stable-ABI headers (torch/csrc/stable/library.h) importable "
                            f"by {tc.python}, found {'no torch' if tc.torch_version is None else 'torch ' + tc.torch_version + ' without them'}",
                            f"{tc.python} -m pip install 'torch>=2.10'"))
    elif not any(p.name == "libtorch_cpu.so" for p in tc.torch_libraries):
        checks.append(check("torch", False, str(tc.torch_include.parent), f"torch at {tc.torch_include.parent} has no "
                            "lib/libtorch_cpu.so to link against", f"{tc.python} -m pip install --force-reinstall torch"))
    else:
        checks.append(check("torch", True, tc.torch_version or "?", f"torch {tc.torch_version} at {tc.torch_include.parent} "
                            f"({tc.python}, which loads the library)"))
    if tc.cublas_include is None:
        looked = ", ".join(str(c) for c in cublas_candidates(tc.nvcc, tuple(cuda_roots(tc.nvcc)) if tc.nvcc else ())[:3])
        checks.append(check("cublas header", False, "not found", f"the sources include <cublas_v2.h>; found it in none of "
                            f"{looked}, ...", f"install the CUDA toolkit's cuBLAS headers, or set {CUBLAS_INCLUDE_ENV}=DIR, "
                            f"or take them from the wheel: {tc.python} -m pip install nvidia-cublas"))
    else:
        checks.append(check("cublas header", True, str(tc.cublas_include), f"{tc.cublas_include / 'cublas_v2.h'}"))
    if tc.generator_modules:
        missing = " ".join(tc.generator_modules)
        checks.append(check("generator", False, "missing " + missing, f"{spec.generate_script} needs {missing} in {tc.python}",
                            f"{tc.python} -m pip install {missing}"))
    else:
        checks.append(check("generator", True, tc.python, f"{tc.python} can run {spec.generate_script}"))
    sdist = plan.source.path
    if not sdist.exists():
        checks.append(check("source archive", False, "not found", f"needs the {spec.distribution} {spec.version} sdist, "
                            f"found nothing at {sdist}", sdist_hint(spec)))
    elif sdist.is_file() and sha256_file(sdist) != spec.sdist_sha256:
        checks.append(check("source archive", False, "other bytes", f"{sdist} is not the recipe's {spec.sdist} (sha256 "
                            f"differs from {spec.sdist_sha256[:12]}...)", sdist_hint(spec)))
    else:
        what = "sha256 matches" if sdist.is_file() else "an unpacked tree: each pinned file is checked when it is read"
        checks.append(check("source archive", True, str(sdist), f"{sdist} ({what})"))
    return checks


def enforce(checks: list[Check], *, command: str) -> None:
    """Raise ToolMissingError naming every failed check (the caller prints each check's line first)."""
    failed = [c for c in checks if not c.ok]
    if not failed:
        return
    names = ", ".join(c.name for c in failed)
    first = failed[0]
    raise ToolMissingError(
        f"preflight failed ({len(failed)} of {len(checks)} checks: {names}); first: {first.reason}",
        hint=f"{first.fix}; then rerun: {command}" if first.fix else f"rerun: {command}",
    )
