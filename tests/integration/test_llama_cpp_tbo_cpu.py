"""`t4patch verify llama.cpp` against a real CPU build of llama.cpp's test-backend-ops (skipped without one).

Point ``T4PATCH_LLAMA_CPP_CPU_BUILD`` at a build directory configured with ``-DGGML_CUDA=OFF
-DLLAMA_BUILD_TESTS=ON`` (target test-backend-ops; the tree vendored in llama-cpp-python 0.3.36 builds in a few
minutes on two cores). The CPU backend is compared with itself, so every case passes: what this proves is that
the parser reads the real binary's real output end to end (cases counted, the backend's own verdict read, nothing
left unparsed).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from t4patch import cli

BUILD = os.environ.get("T4PATCH_LLAMA_CPP_CPU_BUILD")
pytestmark = pytest.mark.skipif(not BUILD, reason="set T4PATCH_LLAMA_CPP_CPU_BUILD to a CPU build of test-backend-ops")


def test_real_cpu_binary_end_to_end(capsys, tmp_path):
    log = tmp_path / "run.log"
    code = cli.main(["verify", "llama.cpp", str(Path(BUILD)), "--backend", "CPU", "--ops", "SCALE f32,TANH f32,SET_ROWS f32 -> f16",
                     "--json", "--log", str(log), "--timeout", "300"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["verdict"] == "pass"
    assert doc["evidence_class"].endswith("(no GPU code ran)")
    for op in doc["ops"]:
        assert op["cases"] > 0 and op["ok"] == op["cases"] and op["unparsed_lines"] == [], op["name"]
        assert op["backend_verdicts"] == {"CPU": "OK"}
    assert "==== build-info " in log.read_text()
