"""`verify attention` on the real released wheels: Triton compiles of every shipped vLLM and SGLang release's
own attention launches for sm_75 and sm_80, stock and with t4patch's patch sets applied.

The releases run in three generations (vLLM 0.33.0 + SGLang 0.5.23, 0.32.0 + 0.5.22, 0.31.0 + 0.5.21). A
release is compiled with the Triton series its pinned torch requires (cases/attention-cases.toml): in this
interpreter when its triton is that series, else in the interpreter named by ``T4PATCH_TEST_PYTHON_TRITON_<X_Y>``
(e.g. ``T4PATCH_TEST_PYTHON_TRITON_3_7``: a venv with triton 3.7.1 and a CPU torch); without one that release's
reports are skipped, naming the variable. Results from another compiler would not be the engine's.

Needs torch (CPU build) and triton 3.8 in this interpreter (the `verify` extra); skipped cleanly otherwise.
Each (tree, engine, arch) is compiled once per session and shared by the tests below. Compiled kernels are
cached in t4patch's Triton cache (~/.cache/t4patch/triton or $TRITON_CACHE_DIR): about 4 minutes on a cold
cache, about 1.5 minutes warm, on a 2-core CPU box.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest

from t4patch.cli import main
from t4patch.environment.target import resolve_target
from t4patch.errors import MissingDependencyError, VerificationError
from t4patch.patching.registry import all_patch_sets, find_patch_set
from t4patch.verify.attention.cases import load_archs, load_cases
from t4patch.verify.attention.runner import check, verify_attention
from tests.helpers import install_wheel_to, wheel_path

pytestmark = pytest.mark.integration

torch = pytest.importorskip("torch", reason="verify attention needs torch (CPU build is enough)")
triton = pytest.importorskip("triton", reason="verify attention needs triton 3.8")
if ".".join(triton.__version__.split(".")[:2]) != "3.8":
    pytest.skip(f"triton {triton.__version__} here; the engines pin 3.8.x", allow_module_level=True)

# vLLM imports `regex`; a pip --target tree has no dependencies, so the test gives the tree the one it needs.
REGEX_VERSION = "2026.11.19"
T4_LIMIT = 65536
ARCHS = load_archs()
CASES = load_cases()
SERIES = ".".join(triton.__version__.split(".")[:2])


def _versions(name: str) -> list[str]:
    return sorted((ps.version for ps in all_patch_sets() if ps.distribution == name), key=lambda v: tuple(map(int, v.split("."))), reverse=True)


GENERATIONS = list(zip(_versions("vllm"), _versions("sglang")))


def series_for(engine: str, version: str) -> str:
    cases = CASES.engine(engine)
    assert cases is not None
    return cases.for_version(version).triton_series


def interpreter_for(series: str) -> str | None:
    """None: this interpreter has that series; else the interpreter the environment names (or skip)."""
    if series == SERIES:
        return None
    variable = "T4PATCH_TEST_PYTHON_TRITON_" + series.replace(".", "_")
    python = os.environ.get(variable)
    if not python:
        pytest.skip(f"needs triton {series}.x (this interpreter has {triton.__version__}): set {variable} to a "
                    f"python with triton {series} and a CPU torch")
    return python


def _hardlink_copy(src: Path, dst: Path, ignore=None) -> Path:
    shutil.copytree(src, dst, copy_function=os.link, ignore=ignore)
    return dst


def _apply(site: Path, spec: str) -> None:
    code = main(["apply", spec, "--site-packages", str(site)])
    assert code == 0, f"t4patch apply {spec} failed with exit {code}"


@pytest.fixture(scope="module", params=GENERATIONS, ids=[f"vllm{v}-sglang{g}" for v, g in GENERATIONS])
def trees(request, tmp_path_factory) -> dict[str, Path]:
    vllm_version, sglang_version = request.param
    base = tmp_path_factory.mktemp(f"attention-fit-{vllm_version}")
    vllm = install_wheel_to(base / "vllm-stock", wheel_path("vllm", vllm_version))
    if importlib.util.find_spec("regex") is None:
        install_wheel_to(vllm, wheel_path("regex", REGEX_VERSION))
    out = {"vllm-stock": vllm}
    out["vllm-no-regex"] = _hardlink_copy(vllm, base / "vllm-no-regex", ignore=shutil.ignore_patterns("regex*"))
    out["vllm-patched"] = _hardlink_copy(vllm, base / "vllm-patched")
    _apply(out["vllm-patched"], f"vllm=={vllm_version}")
    sglang = install_wheel_to(base / "sglang-stock", wheel_path("sglang", sglang_version))
    out["sglang-stock"] = sglang
    try:
        find_patch_set("sglang", sglang_version)
    except Exception:  # noqa: BLE001 - no SGLang patch set shipped (yet): the patched SGLang tests skip
        pass
    else:
        out["sglang-patched"] = _hardlink_copy(sglang, base / "sglang-patched")
        _apply(out["sglang-patched"], f"sglang=={sglang_version}")
    out_versions = {"vllm": vllm_version, "sglang": sglang_version}
    return {**out, "_versions": out_versions}  # type: ignore[dict-item]


_REPORTS: dict[tuple[str, str, str, str], object] = {}


@pytest.fixture(scope="module")
def report(trees):
    def get(tree: str, engine: str, arch: str):
        version = trees["_versions"][engine]
        python = interpreter_for(series_for(engine, version))
        key = (tree, engine, version, arch)
        if key not in _REPORTS:
            if tree not in trees:
                pytest.skip(f"no {tree} tree (patch set not shipped)")
            site = trees[tree]
            _REPORTS[key] = verify_attention(
                [engine], ARCHS[arch], resolve_target(site_packages=str(site)), python=python,
                site_packages=str(site)
            )
        return _REPORTS[key]

    return get


def trees_version(rep) -> str:
    (engine,) = rep.engines
    return engine.version


def table(rep) -> dict[tuple[str, str], list[tuple[str, dict, int, int]]]:
    """(layer, case) -> [(kernel, tiles, warps, shared bytes)] for the single engine of ``rep``."""
    (engine,) = rep.engines
    return {
        (c.layer, c.case): [(k.kernel, k.tiles, k.num_warps, k.shared_bytes) for k in c.kernels]
        for c in engine.cases
    }


def shared(rep, layer: str, case: str, kernel: str) -> int:
    return next(k[3] for k in table(rep)[(layer, case)] if k[0] == kernel)


# --------------------------------------------------------------------------------------------------- vLLM


def test_stock_vllm_head512_2d_needs_98304_bytes_on_sm75(report):
    rep = report("vllm-stock", "vllm", "sm_75")
    assert not rep.ok
    (engine,) = rep.engines
    assert engine.patch_state == "stock, patch set not applied"
    assert engine.versions["triton"].startswith(series_for("vllm", trees_version(rep)) + ".")
    paths = {(c.layer, c.case): c.path for c in engine.cases}
    assert paths[("full", "prefill")] == "2d" and paths[("full", "decode-small")] == "3d"
    assert paths[("full", "decode-large")] == "2d"
    for case in ("prefill", "decode-large"):
        ((kernel, tiles, warps, nbytes),) = table(rep)[("full", case)]
        assert (kernel, tiles["BLOCK_M"], tiles["TILE_SIZE"], warps, nbytes) == (
            "kernel_unified_attention", 16, 32, 4, 98304)
    assert shared(rep, "full", "decode-small", "kernel_unified_attention") == 65536  # 3D: exactly at the limit
    assert shared(rep, "full", "decode-small", "reduce_segments") == 0
    assert shared(rep, "sliding", "prefill", "kernel_unified_attention") == 49152
    assert shared(rep, "sliding", "decode-small", "kernel_unified_attention") == 32768
    assert shared(rep, "sliding", "decode-small", "reduce_segments") == 2048
    assert sorted((c.layer, c.case) for _, c in rep.failures()) == [
        ("full", "decode-large"), ("full", "int4-decode-large"), ("full", "int4-decode-small"), ("full", "int4-prefill"),
        ("full", "prefill")]
    with pytest.raises(VerificationError) as info:
        check(rep)
    assert info.value.exit_code == 12
    for c in engine.cases:  # registers and spills come from the cubins
        assert all(k.registers and k.registers > 0 and k.spills is not None for k in c.kernels)


def test_patched_vllm_fits_sm75_and_leaves_head256_alone(report):
    stock, patched = report("vllm-stock", "vllm", "sm_75"), report("vllm-patched", "vllm", "sm_75")
    assert patched.ok, patched.render_text()
    assert patched.engines[0].patch_state == "patch set applied"
    check(patched)
    for case in ("prefill", "decode-large"):
        ((kernel, tiles, _, nbytes),) = table(patched)[("full", case)]
        assert (tiles["TILE_SIZE"], nbytes) == (16, 65536)
    assert not [c for c in patched.engines[0].cases if c.refused and not c.case.startswith("int4-")]
    for (layer, case), kernels in table(patched).items():
        assert all(k[3] <= T4_LIMIT for k in kernels)
        if layer == "sliding":
            assert kernels == table(stock)[(layer, case)], f"head 256 {case} changed"
    # the 3D path already fit; the clamp must not have moved it
    assert table(patched)[("full", "decode-small")] == table(stock)[("full", "decode-small")]


def test_stock_vllm_int4_kv_cache_head512_misfits_sm75_at_every_tile(report):
    """--kv-cache-dtype int4_per_token_head: _attn_packed, launched past the core kernel's clamp."""
    rep = report("vllm-stock", "vllm", "sm_75")
    (engine,) = rep.engines
    cases = {(c.layer, c.case): c for c in engine.cases}
    assert [cases[("full", n)].path for n in ("int4-prefill", "int4-decode-small", "int4-decode-large")] == [
        "2d", "3d", "2d"]
    expected = {  # (layer, case) -> (TILE_SIZE, shared bytes) of _attn_packed, BLOCK_M 16
        ("full", "int4-prefill"): (32, 163840), ("full", "int4-decode-small"): (16, 98304),
        ("full", "int4-decode-large"): (32, 163840), ("sliding", "int4-prefill"): (32, 51200),
        ("sliding", "int4-decode-small"): (16, 33792), ("sliding", "int4-decode-large"): (32, 51200),
    }
    for key, (tile, nbytes) in expected.items():
        kernel = next(k for k in cases[key].kernels if k.kernel == "_attn_packed")
        assert (kernel.tiles["BLOCK_M"], kernel.tiles["TILE_SIZE"], kernel.shared_bytes) == (16, tile, nbytes), key
        assert kernel.fits == (key[0] == "sliding") and not cases[key].refused
    # even the 3D decode at tile 16, the clamp's floor, needs 98,304 B: no tile fits head 512 on a T4
    assert "_attn_packed needs 98,304 B" in " ".join(cases[("full", "int4-decode-small")].problems)


