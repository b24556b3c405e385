"""doctor reports GPU facts from the driver (no torch) and tells users what to do."""

from __future__ import annotations

import json

import t4patch.commands.doctor as doctor
from t4patch.cuda.gpu import Gpu, GpuReport, detect
from tests.helpers import T4

H200 = Gpu(0, "NVIDIA H200", "9.0", 232448, 132, 141 * 2**30)


def test_gpu_facts():
    assert not T4.bf16 and T4.sm == "sm_75"
    assert H200.bf16 and H200.cc_tuple == (9, 0)


def test_detect_never_raises():
    report = detect()  # on CI: no driver -> empty list plus problems; on a GPU box: real devices
    assert isinstance(report, GpuReport)
    assert report.gpus or report.problems


def test_doctor_without_gpu_exits_zero(env, cli, monkeypatch):
    monkeypatch.setattr(doctor, "detect", lambda: GpuReport((), None, None, (), ("CUDA driver API unavailable: x",)))
    result = cli("doctor", "--site-packages", str(env.site))
    assert result.code == 0
    assert "GPUs: none found" in result.out
    assert "fakeengine" in result.out and "not-applied" in result.out


def test_doctor_on_a_t4_advises_patching(env, cli, monkeypatch):
    monkeypatch.setattr(doctor, "detect", lambda: GpuReport((T4,), "580.1", "13.0", ("cuda-driver-api", "nvml")))
    doc = json.loads(cli("doctor", "--json", "--site-packages", str(env.site)).out)
    assert doc["schema"] == 1 and doc["gpu"]["gpus"][0]["shared_memory_per_block_optin"] == 65536
    assert doc["gpu"]["gpus"][0]["bf16"] is False
    assert any("t4patch apply fakeengine==1.2.0" in note for note in doc["advice"])
    assert any("--dtype float16" in note for note in doc["advice"])
    assert doc["memory"]["ram_total"] > 0
    text = cli("doctor", "--site-packages", str(env.site)).out
    assert "Tesla T4" in text and "65,536 B" in text


def test_doctor_detects_cpu_only_torch(tmp_path, cli, monkeypatch):
    from tests.helpers import make_dist

    site = make_dist(tmp_path / "site", name="torch", version="2.13.0+cpu", files={"torch/__init__.py": ""})
    monkeypatch.setattr(doctor, "detect", lambda: GpuReport((T4,), "580.1", "13.0", ("nvml",)))
    doc = json.loads(cli("doctor", "--json", "--site-packages", str(site)).out)
    torch_row = next(p for p in doc["packages"] if p["name"] == "torch")
    assert torch_row == {"name": "torch", "version": "2.13.0+cpu", "build": "cpu"}
    assert any("CPU-only" in n for n in doc["advice"])


def test_json_advice_names_the_program_the_user_ran_as_the_text_does(env, cli, monkeypatch):
    from t4patch.environment import suggest

    monkeypatch.setattr(doctor, "detect", lambda: GpuReport((T4,), "580.1", "13.0", ("nvml",)))
    suggest.set_program("/opt/venv/bin/t4patch", ("apply", "doctor", "status"))
    try:
        doc = json.loads(cli("doctor", "--json", "--site-packages", str(env.site)).out)
        text = cli("doctor", "--site-packages", str(env.site)).out
    finally:
        suggest.reset_program()
    bangs = [line[2:] for line in text.splitlines() if line.startswith("! ")]
    assert doc["advice"] == bangs and any("/opt/venv/bin/t4patch apply fakeengine==1.2.0" in n for n in bangs)
