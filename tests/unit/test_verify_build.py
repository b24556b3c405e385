"""`t4patch verify build`: pass on sm_75 SASS, fail loudly on PTX-only / other-arch builds, cuobjdump cross-check.

The objects are compiled by nvcc in the test (skipped without nvcc); the cuobjdump cross-check uses a stand-in
script on PATH (cuobjdump is not in the pip CUDA wheels this machine has), in both an agreeing and a
disagreeing variant, so the comparison logic itself is exercised.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from t4patch.cuda.arch import parse_arch
from t4patch.errors import UsageError, VerificationError
from t4patch.verify.artifacts.check import check_artifacts, collect_files
from tests.helpers import CUDA_KERNEL as KERNEL
from tests.helpers import needs_nvcc

NVCC = shutil.which("nvcc")
SM75 = parse_arch("sm_75")


def _obj(tmp: Path, name: str, *gencode: str) -> Path:
    src = tmp / f"{name}.cu"
    src.write_text(KERNEL.replace("NAME", name))
    out = tmp / f"lib{name}.so"
    flags = [x for g in gencode for x in ("-gencode", g)]
    subprocess.run([NVCC, "-shared", "-Xcompiler", "-fPIC", *flags, "-compress-mode=size", str(src), "-o", str(out)],
                   check=True, capture_output=True)
    return out


def _cli(argv: list[str]):
    from t4patch.commands import verify_build

    parser = argparse.ArgumentParser()
    verify_build.configure_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["build", *argv])
    return args.func(args)


@needs_nvcc
def test_sm75_library_passes(tmp_path: Path, capsys) -> None:
    lib = _obj(tmp_path, "good", "arch=compute_75,code=[compute_75,sm_75]")
    assert _cli([str(lib), "--no-cuobjdump"]) == 0
    out = capsys.readouterr().out
    assert "sm_75" in out and "result: sm_75 code present" in out
    assert _cli([str(lib), "--json", "--no-cuobjdump", "--require", "sass"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["command"] == "verify build" and doc["ok"] and doc["files"][0]["cuda"]["sass"] == ["sm_75"]


@needs_nvcc
def test_llama_cpp_default_style_ptx_only_fails(tmp_path: Path, capsys) -> None:
    """llama.cpp's default list carries Turing as 75-virtual: PTX only. That must fail, naming the JIT."""
    lib = _obj(tmp_path, "virt", "arch=compute_75,code=compute_75", "arch=compute_86,code=sm_86")
    with pytest.raises(VerificationError) as info:
        _cli([str(lib), "--no-cuobjdump"])
    message = str(info.value)
    assert info.value.exit_code == 12 and "\n" not in message
    assert "no sm_75 SASS" in message and "SASS only for sm_86" in message and "JIT" in message
    assert "problem:" in capsys.readouterr().out


@needs_nvcc
def test_other_arch_and_directory_scan(tmp_path: Path) -> None:
    d = tmp_path / "build" / "bin"
    d.mkdir(parents=True)
    good = _obj(d, "good", "arch=compute_75,code=sm_75")
    _obj(d, "bad", "arch=compute_80,code=sm_80")
    (d / "README").write_text("not a binary")
    os.symlink(good, d / "libgood.so.0")  # a symlink to an artifact is listed once
    files = collect_files([tmp_path / "build"])
    assert sorted(f.name for f in files) == ["libbad.so", "libgood.so"]
    report = check_artifacts(files, SM75, use_cuobjdump=False)
    assert not report.ok
    (problem,) = report.all_problems()
    assert problem.startswith("libbad.so: no sm_75 SASS in ") and problem.endswith("(SASS only for sm_80)")
    assert check_artifacts([good], SM75, use_cuobjdump=False).ok


def test_nothing_cuda_fails(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    shutil.copy("/bin/true", plain) if Path("/bin/true").exists() else plain.write_bytes(b"\x7fELF")
    with pytest.raises(VerificationError, match="not a CUDA build|no files to check"):
        _cli([str(tmp_path), "--no-cuobjdump"])
    with pytest.raises(UsageError, match="does not exist"):
        _cli([str(tmp_path / "missing")])


FAKE_CUOBJDUMP = """#!/bin/sh
# stand-in for NVIDIA's cuobjdump: prints what the real one prints for a single-arch sm_{sass} library
case "$1" in
  --list-elf) echo "ELF file    1: $(basename "$2").1.sm_{sass}.cubin" ;;
  --list-ptx) echo "PTX file    1: $(basename "$2").1.sm_{ptx}.ptx" ;;
esac
"""


@needs_nvcc
@pytest.mark.parametrize("sass,ptx,agrees", [(75, 75, True), (80, 75, False)])
def test_cuobjdump_cross_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sass: int, ptx: int,
                               agrees: bool) -> None:
    lib = _obj(tmp_path, "x", "arch=compute_75,code=[compute_75,sm_75]")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "cuobjdump"
    fake.write_text(FAKE_CUOBJDUMP.format(sass=sass, ptx=ptx))
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    report = check_artifacts([lib], SM75)
    assert report.cuobjdump == str(fake)
    assert report.files[0].cuobjdump == {"sass": [f"sm_{sass}"], "ptx": [f"compute_{ptx}"]}
    assert report.ok is agrees
    if not agrees:
        assert "cuobjdump disagrees" in report.all_problems()[0]


@needs_nvcc
def test_a_ptx_file_passed_explicitly(tmp_path: Path) -> None:
    src = tmp_path / "k.cu"
    src.write_text(KERNEL.replace("NAME", "p"))
    for arch, ok in ((75, True), (86, False)):
        ptx = tmp_path / f"k{arch}.ptx"
        subprocess.run([NVCC, "-ptx", f"--gpu-architecture=sm_{arch}", str(src), "-o", str(ptx)], check=True)
        report = check_artifacts([ptx], SM75, require=("ptx-text",), use_cuobjdump=False)
        assert report.ok is ok, report.all_problems()
