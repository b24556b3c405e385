"""Providers: whose Marlin is verified, reduced to three calls (repack, GEMM, workspace).

- ``vllm``: vLLM 0.33's ops. ``vllm._custom_ops`` when it imports in the target; otherwise the compiled
  library loaded directly (``--vllm-lib`` or the target's ``vllm/_C_stable_libtorch.abi3.so``).
- ``sglang``: the PATCHED SGLang functions ``gptq_marlin_gemm`` / ``gptq_marlin_repack``, called exactly as
  SGLang's own callers call them (empty ``g_idx``/``perm``/zero-point tensors, SGLang's ``sms * 1``
  workspace), i.e. the redirect users actually run. On GPUs of compute capability >= 8.0 the redirect is
  forced with ``SGLANG_MARLIN_VIA_VLLM=1``. The direct vLLM op is kept as ``direct_gemm`` so the redirect can
  be compared bitwise and timed against it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from t4patch.engines.sglang import marlin as sglang_loader
from t4patch.engines.vllm import marlin as vllm_lib
from t4patch.environment.target import TargetEnvironment
from t4patch.errors import ForeignFileError, MissingDependencyError, NotAppliedError
from t4patch.fileio.hashing import sha256_file
from t4patch.verify.marlin.scalar_type import UINT4B8

if TYPE_CHECKING:
    import torch

PROVIDERS = ("vllm", "sglang")
VIA_VLLM_ENV = "SGLANG_MARLIN_VIA_VLLM"
SGLANG_TARGET_FILES = (
    "sglang/kernels/ops/gemm/gptq_marlin.py",
    "sglang/kernels/ops/quantization/gptq_marlin_repack.py",
)
MARLIN_MAX_BLOCKS_PER_SM = 4  # vLLM marlin_utils.py:35; get_marlin_workspace allocates sms * 4


# gemm(a, c, b_q_weight, scales, workspace, m, n, k, use_atomic_add, use_fp32_reduce) -> out
GemmFn = Callable[..., "torch.Tensor"]


@dataclass(frozen=True)
class MarlinProvider:
    name: str
    repack: Callable[[torch.Tensor, int, int], torch.Tensor]
    gemm: GemmFn
    make_workspace: Callable[[torch.device], torch.Tensor]
    info: dict[str, Any]
    direct_gemm: GemmFn | None = None  # sglang: the vLLM op the redirect must forward to
    direct_workspace: Callable[[torch.device], torch.Tensor] | None = None
    raw: dict[str, Any] = field(default_factory=dict)  # engine callables for probes (act-order)


def _ensure_on_path(root: Path) -> None:
    text = str(root)
    if text not in sys.path:
        sys.path.insert(0, text)


def _sms(device: torch.device) -> int:
    import torch

    return torch.cuda.get_device_properties(device).multi_processor_count


def _vllm_workspace(device: torch.device) -> torch.Tensor:
    import torch

    # vLLM's get_marlin_workspace outside its workspace manager: zeroed int32 locks, sms * 4
    return torch.zeros(_sms(device) * MARLIN_MAX_BLOCKS_PER_SM, dtype=torch.int32, device=device)


@dataclass(frozen=True)
class _VllmOps:
    """vLLM's repack and GEMM, whichever way they were obtained, plus what to report about them."""

    repack: Callable[..., Any]
    gemm: GemmFn
    wrappers: Any  # a module with vLLM's marlin_gemm / gptq_marlin_repack wrappers, or None
    weight_type: Any  # object with .id passed as b_q_type
    info: dict[str, Any]
    scalar_type_module: Any = None  # vLLM's scalar_type.py loaded by path (library mode), when present


def _import_vllm_custom_ops() -> tuple[Any, Any]:
    if getattr(sys.modules.get("vllm"), "_t4patch_standin", False):
        # our own stand-in from an earlier sglang provider in this process: not an importable vLLM
        raise ImportError("vllm in this process is t4patch's stand-in, not an installed vLLM")
    from vllm import _custom_ops  # noqa: PLC0415 - heavy; only here
    from vllm.scalar_type import scalar_types  # noqa: PLC0415

    return _custom_ops, scalar_types.uint4b8


