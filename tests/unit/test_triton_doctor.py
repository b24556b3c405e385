"""doctor's Triton check: which dot path fp16 tl.dot takes on sm_75 in the target, from files and the switch.

A synthetic Triton 3.8.0 (its compiler.py stand-in) and a synthetic patch set for it (T4PATCH_PATCHES), so the
state machinery is the real one and no wheel is needed; the real set on the real wheel is
tests/integration/test_triton_real.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from t4patch.commands.engine_table import ENGINES
from t4patch.contract import Context
from t4patch.cuda.gpu import Gpu, GpuReport
from t4patch.engines.triton.doctor import CHECK, SWITCH, section
from t4patch.environment.target import resolve_target
from tests.helpers import T4, make_dist, make_patch_set

A100 = Gpu(0, "NVIDIA A100", "8.0", 166912, 108, 40 * 2**30)
ROOMY = {"ram_total": 64 * 2**30, "ram_available": 60 * 2**30, "swap_total": 0, "swap_free": 0}
COMPILER = "triton/backends/nvidia/compiler.py"
STOCK = "def make_ttgir():\n    return 'fma'\n"
PATCHED = "def make_ttgir():\n    return 'mma'  # t4patch\n"


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    patches = tmp_path / "patches"
    make_patch_set(patches, name="triton", version="3.8.0", changes=[(COMPILER, STOCK, PATCHED)])
    monkeypatch.setenv("T4PATCH_PATCHES", str(patches))
    monkeypatch.delenv(SWITCH, raising=False)
    return make_dist(tmp_path / "site", name="triton", version="3.8.0", files={COMPILER: STOCK})


def check(site: Path, gpus: tuple[Gpu, ...] = (T4,)):
    ctx = Context(resolve_target(None, str(site)), GpuReport(gpus, "580.1", "13.0", ("nvml",)), ROOMY, ENGINES)
    found = section(ctx)
    assert found is not None
    (only,) = found.checks
    assert only.name == CHECK
    return only


def test_not_applied_on_a_t4_warns_with_the_apply_command_for_that_target(site):
    found = check(site)
    assert found.status == "warn" and "fp32 FMA" in found.reason
    assert found.fix is not None and "apply triton==3.8.0" in found.fix and f"--site-packages {site}" in found.fix


def test_applied_on_a_t4_is_ok_and_names_the_switch(site, cli):
    assert cli("apply", "triton==3.8.0", "--site-packages", str(site)).code == 0
    found = check(site)
    assert found.status == "ok" and "tensor cores" in found.reason and f"{SWITCH}=0" in found.reason


def test_switch_off_warns_and_a_bad_value_fails(site, cli, monkeypatch):
    assert cli("apply", "triton==3.8.0", "--site-packages", str(site)).code == 0
    monkeypatch.setenv(SWITCH, "0")
    off = check(site)
    assert off.status == "warn" and "FMA" in off.reason and off.fix == f"unset {SWITCH}"
    monkeypatch.setenv(SWITCH, "on")
    bad = check(site)
    assert bad.status == "fail" and "'on'" in bad.reason
    monkeypatch.setenv(SWITCH, "1")
    assert check(site).status == "ok"


def test_without_a_turing_gpu_the_set_changes_nothing(site):
    found = check(site, gpus=(A100,))
    assert found.status == "ok" and ">= 8.0" in found.reason


def test_no_set_for_the_installed_release_says_which_exist(tmp_path, site):
    other = make_dist(tmp_path / "other", name="triton", version="3.6.0", files={COMPILER: STOCK})
    found = check(other)
    assert found.status == "warn" and "3.8.0" in found.reason and found.fix is not None and "list" in found.fix


def test_not_installed_gives_no_section(tmp_path, site):
    ctx = Context(resolve_target(None, str(tmp_path)), GpuReport((T4,), None, None, ()), ROOMY, ENGINES)
    assert section(ctx) is None