def test_patched_vllm_int4_kv_cache_refuses_head512_clearly_on_sm75(report):
    stock, patched = report("vllm-stock", "vllm", "sm_75"), report("vllm-patched", "vllm", "sm_75")
    (engine,) = patched.engines
    for c in engine.cases:
        if c.layer == "full" and c.case.startswith("int4-"):
            assert c.refused and not c.kernels and not c.problems, c
            assert c.refused.startswith("t4patch: the INT4 per-token-head KV cache attention kernel (_attn_packed)")
            for part in ("needs 98304 B", "head size 512", "smallest KV tile 16", "allows 65536 B per block",
                         "--kv-cache-dtype auto"):
                assert part in c.refused, (part, c.refused)
            assert "OutOfResources" not in c.refused
        else:
            assert not c.refused
    for case in ("int4-prefill", "int4-decode-small", "int4-decode-large"):  # head 256 fits as it was
        assert table(patched)[("sliding", case)] == table(stock)[("sliding", case)]
    text = patched.render_text()
    assert "REFUSED full/int4-prefill (clearly, before launch): t4patch: the INT4" in text
    assert "3 refused clearly by the patched engine" in text
    check(patched)  # a clear refusal is not a misfit: exit 0


def test_vllm_patch_changes_nothing_on_sm80(report):
    stock, patched = report("vllm-stock", "vllm", "sm_80"), report("vllm-patched", "vllm", "sm_80")
    assert stock.ok and patched.ok
    assert table(stock) == table(patched)
    assert not [c for c in patched.engines[0].cases if c.refused]
    assert all(table(patched)[("full", c)] for c in ("int4-prefill", "int4-decode-small", "int4-decode-large"))
    assert shared(stock, "full", "prefill", "kernel_unified_attention") == 83200  # MMA path, fp16 operands


