"""A real llama.cpp tree built end to end by `t4patch build` (CPU-only, so it runs on CI's GPU-less box).

The source is the llama.cpp vendored in the llama-cpp-python 0.3.36 sdist (a real upstream tree, commit
0c1e57098 per that release's changelog), downloaded once with pip and cached beside the test wheels. The CUDA
variant of the same recipe cannot link without cuBLAS and a libcuda stub, which CI lacks; it is proven in
docs/verification/build-llama-cpp-*.md. This test proves the rest on real CMake/ninja output: the shipped
recipe's commands, the preflight, progress parsing, the log, the source digest, the artifacts and the record,
and that the artifact check refuses a build without GPU code.

Measured on the idle 2-core development box: 288 s with the sdist already cached (pip download of the 77 MB
sdist: about 40 s more on a fresh machine); see docs/verification. Set T4PATCH_SKIP_SLOW_BUILD=1 to skip it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from t4patch.errors import VerificationError
from tests.helpers import cache_dir

SDIST = "llama_cpp_python-0.3.36.tar.gz"
VENDORED = "llama_cpp_python-0.3.36/vendor/llama.cpp/"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("ninja") is None or shutil.which("c++") is None,
                       reason="cmake, ninja and a C++ compiler are needed for a real llama.cpp build"),
    pytest.mark.skipif(os.environ.get("T4PATCH_SKIP_SLOW_BUILD") == "1", reason="T4PATCH_SKIP_SLOW_BUILD=1"),
]


def _sdist() -> Path:
    path = cache_dir() / SDIST
    if not path.is_file():
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps",
                        "-d", str(cache_dir()), "llama-cpp-python==0.3.36"], check=True)
    return path


@pytest.fixture(scope="module")
def llama_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("llama-src")
    with tarfile.open(_sdist()) as tar:
        # The top-level models/ (tokenizer test vocabularies, 75 MB) and docs/ are not part of the build.
        members = [m for m in tar.getmembers() if m.name.startswith(VENDORED)
                   and not m.name[len(VENDORED):].startswith(("models/", "docs/"))]
        for m in members:
            m.name = m.name[len(VENDORED):]
        kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(root, members=[m for m in members if m.name], **kwargs)
    (root / ".git").unlink(missing_ok=True)  # a submodule pointer into the sdist author's checkout
    assert (root / "ggml" / "src" / "ggml-cuda" / "CMakeLists.txt").is_file()
    return root


def _command(module, argv: list[str]):
    parser = argparse.ArgumentParser()
    module.configure_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cpu_build_of_real_llama_cpp(llama_source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from t4patch.commands import build, verify_build

    out = tmp_path / "out"
    jobs = str(os.cpu_count() or 2)
    assert _command(build, ["build", "llama.cpp", "--source", str(llama_source), "--arch", "cpu", "--jobs", jobs,
                            "--out", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    record = doc["record"]
    assert record == json.loads((out / "build-record.json").read_text())
    assert record["status"] == "ok" and record["cuda"] is False and record["arch"] == "cpu"
    assert "-DGGML_CUDA=OFF" in record["flags"]["configure"]
    assert record["source"]["kind"] == "directory" and len(record["source"]["tree_sha256"]) == 64
    assert record["tools"]["cmake"] and record["tools"]["ninja"]
    assert record["durations"]["build"] > 0 and record["verification"] == {"skipped": "CPU-only build: no GPU code to check"}
    paths = {a["path"] for a in record["artifacts"]}
    assert {"build/bin/llama-server", "build/bin/llama-cli", "build/bin/llama-bench"} <= paths
    assert all(len(a["sha256"]) == 64 for a in record["artifacts"])
    log = (out / "build.log").read_text(errors="replace")
    assert "Linking CXX executable bin/llama-server" in log
    version = subprocess.run([str(out / "build" / "bin" / "llama-cli"), "--version"], capture_output=True, text=True,
                             timeout=120, check=False)
    assert version.returncode == 0 and "version" in (version.stdout + version.stderr).lower()

    # The artifact check refuses this build for a GPU: no fatbin, no PTX anywhere.
    with pytest.raises(VerificationError, match="not a CUDA build"):
        _command(verify_build, ["build", str(out / "build" / "bin"), "--arch", "75", "--no-cuobjdump"])
