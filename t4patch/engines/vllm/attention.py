"""Drive vLLM's own Triton attention launcher (``unified_attention``) for the case table, in the worker.

Route: the real ``vllm`` package is imported from the target (``import vllm`` and all it pulls: envs, logger,
triton_utils, the attention helpers), not a copy or a re-implementation, because the launcher's choices read
``vllm.envs`` and ``current_platform``. What is replaced, and why:

- ``vllm.platforms.current_platform``: a subclass of vLLM's own ``Platform`` marked CUDA whose
  ``get_device_capability()`` returns the target architecture, so every capability test in the launcher
  (``has_device_capability(80)``, ``is_device_capability_family(100)``) runs vLLM's real comparison code;
- ``torch.cuda.get_device_properties``: returns the architecture's ``shared_memory_per_block_optin`` (the
  patched launcher asks the device for it on cc < 8.0) and capability;
- Triton's active driver (:mod:`t4patch.verify.attention.triton_target`): launches become compiles.

``CUDA_VISIBLE_DEVICES=""`` (set by the worker) keeps vLLM from swapping Triton for placeholders when no
driver is active (vllm/triton_utils/importing.py). The import needs vLLM's own light dependencies (regex,
numpy, packaging, ...); a missing one is reported by name, never papered over.

The arguments mirror ``TritonAttentionImpl.forward`` and ``TritonAttentionMetadataBuilder.__init__``
(vllm/v1/attention/backends/triton_attn.py): KV cache split from one (blocks, kv_heads, block, 2*head) logical
tensor, k/v descales expanded from a 1-element scale, split-K scratch sized by the builder's formula with the
model-wide head size (the maximum over layers, as ``ModelArchitectureConfig.from_layers`` collapses it), the
3D threshold and segment count read from the installed triton_attn.py.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import Any

OPS_MODULE = "vllm.v1.attention.ops.triton_unified_attention"
BACKEND_FILE = "vllm/v1/attention/backends/triton_attn.py"
BACKEND_CONSTANTS = ("MIN_LAUNCH_GRID_SIZE_2D", "NUM_PAR_SOFTMAX_SEGMENTS")
# --kv-cache-dtype values a case may name, and the attention kernel each one launches: "auto" runs the core
# kernel; int4_per_token_head makes unified_attention() hand off to unified_attention_int4()
# (vllm/v1/attention/ops/int4_per_token_head.py), whose kernel is _attn_packed.
KV_CACHE_DTYPES = ("auto", "int4_per_token_head")
MAIN_KERNEL = {"auto": "kernel_unified_attention", "int4_per_token_head": "_attn_packed"}


class EngineCodeMismatch(RuntimeError):
    """The installed engine does not have the code this driver was written for."""


def read_int_constants(path: Path, names: tuple[str, ...]) -> dict[str, int]:
    """Module-level ``NAME = <int>`` assignments of ``path``, without importing it."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: dict[str, int] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name in names and isinstance(node.value, ast.Constant) and isinstance(node.value.value, int):
                found[name] = node.value.value
    missing = [n for n in names if n not in found]
    if missing:
        raise EngineCodeMismatch(f"{path}: expected module constants {', '.join(missing)}, found none")
    return found


