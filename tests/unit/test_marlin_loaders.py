"""How `verify marlin` reaches engine code without importing the engines: the SGLang skeleton loader, vLLM's
wrappers rebuilt from source, the compiled-library lookup, and the patched-install check."""

from __future__ import annotations

import lzma
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from t4patch.commands.engine_table import ENGINES  # noqa: E402
from t4patch.engines.sglang import marlin as sglang_loader  # noqa: E402
from t4patch.engines.sglang.marlin_provider import SGLANG_TARGET_FILES  # noqa: E402
from t4patch.engines.vllm import marlin as vllm_lib  # noqa: E402
from t4patch.environment.target import resolve_target  # noqa: E402
from t4patch.errors import ForeignFileError, MissingDependencyError, NotAppliedError  # noqa: E402
from t4patch.patching.registry import find_patch_set  # noqa: E402
from t4patch.verify.marlin import providers  # noqa: E402


@pytest.fixture
def clean_modules():
    """The loaders install sys.modules entries and a meta-path finder; undo them after each test."""
    before_modules = set(sys.modules)
    before_path = list(sys.meta_path)
    yield
    for name in set(sys.modules) - before_modules:
        if name.split(".")[0] in ("sglang", "vllm") or name.startswith("_t4patch"):
            del sys.modules[name]
    sys.meta_path[:] = before_path


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


def fake_sglang_tree(root: Path) -> None:
    boom = "raise RuntimeError('package __init__ must not run')\n"
    for package in ("sglang", "sglang/kernels", "sglang/kernels/ops", "sglang/kernels/ops/gemm",
                    "sglang/kernels/ops/quantization", "sglang/kernels/jit", "sglang/kernels/jit/utils"):
        write(root, f"{package}/__init__.py", boom)
    write(root, "sglang/kernels/jit/utils/common.py", """
        import functools
        def cache_once(fn):
            return functools.cache(fn)
    """)
    write(root, "sglang/kernels/kernel_api_logging.py", """
        def debug_kernel_api(fn):
            return fn
    """)
    write(root, "sglang/kernels/ops/gemm/gptq_marlin.py", """
        from sglang.kernels.jit.utils import cache_once, load_jit, make_cpp_args
        from sglang.kernels.kernel_api_logging import debug_kernel_api

        @cache_once
        def _module():
            return load_jit("gptq_marlin", cuda_files=["gemm/marlin/gptq_marlin.cuh"])

        @debug_kernel_api
        def gptq_marlin_gemm(*args, **kwargs):
            return _module().gptq_marlin_gemm(*args)
    """)
    write(root, "sglang/kernels/ops/quantization/gptq_marlin_repack.py", """
        from sglang.kernels.jit.utils import cache_once, load_jit
        from sglang.kernels.ops.gemm.gptq_marlin import gptq_marlin_gemm  # a sibling import, as the patch does

        def gptq_marlin_repack(b_q_weight, perm, size_k, size_n, num_bits):
            return load_jit("gptq_marlin_repack")
    """)


def test_skeleton_loader_runs_leaf_files_only_and_stops_at_sglangs_jit(tmp_path, clean_modules):
    fake_sglang_tree(tmp_path)
    loaded = sglang_loader.load_patched_sglang(tmp_path)
    assert loaded.mode == "skeleton"
    assert any("sglang.kernels.jit.utils: stand-in" in s for s in loaded.standins)
    assert any(s.startswith("sglang: package __init__.py not executed") for s in loaded.standins)
    assert loaded.gemm_module.__file__ == str(tmp_path / "sglang/kernels/ops/gemm/gptq_marlin.py")
    with pytest.raises(sglang_loader.SGLangJitCalled, match="gptq_marlin"):
        loaded.gptq_marlin_gemm(1, 2)
    with pytest.raises(sglang_loader.SGLangJitCalled, match="not redirected"):
        loaded.gptq_marlin_repack(None, None, 1, 1, 4)


def test_skeleton_loader_reports_a_missing_third_party_import(tmp_path, clean_modules):
    fake_sglang_tree(tmp_path)
    write(tmp_path, "sglang/kernels/ops/gemm/gptq_marlin.py", "import no_such_package_xyz\n")
    with pytest.raises(MissingDependencyError, match="no_such_package_xyz"):
        sglang_loader.load_patched_sglang(tmp_path)


def test_vllm_standin_package(clean_modules):
    import types

    ops = types.ModuleType("vllm._custom_ops")
    notes = sglang_loader.install_vllm_standin(ops, None, "0.33.0")
    import vllm
    from vllm import _custom_ops

    assert vllm.__version__ == "0.33.0" and _custom_ops is ops
    assert "stand-in" in notes[0]


