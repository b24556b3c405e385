"""A third engine plugs in with its own package and one table line: the generic code paths pick it up.

The synthetic engine "zeta" is a package written into a temporary directory (an ``engine.py`` implementing
:class:`t4patch.contract.Engine`, an attention driver, a Marlin provider builder, a doctor hook), and the table
is the shipped one plus that one entry. Nothing else is edited: doctor's packages, checks, sections and JSON,
`verify marlin`'s provider listing, construction, scope and summary, and `verify attention`'s case-table
validation and worker driver import all run with that table and find the engine.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from t4patch.commands.engine_table import ENGINES
from t4patch.contract import EngineTable
from t4patch.cuda.gpu import GpuReport
from t4patch.environment.target import resolve_target
from t4patch.errors import DataFileError
from t4patch.readiness.report import gather
from t4patch.verify.attention import worker
from t4patch.verify.attention.cases import load_cases
from t4patch.verify.marlin import providers, report
from tests.helpers import T4, make_dist

ENGINE_PY = '''\
"""Zeta, a synthetic engine: only the contract, nothing of t4patch's engines or commands."""

from __future__ import annotations

from t4patch.contract import Check, DoctorSection, Engine, MarlinProvider, MarlinScope, MarlinSpec, ProviderOption

ZETA_LIB = ProviderOption(flag="--zeta-lib", dest="zeta_lib", metavar="PATH", help="zeta's library", is_path=True)


def _build(target, options, capability):
    return MarlinProvider(
        name="zeta-marlin", repack=lambda q, k, n: q, gemm=lambda *a: None, make_workspace=lambda d: None,
        info={"zeta": {"lib": options.get("zeta_lib"), "capability": list(capability)}},
    )


class ZetaEngine(Engine):
    name = "zeta"
    label = "Zeta"
    distributions = ("zeta", "zeta-kernels")
    attention_drivers = {"zeta-attention": "zeta_t4.attention:ZetaDriver"}
    attention_summary = "Zeta's paged attention"
    marlin = (
        MarlinSpec(name="zeta-marlin", help="Zeta's Marlin", build=_build,
                   summary=lambda prov: f"zeta with {prov['zeta']['lib']}", options=(ZETA_LIB,)),
    )
    marlin_scope = MarlinScope(numerics_reference="zeta#1", library="Zeta's library",
                               redirect_clause="that zeta's redirect is zeta's")
    doctor_key = "zeta"
    runtime_nvcc = "zeta compiles at first use"
    flashinfer_on_turing = "serve zeta with --no-flashinfer"
    multi_gpu_without_p2p = "--zeta-tp N"

    def doctor(self, ctx):
        zeta = ctx.target.find("zeta")
        if zeta is None:
            return None
        return DoctorSection(
            checks=(Check("zeta-ready", "warn", f"zeta {zeta.version} checked", fix="zeta --fix"),),
            warnings=("zeta needs a hint",),
            title=f"Zeta {zeta.version} on Turing:",
            lines=("  zeta line",),
            data={"zeta_version": zeta.version},
        )
'''

ATTENTION_PY = '''\
class ZetaDriver:
    def __init__(self, root, arch, model, settings):
        self.args = (root, arch, model, settings)
