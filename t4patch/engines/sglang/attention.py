"""Drive SGLang's own Triton attention launchers (extend and decode) for the case table, in the worker.

Route: ``import sglang`` runs the whole runtime's imports (transformers, the language frontend, zmq, fastapi,
...), which a verification environment rarely has and which have nothing to do with tile choice. So the
installed package is loaded as a *skeleton* (:mod:`t4patch.engines.sglang.skeleton`): every ``sglang.*``
package is an empty module whose ``__path__`` is the real directory (its ``__init__.py``, which only fills
registries, is skipped), and every module that is imported is the real installed file:
``extend_attention.py``, ``decode_attention.py``, ``score_mod.py`` and ``sglang/srt/environ.py`` (the env-var
registry the launchers read). Exactly one module is a stand-in, and it is the platform probe the target
architecture must answer anyway:

- ``sglang.srt.utils``: ``is_cuda() -> True``, ``is_hip() -> False``, ``is_gfx95_supported() -> False``,
  ``is_gfx1250_supported() -> False``, ``get_device_core_count()`` (only read on ROCm MLA paths). The real
  ``is_cuda`` asks torch for a CUDA build, which a CPU-only verifier does not have.

``torch.cuda.get_device_capability`` answers the target architecture: extend_attention.py reads it at
import time (``CUDA_CAPABILITY``) to choose BLOCK_M / BLOCK_N. The arguments mirror
``TritonAttnBackend.forward_extend`` / ``forward_decode`` (sglang/srt/layers/attention/triton_backend.py)
for page size 1: contiguous K/V of the new tokens, a (slots, kv_heads, head) KV pool, int64 KV indices, the
window offsets on sliding layers, and ``--triton-attention-num-kv-splits`` split buffers for decode.
"""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path
from typing import Any

from t4patch.engines.sglang.skeleton import SkeletonFinder  # also imported from here by attention_gpu_sglang

EXTEND_MODULE = "sglang.kernels.ops.attention.extend_attention"
DECODE_MODULE = "sglang.kernels.ops.attention.decode_attention"
UTILS_MODULE = "sglang.srt.utils"


class EngineCodeMismatch(RuntimeError):
    """The installed engine does not have the code this driver was written for."""


def _utils_standin() -> types.ModuleType:
    module = types.ModuleType(UTILS_MODULE, "t4patch stand-in: SGLang's platform probes answering an NVIDIA GPU")
    module.is_cuda = lambda: True  # type: ignore[attr-defined]
    module.is_hip = lambda: False  # type: ignore[attr-defined]
    module.is_gfx95_supported = lambda: False  # type: ignore[attr-defined]
    module.is_gfx1250_supported = lambda: False  # type: ignore[attr-defined]
    module.get_device_core_count = lambda device_id=0: 1  # type: ignore[attr-defined]
    module.__path__ = []  # a package in SGLang; nothing below it is needed
    return module


