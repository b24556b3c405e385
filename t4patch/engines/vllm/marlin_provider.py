"""vLLM's `verify marlin` provider: its Marlin ops, reached by import or through the compiled library alone.

``vllm._custom_ops`` is used when it imports in the target; otherwise the compiled library is loaded directly
(``--vllm-lib`` or the target's ``vllm/_C_stable_libtorch.abi3.so``, see :mod:`t4patch.engines.vllm.marlin`).
The SGLang provider reuses :func:`resolve_ops` for the op its redirect must forward to.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from t4patch.contract import MARLIN_MAX_BLOCKS_PER_SM, GemmFn, MarlinProvider
from t4patch.engines.vllm import marlin as vllm_lib
from t4patch.environment.target import TargetEnvironment
from t4patch.fileio.hashing import sha256_file
from t4patch.verify.marlin.probe import sms
from t4patch.verify.marlin.scalar_type import UINT4B8

if TYPE_CHECKING:
    import torch

IMPORTED_SOURCE = "vllm._custom_ops (imported)"


def ensure_on_path(root: Path) -> None:
    text = str(root)
    if text not in sys.path:
        sys.path.insert(0, text)


def workspace(device: torch.device) -> torch.Tensor:
    import torch

    # vLLM's get_marlin_workspace outside its workspace manager: zeroed int32 locks, sms * 4
    return torch.zeros(sms(device) * MARLIN_MAX_BLOCKS_PER_SM, dtype=torch.int32, device=device)


@dataclass(frozen=True)
class VllmOps:
    """vLLM's repack and GEMM, whichever way they were obtained, plus what to report about them."""

    repack: Any
    gemm: GemmFn
    wrappers: Any  # a module with vLLM's marlin_gemm / gptq_marlin_repack wrappers, or None
    weight_type: Any  # object with .id passed as b_q_type
    info: dict[str, Any]
    scalar_type_module: Any = None  # vLLM's scalar_type.py loaded by path (library mode), when present


def _import_custom_ops() -> tuple[Any, Any]:
    if getattr(sys.modules.get("vllm"), "_t4patch_standin", False):
        # our own stand-in from an earlier sglang provider in this process: not an importable vLLM
        raise ImportError("vllm in this process is t4patch's stand-in, not an installed vLLM")
    from vllm import _custom_ops  # type: ignore[import-not-found]  # heavy; only here
    from vllm.scalar_type import scalar_types  # type: ignore[import-not-found]

    return _custom_ops, scalar_types.uint4b8


def resolve_ops(target: TargetEnvironment, vllm_lib_path: str | None, *, need_wrappers: bool) -> VllmOps:
    import torch

    dist = target.find("vllm")
    info: dict[str, Any] = {"distribution": {"version": dist.version, "root": str(dist.root)} if dist else None}
    if vllm_lib_path is None and dist is not None:
        ensure_on_path(dist.root)
        try:
            custom_ops, weight_type = _import_custom_ops()
        except Exception as exc:  # noqa: BLE001 - any import failure falls back to the library; reported
            info["import_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        else:
            info.update(source=IMPORTED_SOURCE, scalar_type_id_matches=weight_type.id == UINT4B8.id)

            def gemm(a, c, w, s, ws, m, n, k, use_atomic_add, use_fp32_reduce):
                return custom_ops.marlin_gemm(
                    a, c, w, None, s, None, None, None, ws, weight_type, m, n, k,
                    use_atomic_add=use_atomic_add, use_fp32_reduce=use_fp32_reduce, is_zp_float=False,
                )

            return VllmOps(
                repack=lambda q, k, n: custom_ops.gptq_marlin_repack(q, k, n, 4),
                gemm=gemm,
                wrappers=custom_ops,
                weight_type=weight_type,
                info=info,
            )
    library = vllm_lib.load_library(vllm_lib.locate_library(vllm_lib_path, dist.root if dist else None, target))
    scalar_type_module = vllm_lib.load_scalar_type_module(library.vllm_dir / "scalar_type.py")
    library_type: Any = UINT4B8
    if scalar_type_module is not None:
        engine_type = scalar_type_module.scalar_types.uint4b8
        info["scalar_type_id_matches"] = engine_type.id == UINT4B8.id
        library_type = engine_type
    else:
        info["scalar_type_id_matches"] = None  # vllm/scalar_type.py not beside the library: not cross-checked
    info.update(source="compiled library loaded with torch.ops.load_library", library=library.to_json())
    wrappers = None
    if need_wrappers:
        wrappers = vllm_lib.wrappers_from_source(library.vllm_dir / "_custom_ops.py", scalar_type_module)
        info["custom_ops_py"] = {
            "path": str(library.vllm_dir / "_custom_ops.py"),
            "sha256": sha256_file(library.vllm_dir / "_custom_ops.py"),
        }
    type_id = library_type.id
    if wrappers is not None:
        # what SGLang's redirect calls, so "direct" below means vllm._custom_ops.marlin_gemm, vLLM's own wrapper
        def gemm(a, c, w, s, ws, m, n, k, use_atomic_add, use_fp32_reduce):
            return wrappers.marlin_gemm(
                a, c, w, None, s, None, None, None, ws, library_type, m, n, k,
                use_atomic_add=use_atomic_add, use_fp32_reduce=use_fp32_reduce, is_zp_float=False,
            )

        def repack(q, k, n):
            return wrappers.gptq_marlin_repack(q, k, n, 4)
    else:
        def gemm(a, c, w, s, ws, m, n, k, use_atomic_add, use_fp32_reduce):
            return torch.ops._C.marlin_gemm(
                a, c, w, None, s, None, None, None, ws, type_id, m, n, k, use_atomic_add, use_fp32_reduce, False
            )

        def repack(q, k, n):
            return torch.ops._C.gptq_marlin_repack(q, k, n, 4, False)

    return VllmOps(
        repack=repack,
        gemm=gemm,
        wrappers=wrappers,
        weight_type=library_type,
        info=info,
        scalar_type_module=scalar_type_module,
    )


def vllm_provider(target: TargetEnvironment, vllm_lib_path: str | None = None) -> MarlinProvider:
    ops = resolve_ops(target, vllm_lib_path, need_wrappers=False)
    return MarlinProvider(
        name="vllm",
        repack=ops.repack,
        gemm=ops.gemm,
        make_workspace=workspace,
        info={"vllm": ops.info, "weight_type_id": ops.weight_type.id},
    )


def summary(vllm: dict[str, Any]) -> str:
    """Which vLLM code ran, from the provider JSON's ``vllm`` entry."""
    source = vllm.get("source", "?")
    lib = vllm.get("library")
    if lib:
        ident = lib.get("identified_as")
        return f"vLLM {ident['version'] if ident else 'unknown build'} via {source} ({lib['path']}, sha256 {lib['sha256'][:12]})"
    dist = vllm.get("distribution") or {}
    return f"vLLM {dist.get('version', '?')} via {source}"
