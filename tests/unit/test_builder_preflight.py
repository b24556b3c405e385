"""Preflight messages: each missing or old tool, nvcc without sm_75, missing CUDA libraries and too little disk
give one line that names what was needed, what was found and the fix; enforce() raises one ToolMissingError.

Tools are faked (which/run are injected) so the messages are checked for every case on any machine; one test
runs the real probes of this machine to show the parsers understand real version strings.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from t4patch.builder import preflight
from t4patch.builder.plan import plan_build
from t4patch.builder.preflight import enforce, find_library, run_preflight, tool_version
from t4patch.builder.recipe import load_recipe
from t4patch.errors import ToolMissingError

VERSIONS = {
    "git": "git version 2.39.5\n",
    "cc": "cc (Debian 12.2.0-14+deb12u1) 12.2.0\nCopyright (C) 2022 Free Software Foundation, Inc.\n",
    "c++": "c++ (Debian 12.2.0-14+deb12u1) 12.2.0\n",
    "cmake": "cmake version 3.25.1\n\nCMake suite maintained and supported by Kitware (kitware.com/cmake).\n",
    "ninja": "1.11.1\n",
    "cargo": "cargo 1.95.0 (f2d3ce0bd 2026-03-21)\n",
    "rustc": "rustc 1.95.0 (59807616e 2026-04-14)\n",
    "nvcc": "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.0, V13.0.88\n",
}
GPU_CODES = "sm_75\nsm_80\nsm_86\nsm_90\n"


class FakeTools:
    """which() and run() for a machine whose tools are given as {name: version output}."""

    def __init__(self, root: Path, versions: dict[str, str], gpu_codes: str = GPU_CODES) -> None:
        self.root, self.versions, self.gpu_codes = root, versions, gpu_codes

    def which(self, name: str) -> str | None:
        return str(self.root / "bin" / name) if name in self.versions else None

    def run(self, argv):
        name = Path(argv[0]).name
        if argv[1:] == ["--list-gpu-code"]:
            out = self.gpu_codes
        elif "--dryrun" in argv:
            out = f"#$ _HERE_={self.root}/bin\n#$ TOP={self.root}/bin/..\n"
        else:
            out = self.versions[name]
        return subprocess.CompletedProcess(argv, 0, out, "")


def _toolkit(root: Path, libs: tuple[str, ...] = ("cudart", "cublas", "curand", "nvrtc", "cudnn")) -> Path:
    headers = {"cudart": "cuda_runtime.h", "cublas": "cublas_v2.h", "curand": "curand.h", "nvrtc": "nvrtc.h",
               "cudnn": "cudnn.h"}
    (root / "lib64" / "stubs").mkdir(parents=True)
    (root / "include").mkdir()
    (root / "bin").mkdir()
    for lib in libs:
        (root / "lib64" / f"lib{lib}.so.13").write_bytes(b"")
        (root / "lib64" / f"lib{lib}.so").symlink_to(f"lib{lib}.so.13")
        (root / "include" / headers[lib]).write_text("")
    (root / "lib64" / "stubs" / "libcuda.so").write_bytes(b"")
    return root


def _source(tmp: Path, recipe: str) -> Path:
    src = tmp / "src"
    for marker in load_recipe(recipe).source_markers:
        (src / marker).parent.mkdir(parents=True, exist_ok=True)
        (src / marker).write_text("")
    return src


def _checks(tmp: Path, recipe: str = "llama.cpp", *, versions=None, gpu_codes=GPU_CODES, libs=None, free=100.0,
            features=(), source=True, mutate=None):
    root = _toolkit(tmp / "cuda", libs) if libs is not None else _toolkit(tmp / "cuda")
    if mutate is not None:
        mutate(root)
    tools = FakeTools(root, VERSIONS if versions is None else versions, gpu_codes)
    plan = plan_build(load_recipe(recipe), source_dir=_source(tmp, recipe) if source else None, out=tmp / "out",
                      nvcc=tools.which("nvcc"), features=features)
    env = {"CUDAToolkit_ROOT": str(root), "LD_LIBRARY_PATH": "", "LIBRARY_PATH": ""}
    return run_preflight(plan, which=tools.which, run=tools.run, environ=env, disk_free=lambda p: free)


def _failed(checks):
    return {c.name: c for c in checks if not c.ok}


def test_all_present_passes(tmp_path: Path) -> None:
    checks = _checks(tmp_path)
    assert not _failed(checks), [c.line() for c in checks]
    names = [c.name for c in checks]
    assert names[:5] == ["cmake", "ninja", "cc", "c++", "nvcc"] and "nvcc sm_75" in names and "cublas" in names
    assert "git" not in names  # --source: no clone, so git is not required
    enforce(checks, command="t4patch build llama.cpp")


def test_clone_requires_git(tmp_path: Path) -> None:
    versions = {k: v for k, v in VERSIONS.items() if k != "git"}
    failed = _failed(_checks(tmp_path, versions=versions, source=False))
    assert set(failed) == {"git"}
    assert failed["git"].reason == "needs git >= 2.20, found none on PATH"
    assert failed["git"].fix == "apt-get install git"


def test_missing_and_old_tools(tmp_path: Path) -> None:
    versions = dict(VERSIONS, cmake="cmake version 3.16.3\n")
    del versions["ninja"]
    failed = _failed(_checks(tmp_path, versions=versions))
    assert set(failed) == {"cmake", "ninja"}
    assert failed["cmake"].reason.startswith("needs cmake >= 3.18, found 3.16.3")
    assert "pip install 'cmake>=3.18'" in failed["cmake"].fix
    assert "ninja" in failed["ninja"].fix
    with pytest.raises(ToolMissingError) as info:
        enforce(list(failed.values()), command="t4patch build llama.cpp")
    err = info.value
    assert err.exit_code == 14 and "\n" not in str(err)
    assert "preflight failed (2 of 2 checks: cmake, ninja)" in str(err)
    assert "then rerun: t4patch build llama.cpp" in str(err)


def test_unreadable_version(tmp_path: Path) -> None:
    failed = _failed(_checks(tmp_path, versions=dict(VERSIONS, ninja="garbage\n")))
    assert "did not report a version" in failed["ninja"].reason


def test_nvcc_without_sm75(tmp_path: Path) -> None:
    failed = _failed(_checks(tmp_path, gpu_codes="sm_80\nsm_86\nsm_90\n"))
    check = failed["nvcc sm_75"]
    assert "cannot emit sm_75 (lowest it lists: sm_80)" in check.reason
    assert "sm_75" in check.fix


def test_cpu_build_needs_no_cuda(tmp_path: Path) -> None:
    root = _toolkit(tmp_path / "cuda", ())
    versions = {k: v for k, v in VERSIONS.items() if k != "nvcc"}
    tools = FakeTools(root, versions)
    plan = plan_build(load_recipe("llama.cpp"), arch="cpu", source_dir=_source(tmp_path, "llama.cpp"), out=tmp_path / "o")
    checks = run_preflight(plan, which=tools.which, run=tools.run, environ={}, disk_free=lambda p: 50)
    assert not _failed(checks)
    assert not any(c.name.startswith("nvcc") or c.name == "cublas" for c in checks)


def test_missing_cuda_libraries(tmp_path: Path) -> None:
    failed = _failed(_checks(tmp_path, "mistral.rs", libs=("cudart", "cublas"), features=("cudnn",)))
    assert {"curand", "nvrtc", "cudnn"} <= set(failed)
    assert "needs cuDNN (libcudnn.so), found none under" in failed["cudnn"].reason
    assert "CUDAToolkit_ROOT" in failed["cudnn"].fix


def test_cudnn_only_checked_with_the_feature(tmp_path: Path) -> None:
    checks = _checks(tmp_path, "mistral.rs", libs=("cudart", "cublas", "curand", "nvrtc"))
    assert "cudnn" not in {c.name for c in checks} and not _failed(checks)


def test_header_missing(tmp_path: Path) -> None:
    failed = _failed(_checks(tmp_path, mutate=lambda root: (root / "include" / "cublas_v2.h").unlink()))
    assert set(failed) == {"cublas"}
    assert "but not its header cublas_v2.h" in failed["cublas"].reason
    lib, header = find_library("cublas", [tmp_path / "cuda"], {})
    assert lib is not None and lib.name == "libcublas.so" and header is None


def test_runtime_only_library_is_not_enough(tmp_path: Path) -> None:
    failed = _failed(_checks(tmp_path, mutate=lambda root: (root / "lib64" / "libcublas.so").unlink()))
    assert set(failed) == {"cublas"}
    assert "libcublas.so.13 but not libcublas.so (the development link" in failed["cublas"].reason
    assert "create the link" in failed["cublas"].fix


def test_driver_stub_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The system directories are replaced by an empty one: a machine with the NVIDIA driver has libcuda.so
    # there, which would hide the missing stub (see test_driver_in_a_system_directory_is_enough).
    monkeypatch.setattr(preflight, "SYSTEM_LIBRARY_DIRS", (tmp_path / "no-system-libs",))
    failed = _failed(_checks(tmp_path, mutate=lambda root: (root / "lib64" / "stubs" / "libcuda.so").unlink()))
    assert set(failed) == {"cuda_driver"}
    assert "stubs/libcuda.so" in failed["cuda_driver"].fix


def test_driver_in_a_system_directory_is_enough(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    system = tmp_path / "system-lib"
    system.mkdir()
    (system / "libcuda.so").write_bytes(b"\x7fELF")
    monkeypatch.setattr(preflight, "SYSTEM_LIBRARY_DIRS", (system,))
    failed = _failed(_checks(tmp_path, mutate=lambda root: (root / "lib64" / "stubs" / "libcuda.so").unlink()))
    assert "cuda_driver" not in failed


def test_disk_space(tmp_path: Path) -> None:
    failed = _failed(_checks(tmp_path, "mistral.rs", libs=("cudart", "cublas", "curand", "nvrtc"), free=3.2))
    assert failed["disk"].reason.startswith("needs 20 GiB free under") and "found 3.2 GiB" in failed["disk"].reason


def test_source_markers(tmp_path: Path) -> None:
    src = tmp_path / "notllama"
    src.mkdir()
    tools = FakeTools(_toolkit(tmp_path / "cuda"), VERSIONS)
    plan = plan_build(load_recipe("llama.cpp"), source_dir=src, out=tmp_path / "o", nvcc=tools.which("nvcc"))
    checks = run_preflight(plan, which=tools.which, run=tools.run, environ={"CUDAToolkit_ROOT": str(tmp_path / "cuda")},
                           disk_free=lambda p: 50)
    failed = _failed(checks)
    assert set(failed) == {"source"}
    assert "does not look like a llama.cpp tree (missing CMakeLists.txt" in failed["source"].reason


@pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("git") is None, reason="cmake/git not on PATH")
def test_real_version_probes() -> None:
    for tool in ("git", "cmake"):
        path, version = tool_version(tool)
        assert path and version and version[0].isdigit(), (tool, path, version)
    if shutil.which("nvcc"):
        _, version = tool_version("nvcc")
        assert version and version.count(".") == 2  # e.g. 13.0.88


def test_mistral_rs_needs_the_checked_nvcc_on_path(tmp_path: Path) -> None:
    """bindgen_cuda runs plain `nvcc`: an nvcc found only through CUDA_HOME is not enough for mistral.rs."""
    root = _toolkit(tmp_path / "cuda")
    tools = FakeTools(root, VERSIONS)
    src = _source(tmp_path, "mistral.rs")
    hidden = str(tmp_path / "elsewhere" / "nvcc")
    plan = plan_build(load_recipe("mistral.rs"), source_dir=src, out=tmp_path / "o", nvcc=hidden)

    def which(name: str) -> str | None:
        return None if name == "nvcc" else tools.which(name)

    checks = run_preflight(plan, which=which, run=tools.run, environ={"CUDAToolkit_ROOT": str(root)},
                           disk_free=lambda p: 50)
    failed = _failed(checks)
    assert "nvcc on PATH" in failed
    assert failed["nvcc on PATH"].fix == f"export PATH={tmp_path / 'elsewhere'}:$PATH"
    # llama.cpp passes the compiler to CMake explicitly, so it has no such check.
    llama = plan_build(load_recipe("llama.cpp"), source_dir=_source(tmp_path / "l", "llama.cpp"), out=tmp_path / "p",
                       nvcc=hidden)
    names = {c.name for c in run_preflight(llama, which=which, run=tools.run, environ={"CUDAToolkit_ROOT": str(root)},
                                           disk_free=lambda p: 50)}
    assert "nvcc on PATH" not in names