def _resolve_vllm(target: TargetEnvironment, vllm_lib_path: str | None, *, need_wrappers: bool) -> _VllmOps:
    import torch

    dist = target.find("vllm")
    info: dict[str, Any] = {"distribution": {"version": dist.version, "root": str(dist.root)} if dist else None}
    if vllm_lib_path is None and dist is not None:
        _ensure_on_path(dist.root)
        try:
            custom_ops, weight_type = _import_vllm_custom_ops()
        except Exception as exc:  # noqa: BLE001 - any import failure falls back to the library; reported
            info["import_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        else:
            info.update(source="vllm._custom_ops (imported)", scalar_type_id_matches=weight_type.id == UINT4B8.id)

            def gemm(a, c, w, s, ws, m, n, k, use_atomic_add, use_fp32_reduce):  # noqa: ANN001, ANN202
                return custom_ops.marlin_gemm(
                    a, c, w, None, s, None, None, None, ws, weight_type, m, n, k,
                    use_atomic_add=use_atomic_add, use_fp32_reduce=use_fp32_reduce, is_zp_float=False,
                )

            return _VllmOps(
                repack=lambda q, k, n: custom_ops.gptq_marlin_repack(q, k, n, 4),
                gemm=gemm,
                wrappers=custom_ops,
                weight_type=weight_type,
                info=info,
            )
    library = vllm_lib.load_library(vllm_lib.locate_library(vllm_lib_path, dist.root if dist else None))
    scalar_type_module = vllm_lib.load_scalar_type_module(library.vllm_dir / "scalar_type.py")
    weight_type: Any = UINT4B8
    if scalar_type_module is not None:
        engine_type = scalar_type_module.scalar_types.uint4b8
        info["scalar_type_id_matches"] = engine_type.id == UINT4B8.id
        weight_type = engine_type
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
    type_id = weight_type.id
    if wrappers is not None:
        # what SGLang's redirect calls, so "direct" below means vllm._custom_ops.marlin_gemm, vLLM's own wrapper
        def gemm(a, c, w, s, ws, m, n, k, use_atomic_add, use_fp32_reduce):  # noqa: ANN001, ANN202
            return wrappers.marlin_gemm(
                a, c, w, None, s, None, None, None, ws, weight_type, m, n, k,
                use_atomic_add=use_atomic_add, use_fp32_reduce=use_fp32_reduce, is_zp_float=False,
            )

        def repack(q, k, n):  # noqa: ANN001, ANN202
            return wrappers.gptq_marlin_repack(q, k, n, 4)
    else:
        def gemm(a, c, w, s, ws, m, n, k, use_atomic_add, use_fp32_reduce):  # noqa: ANN001, ANN202
            return torch.ops._C.marlin_gemm(
                a, c, w, None, s, None, None, None, ws, type_id, m, n, k, use_atomic_add, use_fp32_reduce, False
            )

        def repack(q, k, n):  # noqa: ANN001, ANN202
            return torch.ops._C.gptq_marlin_repack(q, k, n, 4, False)

    return _VllmOps(
        repack=repack,
        gemm=gemm,
        wrappers=wrappers,
        weight_type=weight_type,
        info=info,
        scalar_type_module=scalar_type_module,
    )


def vllm_provider(target: TargetEnvironment, vllm_lib_path: str | None = None) -> MarlinProvider:
    ops = _resolve_vllm(target, vllm_lib_path, need_wrappers=False)
    return MarlinProvider(
        name="vllm",
        repack=ops.repack,
        gemm=ops.gemm,
        make_workspace=_vllm_workspace,
        info={"vllm": ops.info, "weight_type_id": ops.weight_type.id},
    )


def _check_sglang_patched(target: TargetEnvironment) -> tuple[Any, dict[str, Any]]:
    """The installed SGLang, and proof that the files we import are the patch set's patched bytes."""
    from t4patch.patching.plan import file_statuses
    from t4patch.patching.registry import find_patch_set

    dist = target.find("sglang")
    if dist is None:
        raise MissingDependencyError(
            f"expected SGLang 0.5.23 in {target.description}, found none",
            hint="pip install sglang==0.5.23 && t4patch apply sglang (or pass --site-packages DIR)",
        )
    patch_set = find_patch_set("sglang", dist.version)
    where = f"--site-packages {dist.root}"
    statuses = {s.target.path: s for s in file_statuses(patch_set, dist)}
    files = {}
    for path in SGLANG_TARGET_FILES:
        status = statuses.get(path)
        if status is None:
            # the patch set does not touch this file: the redirect cannot be in it
            raise NotAppliedError(
                f"the sglang {dist.version} patch set does not patch {path}, where the Marlin redirect must live",
                hint="t4patch validate; this is a defect of the patch set",
            )
        if status.state == "pristine":
            raise NotAppliedError(
                f"sglang {dist.version} in {dist.root} is not patched: {path} is the pristine file",
                hint=f"t4patch apply sglang {where}",
            )
        if status.state == "foreign":
            raise ForeignFileError(
                f"{status.absolute} hashes to {status.sha256}, neither the pristine nor the patched sha256",
                hint=f"reinstall sglang=={dist.version}, then t4patch apply sglang {where}",
            )
        if status.state == "missing":
            raise MissingDependencyError(f"{status.absolute} is missing", hint=f"pip install sglang=={dist.version}")
        files[path] = {"state": status.state, "sha256": status.sha256}
    return dist, {"version": dist.version, "root": str(dist.root), "files": files}


def sglang_provider(
    target: TargetEnvironment, vllm_lib_path: str | None = None, *, capability: tuple[int, int]
) -> MarlinProvider:
    import torch

    dist, sglang_info = _check_sglang_patched(target)
    ops = _resolve_vllm(target, vllm_lib_path, need_wrappers=True)
    standins: list[str] = []
    if ops.info.get("source") != "vllm._custom_ops (imported)":
        identified = (ops.info.get("library") or {}).get("identified_as") or {}
        standins += sglang_loader.install_vllm_standin(
            ops.wrappers, ops.scalar_type_module, identified.get("version", "unknown")
        )
    forced = capability >= (8, 0)
    if forced:
        # The patch redirects on cc < 8.0 by itself; on newer GPUs only this switch routes through vLLM.
        os.environ[VIA_VLLM_ENV] = "1"
    loaded = sglang_loader.load_patched_sglang(dist.root)
    standins += list(loaded.standins)
    sg_gemm = loaded.gptq_marlin_gemm
    sg_repack = loaded.gptq_marlin_repack
    weight_type = ops.weight_type

    empties: dict[torch.device, torch.Tensor] = {}

    def empty_int(device: torch.device) -> torch.Tensor:
        # SGLang's layers hold these empty g_idx / perm / zero-point tensors as parameters: allocate once, so
        # the timed call does exactly what SGLang's does and no more
        if device not in empties:
            empties[device] = torch.empty(0, dtype=torch.int32, device=device)
        return empties[device]

    def repack(q: torch.Tensor, k: int, n: int) -> torch.Tensor:
        # as gptq_kernels.py:124 calls it: keywords, perm = the (empty) g_idx sort indices
        return sg_repack(q, perm=empty_int(q.device), size_k=k, size_n=n, num_bits=4)

    def gemm(a, c, w, s, ws, m, n, k, use_atomic_add, use_fp32_reduce):  # noqa: ANN001, ANN202
        # as apply_gptq_marlin_linear (marlin_utils.py:481-499) calls it for a sym, desc_act=False checkpoint
        empty = empty_int(a.device)
        return sg_gemm(
            a, c, w, s, None, empty, empty, empty, ws, weight_type,
            size_m=m, size_n=n, size_k=k, is_k_full=True,
            use_atomic_add=use_atomic_add, use_fp32_reduce=use_fp32_reduce, is_zp_float=False,
        )

    def sglang_workspace(device: torch.device) -> torch.Tensor:
        # SGLang's marlin_make_workspace(device): sms * 1 (marlin_utils.py:266-274); the patch must cope
        return torch.zeros(_sms(device), dtype=torch.int32, device=device)

    info = {
        "sglang": sglang_info,
        "vllm": ops.info,
        "weight_type_id": weight_type.id,
        "load_mode": loaded.mode,
        "standins": standins,
        "redirect_forced_with": f"{VIA_VLLM_ENV}=1" if forced else None,
    }
    return MarlinProvider(
        name="sglang",
        repack=repack,
        gemm=gemm,
        make_workspace=sglang_workspace,
        info=info,
        direct_gemm=ops.gemm,
        direct_workspace=_vllm_workspace,
        raw={
            "gptq_marlin_gemm": sg_gemm,
            "gptq_marlin_repack": sg_repack,
            "weight_type": weight_type,
            "gemm_module": loaded.gemm_module,
        },
    )


def make_provider(
    name: str, target: TargetEnvironment, vllm_lib_path: str | None, capability: tuple[int, int]
) -> MarlinProvider:
    if name == "vllm":
        return vllm_provider(target, vllm_lib_path)
    if name == "sglang":
        return sglang_provider(target, vllm_lib_path, capability=capability)
    raise ValueError(f"unknown provider {name!r}")