def test_nothing_is_written_into_the_target(report, trees):
    report("vllm-stock", "vllm", "sm_75")
    report("sglang-stock", "sglang", "sm_75")
    for name in ("vllm-stock", "sglang-stock"):
        site = trees[name]
        assert not list(site.rglob("__pycache__")), f"bytecode written into {name}"
        dist = resolve_target(site_packages=str(site)).find(name.split("-")[0])
        record = dist.record()
        rep = report(name, name.split("-")[0], "sm_75")
        for rel, digest in rep.engines[0].files.items():
            assert digest == record[rel], f"{rel} differs from RECORD"


def test_cli_exit_code_and_json_on_the_stock_wheel(report, trees, capsys):
    series = series_for("vllm", trees["_versions"]["vllm"])
    if series != SERIES:  # the CLI runs its worker in this interpreter; --python would also move the target
        pytest.skip(f"vllm {trees['_versions']['vllm']} compiles with triton {series}; this interpreter has {SERIES}")
    report("vllm-stock", "vllm", "sm_75")  # warm the compile cache first
    code = main(["verify", "attention", "vllm", "--site-packages", str(trees["vllm-stock"]), "--json"])
    captured = capsys.readouterr()
    assert code == 12
    doc = json.loads(captured.out)
    assert doc["schema"] == 1 and doc["command"] == "verify attention" and doc["failed_cases"] == 5
    assert "do not fit sm_75" in captured.err