class SglangDriver:
    name = "sglang-triton-attention"

    def __init__(self, root: Path, arch: dict[str, Any], model: dict[str, Any], settings: dict[str, int]) -> None:
        self.root = root
        self.arch = arch
        self.model = model
        self.settings = settings
        self.extend: Any = None
        self.decode: Any = None
        self.finder: SkeletonFinder | None = None

    def load(self) -> None:
        from t4patch.verify.attention.device import install_device

        if "sglang" in sys.modules:
            raise EngineCodeMismatch("sglang is already imported in the worker; refusing to mix two copies")
        major, minor = self.arch["capability"]
        install_device(self.arch)
        self.finder = SkeletonFinder(self.root, {UTILS_MODULE: _utils_standin()})
        sys.meta_path.insert(0, self.finder)
        self.extend = importlib.import_module(EXTEND_MODULE)
        self.decode = importlib.import_module(DECODE_MODULE)
        for module, name in ((self.extend, "extend_attention_fwd"), (self.decode, "decode_attention_fwd")):
            if not hasattr(module, name):
                raise EngineCodeMismatch(f"{module.__name__} has no {name}()")
        for module in (self.extend, self.decode):
            loaded = Path(module.__file__).resolve()
            if not loaded.is_relative_to(self.root.resolve()):
                raise EngineCodeMismatch(f"{module.__name__} was imported from {loaded}, not from {self.root}")
        if getattr(self.extend, "CUDA_CAPABILITY", None) != (major, minor):
            raise EngineCodeMismatch(f"{EXTEND_MODULE}.CUDA_CAPABILITY is not the --arch capability")

    def describe(self) -> dict[str, Any]:
        return {
            "route": "skeleton import: real launcher modules from the installed tree, package __init__ files skipped",
            "module": f"{EXTEND_MODULE}, {DECODE_MODULE}",
            "module_file": str(getattr(self.extend, "__file__", "")),
            "real_modules": sorted(set(self.finder.real_modules)) if self.finder else [],
            "standins": [
                f"{UTILS_MODULE} (is_cuda True, is_hip/is_gfx95_supported/is_gfx1250_supported False)",
                "torch.cuda device queries (capability, shared_memory_per_block_optin of --arch; device 0)",
                "launcher tensors: CPU tensors reporting is_cuda=True, get_device()=0",
                "triton active driver (launch = compile for --arch)",
            ],
            "max_kv_splits": self.settings.get("max_kv_splits", 8),
        }

    def run_case(self, layer: dict[str, Any], case: dict[str, Any], recorded: list[Any]) -> str:
        import torch

        from t4patch.verify.attention.device import on_device as dev

        m = self.model
        dtype = getattr(torch, m["dtype"])
        head = layer["head_size"]
        heads, kv_heads = m["num_query_heads"], m["num_kv_heads"]
        num_seqs, qlen, ctx = case["num_seqs"], case["query_len"], case["context_len"]
        window = layer["sliding_window"]
        start = len(recorded)
        if case["phase"] == "prefill":
            prefix = ctx - qlen
            tokens = num_seqs * qlen
            q = dev(torch.empty(tokens, heads, head, dtype=dtype))
            o = dev(torch.empty_like(q))
            k = dev(torch.empty(tokens, kv_heads, head, dtype=dtype))
            v = dev(torch.empty_like(k))
            # Prefix KV lives in the pool; every sequence's prefix aliases the same slots (contents never read).
            pool = dev(torch.empty(prefix + 1, kv_heads, head, dtype=dtype))
            qo_indptr = dev(torch.arange(num_seqs + 1, dtype=torch.int64) * qlen)
            kv_indptr = dev(torch.arange(num_seqs + 1, dtype=torch.int32) * prefix)
            kv_indices = dev(torch.arange(prefix, dtype=torch.int64).repeat(num_seqs))
            self.extend.extend_attention_fwd(
                q, k, v, o, pool, dev(torch.empty_like(pool)), qo_indptr, kv_indptr, kv_indices,
                None,  # custom_mask
                True,  # causal
                None,  # mask_indptr
                qlen,  # max_len_extend
                1.0,
                1.0,
                sm_scale=1.0,
                logit_cap=0.0,
                sliding_window_size=(window - 1) if window else -1,
                sinks=None,
                window_kv_offsets=dev(torch.zeros(num_seqs, dtype=torch.int64)) if window else None,
                xai_temperature_len=-1,
                page_size=1,
                score_mod=None,
                aux_tensors=None,
                extend_seq_lens_cpu=[qlen] * num_seqs,
            )
        else:
            splits = self.settings.get("max_kv_splits", 8)
            q = dev(torch.empty(num_seqs, heads, head, dtype=dtype))
            o = dev(torch.empty_like(q))
            kv_len = min(ctx, window) if window else ctx  # a sliding layer reads its window's slots
            pool = dev(torch.empty(kv_len + 1, kv_heads, head, dtype=dtype))
            kv_indptr = dev(torch.arange(num_seqs + 1, dtype=torch.int32) * kv_len)
            kv_indices = dev(torch.arange(kv_len, dtype=torch.int64).repeat(num_seqs))
            attn_logits = dev(torch.empty(num_seqs, heads, splits, head, dtype=torch.float32))
            attn_lse = dev(torch.empty(num_seqs, heads, splits, dtype=torch.float32))
            num_kv_splits = dev(torch.full((num_seqs,), splits, dtype=torch.int32))
            self.decode.decode_attention_fwd(
                q, pool, dev(torch.empty_like(pool)), o, kv_indptr, kv_indices, attn_logits, attn_lse,
                num_kv_splits, splits,
                1.0,  # sm_scale
                1.0,  # k_scale
                1.0,  # v_scale
                logit_cap=0.0,
                sinks=None,
                xai_temperature_len=-1,
            )
        names = {l.kernel for l in recorded[start:]}
        if "_fwd_kernel" in names:
            return "extend"
        if "_fwd_grouped_kernel_stage1" in names:
            return "decode-grouped"
        if "_fwd_kernel_stage1" in names:
            return "decode-normal"
        return "+".join(sorted(names)) or "no-launch"
