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

With t4patch's Triton set (issue 21): the real Triton wheel of each series is installed into a directory and
patched with ``t4patch apply triton==X``, and the compile worker imports it from there (``PYTHONPATH``, ahead of
this interpreter's own triton, as a serving environment with the patched Triton would); verify attention then
compiles every launch twice, patched and with ``T4PATCH_TRITON_MMA=0``, for every release of both engines (torch
here serves both series: a compile does not load torch's CUDA code). Roughly twice the time of the stock runs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest

from t4patch.cli import main
from t4patch.commands.engine_table import ENGINES
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
CASES = load_cases(drivers=ENGINES.attention_drivers())  # as the command loads it
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


_REPORTS: dict[tuple[str, str, str, str, bool], object] = {}
_TRITON_TREES: dict[str, Path] = {}


def patched_triton(series: str, tmp_path_factory) -> Path:
    """The real Triton wheel of ``series`` in a directory of its own, with t4patch's Triton set applied."""
    if series not in _TRITON_TREES:
        version = max((ps.version for ps in all_patch_sets() if ps.distribution == "triton"
                       and ps.version.startswith(series + ".")), default=None)
        if version is None:
            pytest.skip(f"no t4patch Triton set for triton {series}")
        site = install_wheel_to(tmp_path_factory.mktemp(f"triton-{version}"), wheel_path("triton", version))
        _apply(site, f"triton=={version}")
        _TRITON_TREES[series] = site
    return _TRITON_TREES[series]


@pytest.fixture(scope="module")
def report(trees, tmp_path_factory):
    def get(tree: str, engine: str, arch: str, *, triton_set: bool = False):
        version = trees["_versions"][engine]
        series = series_for(engine, version)
        key = (tree, engine, version, arch, triton_set)
        if key not in _REPORTS:
            if tree not in trees:
                pytest.skip(f"no {tree} tree (patch set not shipped)")
            site = trees[tree]
            target = resolve_target(site_packages=str(site))
            if triton_set:  # the worker (this interpreter) imports the patched Triton of the release's series
                with pytest.MonkeyPatch.context() as mp:
                    mp.setenv("PYTHONPATH", str(patched_triton(series, tmp_path_factory)))
                    _REPORTS[key] = verify_attention([engine], ARCHS[arch], target, site_packages=str(site),
                                                     table=CASES)
            else:
                _REPORTS[key] = verify_attention([engine], ARCHS[arch], target, python=interpreter_for(series),
                                                 site_packages=str(site), table=CASES)
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
        verify_attention(["vllm"], ARCHS["sm_75"], resolve_target(site_packages=str(site)), site_packages=str(site),
                         table=CASES)
    assert info.value.exit_code == 10
    # one command installs the whole verify extra (regex is one of its modules) into t4patch's interpreter
    assert "regex" in info.value.message and "verify extra" in info.value.message
    assert "-m pip install" in info.value.hint and "regex" in info.value.hint.split()


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


# ------------------------------------------------------------------------------- with t4patch's Triton set (21)


def _launches(rep):
    (engine,) = rep.engines
    return [(c, k) for c in engine.cases for k in c.kernels]


def _kernel(rep, layer: str, case: str, name: str):
    (engine,) = rep.engines
    return next(k for c in engine.cases if (c.layer, c.case) == (layer, case) for k in c.kernels if k.kernel == name)


def _assert_every_fp16_launch_on_tensor_cores(rep) -> int:
    """Every launch with an fp16 dot: mma path, 0 spills, within a T4's 65,536 B; its stock compile: FMA."""
    (engine,) = rep.engines
    assert engine.compiler["t4patch_set"] == "applied" and engine.compiler["passes"] == ["patched", "stock"]
    assert engine.compiler["pass_environment"]["stock"] == {"T4PATCH_TRITON_MMA": "0"}
    assert engine.compiler["pass_environment"]["patched"] == {"T4PATCH_TRITON_MMA": None}
    checked = 0
    for case, k in _launches(rep):
        assert k.shared_bytes <= T4_LIMIT, (case.layer, case.case, k.kernel, k.shared_bytes)
        if k.fp16_dots:
            checked += 1
            assert (k.dot_path, k.fp16_dots_on_fma, k.spills) == ("mma", 0, 0), (case.layer, case.case, k)
            assert k.mma_sync and k.mma_sync > 0
            assert k.stock is not None and k.stock.dot_path == "fma" and k.stock.mma_sync == 0, (case.case, k.stock)
            assert k.stock.fma_f32 and k.stock.fma_f32 > k.fma_f32
    return checked


def test_triton_set_puts_every_patched_vllm_fp16_attention_launch_on_mma_sm75(report):
    rep = report("vllm-patched", "vllm", "sm_75", triton_set=True)
    assert rep.ok, rep.render_text()
    check(rep)  # exit 0
    assert _assert_every_fp16_launch_on_tensor_cores(rep) == 6  # 2D, 3D and 2D-decode core kernel, both layers
    # tiles from what the compiler reports: head 512 2D misfits at TILE 32 on tensor cores (81,920 B), so 16
    for case in ("prefill", "decode-large"):
        k = _kernel(rep, "full", case, "kernel_unified_attention")
        assert (k.tiles["BLOCK_M"], k.tiles["TILE_SIZE"], k.shared_bytes) == (16, 16, 49152)
        assert (k.stock.tiles["TILE_SIZE"], k.stock.shared_bytes) == (16, 65536)  # the FMA path, as without the set
        head256 = _kernel(rep, "sliding", case, "kernel_unified_attention")
        assert (head256.tiles["TILE_SIZE"], head256.shared_bytes) == (32, 25600)
        assert (head256.stock.tiles["TILE_SIZE"], head256.stock.shared_bytes) == (32, 49152)
    # INT4 per-token-head KV: _attn_packed's dots are fp32 x fp32 by design (it dequantizes to float32), so the
    # set leaves it on FMA and it is not required on tensor cores; head 512 is still refused clearly
    packed = _kernel(rep, "sliding", "int4-prefill", "_attn_packed")
    assert packed.dot_path == "fma" and not packed.fp16_dots and set(packed.dot_types) == {"f32*f32->f32"}
    (engine,) = rep.engines
    assert [c.case for c in engine.cases if c.refused] == ["int4-prefill", "int4-decode-small", "int4-decode-large"]
    text = " ".join(rep.render_text().split())
    assert "t4patch's Triton set applied: every launch compiled as patched (rows) and with T4PATCH_TRITON_MMA=0" in text


def test_triton_set_on_the_stock_vllm_shows_why_the_tiles_must_be_chosen_as_compiled(report):
    """Without the engine diff, vLLM's own TILE 32 at head 512 still misfits on tensor cores (81,920 B)."""
    rep = report("vllm-stock", "vllm", "sm_75", triton_set=True)
    k = _kernel(rep, "full", "prefill", "kernel_unified_attention")
    assert (k.dot_path, k.tiles["TILE_SIZE"], k.shared_bytes, k.fits) == ("mma", 32, 81920, False)
    assert (k.stock.dot_path, k.stock.shared_bytes) == ("fma", 98304)
    with pytest.raises(VerificationError) as info:
        check(rep)
    assert info.value.exit_code == 12


def test_triton_set_puts_every_patched_sglang_fp16_attention_launch_on_mma_sm75(report):
    rep = report("sglang-patched", "sglang", "sm_75", triton_set=True)
    assert rep.ok, rep.render_text()
    check(rep)
    assert _assert_every_fp16_launch_on_tensor_cores(rep) == 6  # extend + grouped decode, both layers
    # head 512: extend halves BLOCK_M first and the tensor-core compile keeps BLOCK_N 32 ((32, 16) would have
    # several of the 8 warps, laid along N, compute the same QK^T columns); decode keeps BLOCK_N 32
    extend = _kernel(rep, "full", "prefill", "_fwd_kernel")
    assert (extend.tiles["BLOCK_M"], extend.tiles["BLOCK_N"], extend.shared_bytes) == (16, 32, 50176)
    assert (extend.stock.tiles["BLOCK_M"], extend.stock.tiles["BLOCK_N"], extend.stock.shared_bytes) == (16, 16, 65536)
    for case in ("decode-small", "decode-large"):
        decode = _kernel(rep, "full", case, "_fwd_grouped_kernel_stage1")
        assert (decode.tiles["BLOCK_N"], decode.shared_bytes) == (32, 50176)
        assert (decode.stock.tiles["BLOCK_N"], decode.stock.shared_bytes) == (16, 65536)
    head256 = _kernel(rep, "sliding", "prefill", "_fwd_kernel")
    assert (head256.tiles["BLOCK_M"], head256.tiles["BLOCK_N"]) == (32, 32)


def test_an_interpreter_without_the_verify_modules_hears_about_all_of_them_at_once(tmp_path, capsys):
    """Issue 23: one run names torch, triton, numpy and regex together, with one install command."""
    import subprocess
    import sys

    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               check=True, capture_output=True, text=True).stdout.strip())
    install_wheel_to(site, wheel_path("vllm", "0.33.0"))
    code = main(["verify", "attention", "vllm", "--python", str(python)])
    err = capsys.readouterr().err
    assert code == 10, err
    text = " ".join(err.split())
    assert "cannot import torch, triton, numpy, regex" in text and "verify extra" in text
    assert f"{python} -m pip install --extra-index-url https://download.pytorch.org/whl/cpu" in text
    for spec in ("'torch>=2.4'", "'triton~=3.8.0'", "numpy", "regex"):
        assert spec in text.split(), (spec, text)
