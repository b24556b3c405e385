"""mistral.rs up to and including the cargo invocation, on a tiny local cargo workspace with zero dependencies.

mistral.rs itself cannot be built here (no crates registry), so the fixture is shaped like it: a workspace with a
``mistralrs-cli`` package, features ``cuda``/``cudnn``, a ``mistralrs`` binary and a build script that, like
bindgen_cuda, needs CUDA_COMPUTE_CAP: it panics when the variable is missing or not an integer, then compiles a
kernel to PTX for that compute capability with `nvcc` from PATH (when there is one), as bindgen_cuda does, and
embeds it as text, as candle-kernels does. The test runs the *shipped* mistral.rs recipe's planned cargo command unchanged through the real pipeline,
so what it proves is: the env reaches build scripts, the features and flags are what cargo accepts, and the
artifact check reads the embedded `.target sm_XY`.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from t4patch.builder.pipeline import execute
from t4patch.builder.plan import plan_build
from t4patch.builder.preflight import find_nvcc
from t4patch.builder.recipe import load_recipe
from t4patch.builder.runner import StatusPrinter
from t4patch.cuda.arch import parse_arch
from t4patch.errors import VerificationError

pytestmark = pytest.mark.skipif(shutil.which("cargo") is None, reason="cargo not on PATH (Rust toolchain needed)")

BUILD_RS = r'''
use std::{env, fs, path::Path, process::Command};

fn main() {
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    let cap = env::var("CUDA_COMPUTE_CAP").expect("CUDA_COMPUTE_CAP did not reach the build script");
    let cap: u32 = cap.trim().parse().expect("CUDA_COMPUTE_CAP is not an integer");
    assert!(env::var("CARGO_FEATURE_CUDA").is_ok(), "the cuda feature is not enabled");
    let out_dir = env::var("OUT_DIR").unwrap();
    let ptx = Path::new(&out_dir).join("kernel.ptx");
    // bindgen_cuda's way: plain `nvcc` from PATH, one architecture, PTX out.
    let cu = Path::new(&out_dir).join("kernel.cu");
    fs::write(&cu, "extern \"C\" __global__ void scale(float *x, float a) { x[threadIdx.x] *= a; }\n").unwrap();
    let nvcc = Command::new("nvcc")
        .args(["--ptx", &format!("--gpu-architecture=sm_{cap}"), "-o"])
        .arg(&ptx).arg(&cu).status();
    if let Ok(status) = nvcc {
        assert!(status.success(), "nvcc failed");
        println!("cargo:warning=kernel.ptx compiled by nvcc for sm_{cap}");
    } else {
        fs::write(&ptx, format!("//\n.version 8.0\n.target sm_{cap}\n.address_size 64\n")).unwrap();
        println!("cargo:warning=kernel.ptx header written without nvcc for sm_{cap}");
    }
}
'''

MAIN_RS = r'''
static PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/kernel.ptx"));

fn main() {
    let ptx = std::hint::black_box(PTX);
    println!("{}", ptx.lines().find(|l| l.starts_with(".target")).unwrap_or("no target"));
}
'''


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mistralrs-like")
    (root / "Cargo.toml").write_text('[workspace]\nmembers = ["mistralrs-cli"]\nresolver = "2"\n')
    cli = root / "mistralrs-cli"
    (cli / "src").mkdir(parents=True)
    (cli / "Cargo.toml").write_text(
        '[package]\nname = "mistralrs-cli"\nversion = "0.0.0"\nedition = "2021"\nbuild = "build.rs"\n\n'
        '[[bin]]\nname = "mistralrs"\npath = "src/main.rs"\n\n[features]\ncuda = []\ncudnn = []\n'
    )
    (cli / "build.rs").write_text(BUILD_RS)
    (cli / "src" / "main.rs").write_text(MAIN_RS)
    (root / "mistralrs-quant").mkdir()
    (root / "mistralrs-quant" / "build.rs").write_text("// marker only (the recipe checks the tree's shape)\n")
    # --locked needs a lock file; with no dependencies it is generated offline.
    subprocess.run(["cargo", "generate-lockfile", "--offline"], cwd=root, check=True, capture_output=True)
    return root


def _build(workspace: Path, out: Path, arch: str, features: tuple[str, ...] = ()):
    plan = plan_build(load_recipe("mistral.rs"), arch=arch, source_dir=workspace, out=out, jobs=2,
                      nvcc=find_nvcc(), features=features)
    record, report = execute(plan, [], printer=StatusPrinter(io.StringIO()), command_line="test")
    return plan, record, report


def test_compute_cap_reaches_build_script_and_binary(workspace: Path, tmp_path: Path) -> None:
    plan, record, report = _build(workspace, tmp_path / "out75", "75", ("cudnn",))
    assert plan.steps[0].argv[-2:] == ("--features", "cuda cudnn")
    assert record["status"] == "ok" and record["env"]["CUDA_COMPUTE_CAP"] == "75"
    log = plan.log_path.read_text()
    assert "kernel.ptx" in log and "for sm_75" in log
    if shutil.which("nvcc"):
        assert "compiled by nvcc for sm_75" in log
    binary = tmp_path / "out75" / "target" / "release" / "mistralrs"
    assert subprocess.run([str(binary)], capture_output=True, text=True, check=True).stdout.strip() == ".target sm_75"
    (art,) = record["artifacts"]
    assert art["path"] == "target/release/mistralrs" and art["cuda"]["ptx_text"] == {"sm_75": 1}
    assert report.ok and record["verification"]["require"] == ["ptx-text"]


def test_other_compute_cap_and_the_check_that_catches_it(workspace: Path, tmp_path: Path) -> None:
    _build(workspace, tmp_path / "out86", "86")
    binary = tmp_path / "out86" / "target" / "release" / "mistralrs"
    assert subprocess.run([str(binary)], capture_output=True, text=True, check=True).stdout.strip() == ".target sm_86"
    # The same binary, checked for a T4, fails loudly: its PTX targets sm_86.
    from t4patch.verify.artifacts.check import check_artifacts

    t4 = check_artifacts([binary], parse_arch("75"), require=("ptx-text",), cuda_files=(binary,))
    assert not t4.ok
    assert any("embedded PTX targets sm_86" in p for p in t4.all_problems())


def test_without_the_variable_the_build_script_fails(workspace: Path, tmp_path: Path) -> None:
    """The assertion in build.rs is real: cargo without CUDA_COMPUTE_CAP fails with its message."""
    env = {k: v for k, v in os.environ.items() if k != "CUDA_COMPUTE_CAP"}
    proc = subprocess.run(["cargo", "build", "--release", "--locked", "-p", "mistralrs-cli", "--features", "cuda",
                           "--target-dir", str(tmp_path / "t")], cwd=workspace, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode != 0
    assert "CUDA_COMPUTE_CAP did not reach the build script" in proc.stderr


def test_verify_build_command_on_the_output_dir(workspace: Path, tmp_path: Path, capsys) -> None:
    import argparse

    from t4patch.commands import verify_build

    _build(workspace, tmp_path / "o", "75")
    parser = argparse.ArgumentParser()
    verify_build.configure_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["build", str(tmp_path / "o"), "--json"])
    assert args.func(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is True and doc["require"] == ["ptx-text"]  # rules taken from build-record.json
    assert [f["path"].endswith("release/mistralrs") for f in doc["files"]] == [True]
    args = parser.parse_args(["build", str(tmp_path / "o"), "--arch", "80"])
    with pytest.raises(VerificationError, match="sm_80"):
        args.func(args)