CUSTOM_OPS = '''
import vllm.envs as envs  # module level: must not be executed
raise RuntimeError("module body must not run")

def gptq_marlin_repack(b_q_weight, size_k: int, size_n: int, num_bits: int, is_a_8bit: bool = False):
    return torch.ops._C.gptq_marlin_repack(b_q_weight, size_k, size_n, num_bits, is_a_8bit)

def awq_marlin_repack(b_q_weight, size_k: int, size_n: int, num_bits: int, is_a_8bit: bool = False):
    return ("awq", size_k)

def marlin_gemm(a, c, b_q_weight, b_bias, b_scales, a_scales, global_scale, b_zeros, workspace,
                b_q_type: ScalarType, size_m: int, size_n: int, size_k: int, use_atomic_add=False,
                use_fp32_reduce=False, is_zp_float=False):
    return ("gemm", b_q_type.id, size_m, use_atomic_add, use_fp32_reduce)

def unrelated():
    raise AssertionError("not extracted")
'''


def test_wrappers_are_taken_verbatim_from_custom_ops(tmp_path):
    path = tmp_path / "_custom_ops.py"
    path.write_text(CUSTOM_OPS)
    module = vllm_lib.wrappers_from_source(path, None)
    assert module.awq_marlin_repack(None, 7, 8, 4) == ("awq", 7)

    class T:
        id = 42

    assert module.marlin_gemm(*[None] * 9, T(), 3, 4, 5, use_fp32_reduce=True) == ("gemm", 42, 3, False, True)
    assert not hasattr(module, "unrelated")


def test_wrappers_missing_a_function_is_refused(tmp_path):
    path = tmp_path / "_custom_ops.py"
    path.write_text("def marlin_gemm():\n    pass\n")
    with pytest.raises(MissingDependencyError, match="expected"):
        vllm_lib.wrappers_from_source(path, None)
    with pytest.raises(MissingDependencyError, match="found nothing"):
        vllm_lib.wrappers_from_source(tmp_path / "absent.py", None)


def test_known_library_hash_is_vllm_0_33_0():
    known = vllm_lib.identify("e634b80e72078e964f8bd2ac541d66f2a900920773cf993544609612190bd9a9")
    assert known is not None and known.version == "0.33.0"
    assert vllm_lib.identify("0" * 64) is None


def test_xz_library_is_decompressed_once_and_garbage_does_not_load(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    payload = b"\x7fELF not really a library" * 100
    xz = tmp_path / "_C_stable_libtorch.abi3.so.xz"
    xz.write_bytes(lzma.compress(payload))
    so = vllm_lib._decompress(xz)
    assert so.read_bytes() == payload and so.name == vllm_lib.LIBRARY_NAME
    assert vllm_lib._decompress(xz) == so
    with pytest.raises(MissingDependencyError, match="could not load"):
        vllm_lib.load_library(xz)
    bad = tmp_path / "bad.so.xz"
    bad.write_bytes(b"not xz")
    with pytest.raises(MissingDependencyError, match="could not decompress"):
        vllm_lib._decompress(bad)


def test_library_lookup_in_a_vllm_install(tmp_path):
    (tmp_path / "vllm").mkdir()
    with pytest.raises(MissingDependencyError, match="missing from it"):
        vllm_lib.locate_library(None, tmp_path)
    (tmp_path / "vllm" / vllm_lib.LIBRARY_NAME).write_bytes(b"x")
    assert vllm_lib.locate_library(None, tmp_path) == tmp_path / "vllm" / vllm_lib.LIBRARY_NAME


def fake_sglang_dist(root: Path, files: dict[str, bytes]) -> None:
    info = root / "sglang-0.5.23.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n")
    (info / "RECORD").write_text("")
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)


def test_sglang_with_edited_marlin_files_is_foreign(tmp_path):
    find_patch_set("sglang", "0.5.23")  # the shipped patch set must exist for this check
    fake_sglang_dist(tmp_path, {path: b"# edited by someone\n" for path in SGLANG_TARGET_FILES})
    with pytest.raises(ForeignFileError) as info:
        providers.make_provider("sglang", resolve_target(None, str(tmp_path)), {}, (7, 5), ENGINES)
    assert info.value.exit_code == 6


def test_sglang_without_marlin_files_is_missing(tmp_path):
    fake_sglang_dist(tmp_path, {})
    with pytest.raises(MissingDependencyError, match="missing"):
        providers.make_provider("sglang", resolve_target(None, str(tmp_path)), {}, (7, 5), ENGINES)


def test_not_applied_error_exit_code():
    assert NotAppliedError("x").exit_code == 9
