"""SGLang's `verify marlin` provider: the PATCHED SGLang functions, i.e. the redirect users actually run.

``gptq_marlin_gemm`` / ``gptq_marlin_repack`` are called exactly as SGLang's own callers call them (empty
``g_idx``/``perm``/zero-point tensors, SGLang's ``sms * 1`` workspace). Below compute capability 8.0 the patch
forwards them to the companion vLLM release's compiled Marlin (the patch set's ``[[requires]]``); on newer
GPUs the redirect is forced with ``SGLANG_MARLIN_VIA_VLLM=1``. The direct vLLM op is kept so the redirect can
be compared bitwise and timed against it. Two probes belong to this provider only: act-order must be refused
loudly, and on cc >= 8.0 without the switch the patched code must keep SGLang's own kernels.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from t4patch.contract import FailureSink, MarlinProvider, RedirectLabels
from t4patch.engines.requirements import companion
from t4patch.engines.sglang import marlin as sglang_loader
from t4patch.engines.sglang.marlin import SGLangJitCalled
from t4patch.engines.vllm import marlin_provider as vllm_side
from t4patch.environment import suggest
from t4patch.environment.target import InstalledDistribution, TargetEnvironment
from t4patch.errors import ForeignFileError, MissingDependencyError, NotAppliedError
from t4patch.verify.marlin import layout, quant
from t4patch.verify.marlin.probe import err, sms, sync

if TYPE_CHECKING:
    import torch

VIA_VLLM_ENV = "SGLANG_MARLIN_VIA_VLLM"
SGLANG_TARGET_FILES = (
    "sglang/kernels/ops/gemm/gptq_marlin.py",
    "sglang/kernels/ops/quantization/gptq_marlin_repack.py",
)
LABELS = RedirectLabels(engine="SGLang", direct="vllm", direct_label="vLLM", own_path="SGLang's own JIT kernel")


def check_patched(target: TargetEnvironment) -> tuple[InstalledDistribution, dict[str, Any]]:
    """The installed SGLang, and proof that the files we import are the patch set's patched bytes."""
    from t4patch.patching.plan import file_statuses
    from t4patch.patching.registry import find_patch_set

    dist = target.find("sglang")
    if dist is None:
        release = sglang_loader.patched_release()
        raise MissingDependencyError(
            f"expected SGLang {release} in {target.description}, found none",
            hint=suggest.not_installed("sglang", target, f"sglang=={release}"),
        )
    patch_set = find_patch_set("sglang", dist.version)
    apply = suggest.command(target, "apply", f"sglang=={dist.version}")
    statuses = {s.target.path: s for s in file_statuses(patch_set, dist)}
    files = {}
    for path in SGLANG_TARGET_FILES:
        status = statuses.get(path)
        if status is None:
            # the patch set does not touch this file: the redirect cannot be in it
            raise NotAppliedError(
                f"the sglang {dist.version} patch set does not patch {path}, where the Marlin redirect must live",
                hint=f"{suggest.command(None, 'validate')}; this is a defect of the patch set",
            )
        if status.state == "pristine":
            raise NotAppliedError(
                f"sglang {dist.version} in {dist.root} is not patched: {path} is the pristine file",
                hint=apply,
            )
        if status.state == "foreign":
            raise ForeignFileError(
                f"{status.absolute} hashes to {status.sha256}, neither the pristine nor the patched sha256",
                hint=f"{dist.reinstall_command()} && {apply}",
            )
        if status.state == "missing":
            raise MissingDependencyError(f"{status.absolute} is missing", hint=f"{dist.reinstall_command()} && {apply}")
        files[path] = {"state": status.state, "sha256": status.sha256}
    return dist, {"version": dist.version, "root": str(dist.root), "files": files}


