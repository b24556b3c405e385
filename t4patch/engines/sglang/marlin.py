"""Load SGLang's two Marlin definition modules from an installed (patched) SGLang, and nothing else.

``import sglang`` runs ``sglang/__init__.py``, which pulls transformers, the language frontend and SGLang's
runtime (seconds, and packages a GPU test box may not have). The redirect under test lives entirely in
``sglang/kernels/ops/gemm/gptq_marlin.py`` and ``sglang/kernels/ops/quantization/gptq_marlin_repack.py``, so
this loader imports those real files with the skeleton finder of :mod:`t4patch.engines.sglang.skeleton`, which:

- serves every ``sglang.*`` *package* as an empty module whose ``__path__`` is the real directory (its
  ``__init__.py`` is skipped: those only populate registries and re-export names);
- serves every ``sglang.*`` *module* from the real file (so whatever the patch imports is the real code);
- replaces exactly one module, ``sglang.kernels.jit.utils`` (it imports ``sglang.srt.utils.common``, i.e. the
  whole runtime), by a stand-in with the real ``cache_once`` and a ``load_jit`` / ``make_cpp_args`` that raise
  :class:`SGLangJitCalled`. The redirect must never reach SGLang's own JIT Marlin (on sm_75 it compiles to
  empty kernels), so reaching the stand-in is itself a finding, not an inconvenience.

Every stand-in is listed in the report. If ``sglang`` is already imported in this process (a test running
inside a full SGLang environment), the real modules are used as they are.
"""

from __future__ import annotations

import importlib
import importlib.util
import shlex
import sys
import types
from dataclasses import dataclass
from pathlib import Path

from t4patch.engines.sglang.skeleton import SkeletonFinder
from t4patch.errors import MissingDependencyError

GEMM_MODULE = "sglang.kernels.ops.gemm.gptq_marlin"
REPACK_MODULE = "sglang.kernels.ops.quantization.gptq_marlin_repack"
JIT_UTILS_MODULE = "sglang.kernels.jit.utils"
JIT_COMMON_FILE = Path("sglang/kernels/jit/utils/common.py")


def patched_release() -> str:
    """The newest SGLang release t4patch ships a patch set for (the one the hints tell users to install)."""
    from t4patch.patching.registry import newest_supported

    return newest_supported("sglang") or "?"


class SGLangJitCalled(RuntimeError):
    """SGLang's own JIT Marlin was reached: the redirect to vLLM did not happen."""


@dataclass(frozen=True)
class LoadedSGLang:
    gptq_marlin_gemm: object
    gptq_marlin_repack: object
    gemm_module: types.ModuleType
    repack_module: types.ModuleType
    root: Path | None
    mode: str  # "skeleton" or "already-imported"
    standins: tuple[str, ...]


def _jit_utils_standin(root: Path) -> types.ModuleType:
    """``sglang.kernels.jit.utils`` with the real cache_once and JIT entry points that refuse to run."""
    module = types.ModuleType(JIT_UTILS_MODULE)
    module.__path__ = [str(root / "sglang/kernels/jit/utils")]  # submodules still resolve to real files
    common_path = root / JIT_COMMON_FILE
    spec = importlib.util.spec_from_file_location("sglang.kernels.jit.utils.common", common_path)
    if spec is None or spec.loader is None or not common_path.is_file():
        raise MissingDependencyError(
            f"expected SGLang's {JIT_COMMON_FILE} in {root}, found nothing (not SGLang {patched_release()}?)",
            hint=shlex.join(["t4patch", "status", "sglang", "--site-packages", str(root)]),
        )
    common = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = common
    spec.loader.exec_module(common)
    module.cache_once = common.cache_once  # type: ignore[attr-defined]

    def load_jit(*args: object, **kwargs: object) -> object:
        raise SGLangJitCalled(
            f"SGLang's own JIT kernel {args[0] if args else '?'} was requested: the call was not redirected to vLLM"
        )

    def make_cpp_args(*args: object, **kwargs: object) -> str:
        raise SGLangJitCalled("SGLang's JIT argument builder was called: the call was not redirected to vLLM")

    module.load_jit = load_jit  # type: ignore[attr-defined]
    module.make_cpp_args = make_cpp_args  # type: ignore[attr-defined]
    module._t4patch_standin = True  # type: ignore[attr-defined]
    return module


def load_patched_sglang(root: Path | None) -> LoadedSGLang:
    """Import the two definition modules from the SGLang installed at ``root`` (a site-packages dir)."""
    if "sglang" in sys.modules and not getattr(sys.modules["sglang"], "_t4patch_skeleton", False):
        gemm = importlib.import_module(GEMM_MODULE)
        repack = importlib.import_module(REPACK_MODULE)
        return LoadedSGLang(
            gemm.gptq_marlin_gemm, repack.gptq_marlin_repack, gemm, repack, None, "already-imported", ()
        )
    if root is None:
        raise MissingDependencyError(
            f"expected SGLang {patched_release()} in the target environment, found none",
            hint="t4patch status sglang",
        )
    jit_utils = _jit_utils_standin(root)
    finder = SkeletonFinder(root, {JIT_UTILS_MODULE: jit_utils})
    sys.meta_path.insert(0, finder)
    try:
        gemm = importlib.import_module(GEMM_MODULE)
        repack = importlib.import_module(REPACK_MODULE)
    except ImportError as exc:
        raise MissingDependencyError(
            f"importing SGLang's Marlin modules from {root} needs {exc.name or exc} which is not installed "
            "here (t4patch loads only sglang/kernels/ops/{gemm/gptq_marlin,quantization/gptq_marlin_repack}.py)",
            hint="install the missing package, or run with the serving environment's Python (--python)",
        ) from exc
    # The finder stays installed: the patched functions may import lazily at call time (e.g. vllm glue).
    standins = [
        f"{JIT_UTILS_MODULE}: stand-in (real cache_once; load_jit/make_cpp_args raise SGLangJitCalled)",
        *(f"{name}: package __init__.py not executed" for name in sorted(set(finder.skipped_inits))),
    ]
    return LoadedSGLang(
        gemm.gptq_marlin_gemm, repack.gptq_marlin_repack, gemm, repack, root, "skeleton", tuple(standins)
    )


def install_vllm_standin(
    custom_ops: types.ModuleType, scalar_type: types.ModuleType | None, version: str
) -> list[str]:
    """Make ``import vllm; from vllm import _custom_ops`` resolve to ``custom_ops`` when vLLM is not importable.

    ``version`` is what the library was identified as by sha256 ("unknown" otherwise): the patched SGLang
    checks ``vllm.__version__`` and must refuse an unidentified build exactly as it would a wrong version.
    """
    package = types.ModuleType("vllm")
    package.__path__ = []  # a package, but nothing else of vLLM can be imported from it
    package.__version__ = version  # type: ignore[attr-defined]
    package._custom_ops = custom_ops  # type: ignore[attr-defined]
    package._t4patch_standin = True  # type: ignore[attr-defined]
    sys.modules["vllm"] = package
    sys.modules["vllm._custom_ops"] = custom_ops
    notes = [
        f"vllm: stand-in package (__version__ = {version!r}, from the library's sha256); "
        f"vllm._custom_ops = {getattr(custom_ops, '_t4patch_standin', 'module')}"
    ]
    if scalar_type is not None:
        package.scalar_type = scalar_type  # type: ignore[attr-defined]
        sys.modules["vllm.scalar_type"] = scalar_type
        notes.append(f"vllm.scalar_type: the real file {scalar_type.__file__}, loaded by path")
    return notes
