"""doctor's SGLang section: what the patched SGLang needs beside it on a Turing GPU."""

from __future__ import annotations

import json

import t4patch.commands.doctor as doctor
from t4patch.cuda.gpu import GpuReport
from t4patch.engines.vllm.readiness import count_marlin_kernels
from tests.helpers import T4, make_dist


def make_sglang_env(tmp_path, vllm_version: str | None = "0.33.0", torch_version: str = "2.14.1"):
    site = tmp_path / "site"
    make_dist(site, name="sglang", version="0.5.23", files={"sglang/__init__.py": ""})
    meta = site / "sglang-0.5.23.dist-info" / "METADATA"
    meta.write_text(meta.read_text() + "Requires-Dist: torch==2.14.1\nRequires-Dist: pytest; extra == 'test'\n")
    make_dist(site, name="torch", version=torch_version, files={"torch/__init__.py": ""})
    if vllm_version:
        make_dist(site, name="vllm", version=vllm_version, files={"vllm/__init__.py": ""})
    return site


def doctor_json(cli, site, monkeypatch):
    monkeypatch.setattr(doctor, "detect", lambda: GpuReport((T4,), "580.1", "13.0", ("nvml",)))
    result = cli("doctor", "--json", "--site-packages", str(site))
    assert result.code == 0, result.err
    return json.loads(result.out)


def test_missing_vllm_is_named_with_the_install_command(tmp_path, cli, monkeypatch):
    site = make_sglang_env(tmp_path, vllm_version=None)
    doc = doctor_json(cli, site, monkeypatch)
    assert doc["sglang"]["vllm_version"] is None
    # aimed at the --site-packages directory (issue 23.3), as apply's companion warning is; never vLLM's deps
    wanted = f"-m pip install --upgrade --target {site} --no-deps vllm==0.33.0"
    assert any(note.endswith(wanted) for note in doc["advice"]), doc["advice"]


def test_missing_torch_names_the_command(tmp_path, cli, monkeypatch):
    site = make_sglang_env(tmp_path)
    for path in site.glob("torch*"):
        import shutil

        shutil.rmtree(path)
    notes = doctor_json(cli, site, monkeypatch)["advice"]
    line = next(note for note in notes if note.startswith("torch is not installed"))
    assert f"-m pip install --upgrade --target {site} torch==2.14.1 " in line  # SGLang's own pin, into the target


def test_wrong_vllm_and_missing_library_and_torch_pin(tmp_path, cli, monkeypatch):
    doc = doctor_json(cli, make_sglang_env(tmp_path, vllm_version="0.32.0", torch_version="2.13.0"), monkeypatch)
    notes = "\n".join(doc["advice"])
    assert "vLLM 0.32.0 is installed" in notes
    assert "_C_stable_libtorch.abi3.so is missing" in notes
    assert "torch 2.13.0 does not satisfy SGLang's torch==2.14.1" in notes
    assert doc["sglang"]["torch_pins"]["sglang"] == "==2.14.1"


def test_no_sglang_no_section(env, cli, monkeypatch):
    doc = doctor_json(cli, env.site, monkeypatch)
    assert doc["sglang"] is None


def test_count_marlin_kernels_on_synthetic_names(monkeypatch):
    import t4patch.engines.vllm.readiness as support

    names = {
        b"a": ["_ZN6marlin6MarlinILl1ELl2EEEvv", "_ZN6marlin13MarlinDefaultEv", "rms_norm_kernel"],
        b"b": ["_ZN4vllm25gptq_marlin_repack_kernelILi256ELi4ELb0EEEvv"],
    }
    monkeypatch.setattr(support, "function_names", lambda cubin: names[cubin])
    assert count_marlin_kernels([b"a", b"b"]) == (2, 1)