'''

CASES = """\
schema = 1
[model]
name = "m"
num_query_heads = 8
num_kv_heads = 1
dtype = "float16"
kv_block_size = 16
[[layer]]
name = "full"
head_size = 256
sliding_window = 0
[engine.zeta]
distribution = "zeta"
versions = ["1.0.0"]
driver = "zeta-attention"
triton = "3.8"
files = ["zeta/attn.py"]
[engine.zeta.kernel.k]
tiles = ["BLOCK"]
[[engine.zeta.case]]
name = "decode"
phase = "decode"
num_seqs = 4
query_len = 1
context_len = 64
path = "2d"
"""


@pytest.fixture()
def table(tmp_path, monkeypatch) -> EngineTable:
    """The shipped table plus one line: the synthetic engine, imported from its own package only."""
    package = tmp_path / "code" / "zeta_t4"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "engine.py").write_text(ENGINE_PY)
    (package / "attention.py").write_text(ATTENTION_PY)
    monkeypatch.syspath_prepend(str(tmp_path / "code"))
    for name in [n for n in sys.modules if n == "zeta_t4" or n.startswith("zeta_t4.")]:
        monkeypatch.delitem(sys.modules, name)
    zeta = importlib.import_module("zeta_t4.engine").ZetaEngine()
    return EngineTable((*ENGINES.engines, zeta))  # the one table line


def zeta_site(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    make_dist(site, name="zeta", version="1.0.0", files={"zeta/__init__.py": ""})
    return site


def test_doctor_lists_checks_and_reports_the_new_engine(table, tmp_path, monkeypatch):
    import t4patch.readiness.stack as stack

    monkeypatch.setattr(stack, "nvcc_release", lambda: (None, None))
    found = gather(resolve_target(None, str(zeta_site(tmp_path))), GpuReport((T4,), "580.1", "13.0", ("nvml",)), table)
    doc = found.to_json()
    names = [p["name"] for p in doc["packages"]]
    assert names[: len(table.distributions())] == list(table.distributions()) and "zeta-kernels" in names
    assert {"name": "zeta", "version": "1.0.0"} in doc["packages"]
    assert doc["zeta"] == {"zeta_version": "1.0.0"}  # its doctor key, from its one hook
    assert doc["sglang"] is None  # the shipped engines' keys are still there
    zeta_check = next(c for c in doc["checks"] if c["name"] == "zeta-ready")
    assert zeta_check == {"name": "zeta-ready", "status": "warn", "reason": "zeta 1.0.0 checked", "fix": "zeta --fix"}
    assert doc["checks"].index(zeta_check) == len(doc["checks"]) - 1  # after the generic checks, in table order
    assert "zeta needs a hint" in doc["advice"]
    nvcc = next(c for c in doc["checks"] if c["name"] == "nvcc")
    assert nvcc["status"] == "warn" and "zeta (zeta compiles at first use)" in nvcc["reason"]
    assert ("Zeta 1.0.0 on Turing:", ("  zeta line",)) in [
        (s.title, s.lines) for _, s in found.sections if s is not None
    ]


def test_doctor_without_the_engine_installed_says_null(table, tmp_path, monkeypatch):
    import t4patch.readiness.stack as stack

    monkeypatch.setattr(stack, "nvcc_release", lambda: (None, None))
    site = tmp_path / "empty"
    site.mkdir()
    doc = gather(resolve_target(None, str(site)), GpuReport((), None, None, ()), table).to_json()
    assert doc["zeta"] is None and not [c for c in doc["checks"] if c["name"] == "zeta-ready"]


def test_verify_marlin_lists_builds_and_scopes_the_new_provider(table, tmp_path):
    assert providers.provider_names(table)[-1] == "zeta-marlin"
    assert "zeta-marlin" not in providers.provider_names(ENGINES)
    target = resolve_target(None, str(tmp_path))
    built = providers.make_provider("zeta-marlin", target, {"zeta_lib": "/z.so"}, (9, 0), table)
    assert built.name == "zeta-marlin" and built.info["zeta"] == {"lib": "/z.so", "capability": [9, 0]}
    proves, does_not = report.scope((9, 0), "H200", table, "zeta-marlin")
    assert "zeta#1" in " ".join(does_not) and "Zeta's library" in " ".join(does_not)
    assert "that zeta's redirect is zeta's" in proves[0]
    assert report.provider_summary({"name": "zeta-marlin", **built.info}, table) == "zeta with /z.so"
    assert [o.flag for o in table.marlin_specs()[-1].options] == ["--zeta-lib"]


def test_verify_attention_accepts_its_driver_and_the_worker_imports_it(table, tmp_path):
    path = tmp_path / "cases.toml"
    path.write_text(CASES)
    (engine,) = load_cases(path, drivers=table.attention_drivers()).engines
    assert engine.driver == "zeta-attention" and engine.driver_class == "zeta_t4.attention:ZetaDriver"
    with pytest.raises(DataFileError, match="zeta-attention"):
        load_cases(path, drivers=ENGINES.attention_drivers())  # the shipped table does not know it
    request = {
        "engine": {"driver": engine.driver, "driver_class": engine.driver_class, "settings": {"max_kv_splits": 2}},
        "root": str(tmp_path), "arch": {"name": "sm_75"}, "model": {"name": "m"},
    }
    driver = worker._make_driver(request)
    assert type(driver).__name__ == "ZetaDriver" and driver.args[3] == {"max_kv_splits": 2}


def test_a_name_used_twice_is_refused(table):
    with pytest.raises(ValueError, match="listed twice"):
        EngineTable((*table.engines, table[-1]))


def test_the_new_engine_needed_no_edit_outside_its_package():
    """The zeta package above imports only the contract; the generic modules it ran through import no table."""
    assert "t4patch.engines" not in ENGINE_PY and "t4patch.commands" not in ENGINE_PY
    for module in (providers, report, worker, sys.modules["t4patch.readiness.report"]):
        source = Path(module.__file__).read_text(encoding="utf-8")  # type: ignore[arg-type]
        assert "engine_table" not in source.replace("# ", "")