def sglang_provider(
    target: TargetEnvironment, vllm_lib_path: str | None = None, *, capability: tuple[int, int]
) -> MarlinProvider:
    import torch

    dist, sglang_info = check_patched(target)
    ops = vllm_side.resolve_ops(target, vllm_lib_path, need_wrappers=True)
    standins: list[str] = []
    if ops.info.get("source") != vllm_side.IMPORTED_SOURCE:
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
    sg_gemm: Any = loaded.gptq_marlin_gemm
    sg_repack: Any = loaded.gptq_marlin_repack
    weight_type = ops.weight_type
    needs = companion("sglang", dist.version, "vllm")

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

    def gemm(a, c, w, s, ws, m, n, k, use_atomic_add, use_fp32_reduce):
        # as apply_gptq_marlin_linear (marlin_utils.py:481-499) calls it for a sym, desc_act=False checkpoint
        empty = empty_int(a.device)
        return sg_gemm(
            a, c, w, s, None, empty, empty, empty, ws, weight_type,
            size_m=m, size_n=n, size_k=k, is_k_full=True,
            use_atomic_add=use_atomic_add, use_fp32_reduce=use_fp32_reduce, is_zp_float=False,
        )

    def sglang_workspace(device: torch.device) -> torch.Tensor:
        # SGLang's marlin_make_workspace(device): sms * 1 (marlin_utils.py:266-274); the patch must cope
        return torch.zeros(sms(device), dtype=torch.int32, device=device)

    info = {
        "sglang": sglang_info,
        "vllm": ops.info,
        "weight_type_id": weight_type.id,
        "load_mode": loaded.mode,
        "standins": standins,
        "redirect_forced_with": f"{VIA_VLLM_ENV}=1" if forced else None,
    }
    functions = PatchedFunctions(gemm=sg_gemm, repack=sg_repack, weight_type=weight_type, gemm_module=loaded.gemm_module)
    series = ".".join(needs.version.split(".")[:2]) if needs else "?"
    provider = MarlinProvider(
        name="sglang",
        repack=repack,
        gemm=gemm,
        make_workspace=sglang_workspace,
        info=info,
        direct_gemm=ops.gemm,
        direct_workspace=vllm_side.workspace,
        redirect=LABELS,
        own_path_errors=(SGLangJitCalled,),
    )
    return _with_probes(provider, functions, series)


@dataclass(frozen=True)
class PatchedFunctions:
    """The patched SGLang functions themselves, for the probes that call them with SGLang's own arguments."""

    gemm: Any  # gptq_marlin_gemm
    repack: Any  # gptq_marlin_repack
    weight_type: Any  # the scalar type passed as b_q_type
    gemm_module: Any  # the module holding the patch's cached cc switch (_t4patch_marlin_via_vllm)


def _with_probes(provider: MarlinProvider, functions: PatchedFunctions, companion_series: str) -> MarlinProvider:
    from dataclasses import replace

    return replace(
        provider,
        act_order_probe=lambda failures, device: probe_act_order(
            provider, functions, failures, device, companion_series
        ),
        switch_off_probe=lambda capability, failures: probe_switch_off(provider, functions, capability, failures),
    )


