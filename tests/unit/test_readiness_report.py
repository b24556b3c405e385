"""t4patch.readiness.report: doctor's findings gathered once, advice included, rendered by the command."""

from __future__ import annotations

from t4patch.commands.engine_table import ENGINES
from t4patch.cuda.gpu import GpuReport
from t4patch.environment.target import resolve_target
from t4patch.readiness import report
from tests.helpers import T4, make_dist


def test_gather_on_an_unpatched_engine_on_a_t4(tmp_path):
    site = tmp_path / "site"
    make_dist(site, name="torch", version="2.13.0+cpu", files={"torch/__init__.py": ""})
    found = report.gather(resolve_target(None, str(site)), GpuReport((T4,), "580.1", "13.0", ("nvml",)), ENGINES)
    doc = found.to_json()
    assert [p["name"] for p in doc["packages"]] == list(report.watched(ENGINES))
    assert {"name": "torch", "version": "2.13.0+cpu", "build": "cpu"} in doc["packages"]
    cpu = next(note for note in doc["advice"] if note.startswith("torch is a CPU-only build but a GPU is present"))
    assert f"--target {site} --force-reinstall torch==2.13.0 --index-url https://download.pytorch.org/whl/" in cpu
    assert any("has no bf16: serve with --dtype float16" in note for note in doc["advice"])
    assert doc["sglang"] is None and [c["name"] for c in doc["checks"]][0] == "torch-cuda-arch"


def test_memory_reads_proc_meminfo_or_says_none():
    mem = report.memory()
    assert set(mem) == {"ram_total", "ram_available", "swap_total", "swap_free"}