def test_missing_engine_dependency_is_named(trees):
    if importlib.util.find_spec("regex") is not None:
        pytest.skip("regex is importable in this interpreter, so it cannot be missing for the worker")
    site = trees["vllm-no-regex"]
    with pytest.raises(MissingDependencyError) as info:
        verify_attention(["vllm"], ARCHS["sm_75"], resolve_target(site_packages=str(site)), site_packages=str(site))
    assert info.value.exit_code == 10
    assert "regex" in info.value.message and info.value.hint.endswith("-m pip install regex")


# --------------------------------------------------------------------------------------------------- SGLang


def test_stock_sglang_extend_and_decode_misfit_sm75(report):
    rep = report("sglang-stock", "sglang", "sm_75")
    assert not rep.ok
    assert shared(rep, "full", "prefill", "_fwd_kernel") == 131072
    assert shared(rep, "full", "decode-small", "_fwd_grouped_kernel_stage1") == 98304
    assert shared(rep, "full", "decode-large", "_fwd_grouped_kernel_stage1") == 98304
    assert shared(rep, "sliding", "prefill", "_fwd_kernel") == 32768
    assert shared(rep, "sliding", "decode-small", "_fwd_grouped_kernel_stage1") == 49152
    assert sorted(c.case for _, c in rep.failures()) == ["decode-large", "decode-small", "prefill"]


def test_patched_sglang_fits_sm75_and_leaves_head256_alone(report):
    stock, patched = report("sglang-stock", "sglang", "sm_75"), report("sglang-patched", "sglang", "sm_75")
    assert patched.ok, patched.render_text()
    for (layer, case), kernels in table(patched).items():
        assert all(k[3] <= T4_LIMIT for k in kernels)
        if layer == "sliding":
            assert kernels == table(stock)[(layer, case)], f"head 256 {case} changed"


def test_sglang_patch_changes_nothing_on_sm80(report):
    stock, patched = report("sglang-stock", "sglang", "sm_80"), report("sglang-patched", "sglang", "sm_80")
    assert table(stock) == table(patched)