def probe_act_order(
    provider: MarlinProvider,
    functions: PatchedFunctions,
    failures: FailureSink,
    device: torch.device,
    companion_series: str,
) -> dict[str, Any]:
    """Act-order (non-empty g_idx / perm) must be refused loudly, not computed or JIT-ed."""
    import torch

    gemm, repack, weight_type = functions.gemm, functions.repack, functions.weight_type
    if gemm is None or repack is None:
        return {"applicable": False}
    k, n, m, group = 256, 64, 1, 32
    weight = quant.random_q4_0_weight(k, n, group_size=group, std=0.02, seed=0, label="act-order-probe")
    packed = quant.gptq_pack(weight.codes).to(device)
    perm = torch.randperm(k, generator=quant.cpu_generator(0, "act-order-perm")).to(torch.int32).to(device)
    g_idx = (torch.arange(k, dtype=torch.int32) // group).to(device)
    empty = torch.empty(0, dtype=torch.int32, device=device)
    result: dict[str, Any] = {"applicable": True}

    def attempt(what: str, fn: Any) -> None:
        try:
            fn()
            sync(device)
        except SGLangJitCalled as exc:
            result[what] = {"refused": False, "error": err(exc)}
            failures.add("redirect", f"act-order {what}: fell through to SGLang's own JIT kernel instead of refusing")
        except Exception as exc:  # noqa: BLE001 - the refusal we want
            result[what] = {"refused": True, "error": err(exc)}
        else:
            result[what] = {"refused": False}
            failures.add(
                "redirect",
                f"act-order {what}: a non-empty g_idx/perm was accepted; vLLM {companion_series} cannot honour it",
            )

    attempt("repack", lambda: repack(packed, perm=perm, size_k=k, size_n=n, num_bits=4))
    try:
        marlin_q = repack(packed, perm=empty, size_k=k, size_n=n, num_bits=4)
    except Exception as exc:  # noqa: BLE001 - the per-shape repack check reports this failure in full
        result["gemm"] = {"refused": False, "error": f"not probed: plain repack raised {err(exc)}"}
        return result
    scales = layout.marlin_permute_scales(weight.scales, k, n, group).to(device)
    a = torch.randn(m, k, generator=quant.cpu_generator(0, "act-order-a")).half().to(device)
    workspace = provider.make_workspace(device)
    attempt(
        "gemm",
        lambda: gemm(
            a, None, marlin_q, scales, None, empty, g_idx, perm, workspace, weight_type,
            size_m=m, size_n=n, size_k=k, is_k_full=True, use_atomic_add=False, use_fp32_reduce=True, is_zp_float=False,
        ),
    )
    return result


def probe_switch_off(
    provider: MarlinProvider, functions: PatchedFunctions, capability: tuple[int, int], failures: FailureSink
) -> dict[str, Any] | None:
    """On cc >= 8.0 without SGLANG_MARLIN_VIA_VLLM, the patched SGLang must keep its own kernels (stock).

    The patch reads the switch once per process (an lru_cache on ``_t4patch_marlin_via_vllm``), so the
    probe clears that cache around the call and restores the switch afterwards.
    """
    import torch

    if capability < (8, 0) or provider.info.get("load_mode") != "skeleton":
        return None
    if not torch.cuda.is_available():
        return None
    decision = getattr(functions.gemm_module, "_t4patch_marlin_via_vllm", None)
    if decision is None or not hasattr(decision, "cache_clear"):
        return {"env": f"{VIA_VLLM_ENV} unset", "repack": "not probed: the patched module has no cached switch"}
    previous = os.environ.pop(VIA_VLLM_ENV, None)
    decision.cache_clear()
    device = torch.device("cuda", torch.cuda.current_device())
    k, n = 256, 64
    packed = quant.gptq_pack(torch.full((k, n), 8, dtype=torch.int32)).to(device)
    try:
        provider.repack(packed, k, n)
        torch.cuda.synchronize()
        outcome = "redirected to vLLM without the switch (a patched install must behave as stock on cc >= 8.0)"
        stock = False
        failures.add("redirect", f"{VIA_VLLM_ENV} unset on cc {capability[0]}.{capability[1]}: {outcome}")
    except SGLangJitCalled:
        outcome = "SGLang's own JIT path, as stock (reached the t4patch stand-in of load_jit)"
        stock = True
    except Exception as exc:  # noqa: BLE001
        outcome = f"raised {err(exc)}"
        stock = False
    finally:
        if previous is not None:
            os.environ[VIA_VLLM_ENV] = previous
        decision.cache_clear()
    return {
        "env": f"{VIA_VLLM_ENV} unset",
        "capability": f"{capability[0]}.{capability[1]}",
        "repack": outcome,
        "stock_path_taken": stock,
    }


def summary(prov: dict[str, Any]) -> str:
    sg = prov.get("sglang", {})
    parts = [f"sglang {sg.get('version')} (patched) at {sg.get('root')}, loaded {prov.get('load_mode')}"]
    if prov.get("redirect_forced_with"):
        parts.append(f"forced with {prov['redirect_forced_with']}")
    parts.append(vllm_side.summary(prov.get("vllm", {})))
    return "; ".join(parts)