class VllmDriver:
    name = "vllm-unified-attention"

    def __init__(self, root: Path, arch: dict[str, Any], model: dict[str, Any], settings: dict[str, int]) -> None:
        self.root = root
        self.arch = arch
        self.model = model
        self.settings = settings
        self.module: Any = None
        self.constants: dict[str, int] = {}
        self.standins = (
            "vllm.platforms.current_platform (vLLM Platform subclass, CUDA, capability of --arch)",
            "torch.cuda device queries (capability, shared_memory_per_block_optin of --arch; device 0)",
            "launcher tensors: CPU tensors reporting is_cuda=True, get_device()=0",
            "triton active driver (launch = compile for --arch)",
        )

    def load(self) -> None:
        from t4patch.verify.attention.device import install_device

        major, minor = self.arch["capability"]
        props = install_device(self.arch)
        platforms = importlib.import_module("vllm.platforms")
        interface = importlib.import_module("vllm.platforms.interface")

        class ArchPlatform(interface.Platform):  # type: ignore[name-defined]
            _enum = interface.PlatformEnum.CUDA
            device_name = "cuda"
            device_type = "cuda"
            dispatch_key = "CUDA"

            @classmethod
            def get_device_capability(cls, device_id: int = 0) -> Any:
                return interface.DeviceCapability(major, minor)

            @classmethod
            def get_device_name(cls, device_id: int = 0) -> str:
                return props.name

        standin = ArchPlatform()
        # vllm.platforms resolves current_platform lazily through a module __getattr__; a real module attribute
        # takes precedence, and _current_platform keeps the lazy path answering the same object.
        platforms.current_platform = standin  # type: ignore[attr-defined]
        platforms._current_platform = standin  # type: ignore[attr-defined]
        self.module = importlib.import_module(OPS_MODULE)
        if self.module.current_platform is not standin:
            raise EngineCodeMismatch(f"{OPS_MODULE} did not pick up the architecture stand-in platform")
        if not hasattr(self.module, "unified_attention"):
            raise EngineCodeMismatch(f"{OPS_MODULE} has no unified_attention()")
        loaded = Path(self.module.__file__).resolve()
        if not loaded.is_relative_to(self.root.resolve()):
            raise EngineCodeMismatch(f"{OPS_MODULE} was imported from {loaded}, not from the target {self.root}")
        self.constants = read_int_constants(self.root / BACKEND_FILE, BACKEND_CONSTANTS)

    def describe(self) -> dict[str, Any]:
        return {
            "route": "real package import (import vllm), launcher called as TritonAttentionImpl.forward does",
            "module": OPS_MODULE,
            "module_file": str(getattr(self.module, "__file__", "")),
            "standins": list(self.standins),
            "backend_constants": dict(self.constants),
            "max_3d_query_len": getattr(self.module, "MAX_3D_QUERY_LEN", None),
        }

    def run_case(self, layer: dict[str, Any], case: dict[str, Any], recorded: list[Any]) -> str:
        """Call unified_attention for one (layer, case); returns the path the launches took."""
        import torch

        from t4patch.verify.attention.device import on_device

        m = self.model
        dtype = getattr(torch, m["dtype"])
        head = layer["head_size"]
        heads, kv_heads, block = m["num_query_heads"], m["num_kv_heads"], m["kv_block_size"]
        num_seqs, qlen, ctx = case["num_seqs"], case["query_len"], case["context_len"]
        blocks_per_seq = -(-ctx // block)

        kv_dtype = case.get("kv_cache_dtype", "auto")
        if kv_dtype not in KV_CACHE_DTYPES:
            raise EngineCodeMismatch(
                f"case {case['name']}: expected kv_cache_dtype one of {', '.join(KV_CACHE_DTYPES)}, found {kv_dtype!r}"
            )
        q = on_device(torch.empty(num_seqs * qlen, heads, head, dtype=dtype))
        out = on_device(torch.empty_like(q))
        k_scale_cache = v_scale_cache = None
        quant_mode: Any = None
        if kv_dtype == "auto":
            # Physical cache (blocks, block_size, kv_heads, 2*head) seen in vLLM's logical (B, H, N, 2*hs) order,
            # then exactly what TritonAttentionImpl.forward does: transpose(1, 2) and split K | V.
            physical = on_device(torch.empty(blocks_per_seq + 1, block, kv_heads, 2 * head, dtype=dtype))
            kv_cache = physical.permute(0, 2, 1, 3).transpose(1, 2)
            key_cache, value_cache = kv_cache.split(head, dim=-1)
        else:
            # int4_per_token_head: uint8 cache (STR_DTYPE_TO_TORCH_DTYPE), two nibbles a byte, each K and V half
            # followed by one fp32 scale (TritonAttentionBackend.customize_spec: padded half = head/2 + 4 B).
            # TritonAttentionImpl.forward: _pth_key_value_caches (transpose(1, 2), split at the padded half) and
            # _ensure_scale_caches (strided fp32 views over the scale bytes); q/k/v descales are None.
            interface = importlib.import_module("vllm.v1.kv_cache_interface")
            quant_mode = interface.KVQuantMode.INT4_PER_TOKEN_HEAD
            padded = head // 2 + 4
            physical = on_device(torch.empty(blocks_per_seq + 1, block, kv_heads, 2 * padded, dtype=torch.uint8))
            kv_cache = physical.permute(0, 2, 1, 3)
            key_cache, value_cache = kv_cache.transpose(1, 2).split(padded, dim=-1)
            base = torch.empty(0, dtype=torch.float32).set_(physical.untyped_storage())
            strides = [st // 4 for st in kv_cache.stride()]  # bytes -> fp32 units, as _ensure_scale_caches
            size, stride = (blocks_per_seq + 1, block, kv_heads), (strides[0], strides[2], strides[1])
            k_scale_cache = on_device(torch.as_strided(base, size, stride, (head // 2) // 4))
            v_scale_cache = on_device(torch.as_strided(base, size, stride, (padded + head // 2) // 4))
        cu_seqlens_q = on_device(torch.arange(num_seqs + 1, dtype=torch.int32) * qlen)
        seqused_k = on_device(torch.full((num_seqs,), ctx, dtype=torch.int32))
        block_table = on_device(torch.arange(blocks_per_seq, dtype=torch.int32).repeat(num_seqs, 1))
        scale = on_device(torch.ones(1, dtype=torch.float32))
        descale = scale.expand((num_seqs, kv_heads)) if kv_dtype == "auto" else None

        # TritonAttentionMetadataBuilder.__init__: threshold and scratch (no speculative decoding: 1 token each).
        threshold = self.constants["MIN_LAUNCH_GRID_SIZE_2D"] // kv_heads
        segments = self.constants["NUM_PAR_SOFTMAX_SEGMENTS"]
        max_tokens_3d = min(threshold, self.settings.get("max_num_seqs", 256))
        model_head = max(l["head_size"] for l in m["layers"])
        head_padded = 1 << (model_head - 1).bit_length()
        segm_output = on_device(torch.empty(max_tokens_3d, heads, segments, head_padded, dtype=torch.float32))
        segm_max = on_device(torch.empty(max_tokens_3d, heads, segments, dtype=torch.float32))
        segm_expsum = on_device(torch.empty(max_tokens_3d, heads, segments, dtype=torch.float32))

        window = layer["sliding_window"]
        start = len(recorded)
        self.module.unified_attention(
            q=q,
            k=key_cache,
            v=value_cache,
            out=out,
            cu_seqlens_q=cu_seqlens_q,
            max_seqlen_q=qlen,
            seqused_k=seqused_k,
            max_seqlen_k=ctx,
            softmax_scale=1.0,  # Gemma 4: scaling = 1.0 (vllm/model_executor/models/gemma4.py)
            causal=True,
            alibi_slopes=None,
            use_alibi_sqrt=False,
            window_size=(window - 1, 0) if window else (-1, -1),
            block_table=block_table,
            softcap=0,  # Gemma 4 has no attention logit soft-capping; the impl maps None to 0
            q_descale=None,
            k_descale=descale,
            v_descale=descale,
            seq_threshold_3D=threshold,
            num_par_softmax_segments=segments,
            softmax_segm_output=segm_output,
            softmax_segm_max=segm_max,
            softmax_segm_expsum=segm_expsum,
            sinks=None,
            output_scale=None,
            mm_prefix_range=None,
            rswa_prefix_lens=None,
            rswa_window=None,
            k_scale_cache=k_scale_cache,
            v_scale_cache=v_scale_cache,
            chunk_lookback=-1,
            use_td=False,  # VLLM_TRITON_USE_TD unset: tensor descriptors only on XPU
            mm_prefix_clamp_sliding_window=False,
            **({"kv_quant_mode": quant_mode} if quant_mode is not None else {}),
        )
        launches = recorded[start:]
        kernel = MAIN_KERNEL[kv_dtype]
        main = [l for l in launches if l.kernel == kernel]
        if len(main) != 1:
            raise EngineCodeMismatch(f"expected one {kernel} launch, found {[l.kernel for l in launches]}")
        return "3d" if main[0].constexprs.get("IS_3D") else "2d"
