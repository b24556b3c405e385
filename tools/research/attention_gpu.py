"""GPU run for `verify attention`: numerics of the clamped (sm_75) tile configurations on a real GPU, and the
split-K scratch-size experiment. Run on a CUDA machine, not part of the CLI:

    python -m tools.research.attention_gpu --vllm-dir DIR --out result.json

``DIR`` holds vLLM 0.33.0's two attention files, ``triton_unified_attention.py`` (the *patched* one) and
``triton_attention_helpers.py``; the GPU machine has no vLLM, so they are loaded by path under minimal
stand-ins for the few vLLM modules they import (``vllm.envs``, ``vllm.logger``, ``vllm.platforms``,
``vllm.triton_utils``, ``vllm.v1.kv_cache_interface.KVQuantMode``). The stand-in platform decides which
tiles the launcher picks: reporting capability 7.5 with a 65,536 B opt-in limit makes the patched launcher
choose exactly the tiles a T4 gets (head 512: TILE 16), which then compile and run *for this GPU* (sm_90:
tensor-core MMA path). Reporting 9.0 gives the stock tiles for comparison. What this can show: the clamped
tile configuration computes the right attention (paged KV, causal, sliding window, 2D / 3D / reduce), and
what the launcher + kernel do with scratch buffers. What it cannot show: sm_75 codegen numerics (the FMA
path), T4 speed.

Every case is checked against a float32 torch reference built from the same paged cache; the bound is 2e-3
max abs error on fp16 output. The SGLang counterpart (extend + grouped decode) is attention_gpu_sglang, which
reuses this module's capture, shared-limit override and device info.
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import hashlib
import importlib.util
import json
import logging
import math
import re
import subprocess
import sys
import tempfile
import time
import traceback
import types
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BOUND = 2e-3
T4_LIMIT = 65536
DEVICE = "cuda"  # "cpu" with TRITON_INTERPRET=1 to try this script without a GPU


# ----------------------------------------------------------------------------------------------------------
# Loading vLLM's two attention files without vLLM


class _KVQuantMode(enum.IntEnum):
    """Stand-in for vllm.v1.kv_cache_interface.KVQuantMode (the members the launcher compares against)."""

    NONE = 0
    FP8_PER_TENSOR = 1
    INT8_PER_TOKEN_HEAD = 2
    FP8_PER_TOKEN_HEAD = 3
    INT4_PER_TOKEN_HEAD = 4

    @property
    def is_per_token_head(self) -> bool:
        return self in (self.INT8_PER_TOKEN_HEAD, self.FP8_PER_TOKEN_HEAD, self.INT4_PER_TOKEN_HEAD)


class ArchPlatform:
    """Stand-in for vLLM's current_platform: CUDA, with a capability the experiment sets."""

    def __init__(self) -> None:
        self.capability = (9, 0)

    def is_cuda(self) -> bool:
        return True

    def is_rocm(self) -> bool:
        return False

    def is_xpu(self) -> bool:
        return False

    def has_device_capability(self, capability: Any, device_id: int = 0) -> bool:
        major, minor = self.capability
        if isinstance(capability, tuple):
            return (major, minor) >= capability
        return major * 10 + minor >= capability

    def is_device_capability_family(self, capability: int, device_id: int = 0) -> bool:
        return (self.capability[0] * 10 + self.capability[1]) // 10 == capability // 10

    def is_device_capability(self, capability: Any, device_id: int = 0) -> bool:
        if isinstance(capability, tuple):
            return self.capability == capability
        return self.capability[0] * 10 + self.capability[1] == capability

    def fp8_dtype(self) -> Any:
        import torch

        return torch.float8_e4m3fn


def _package(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = []
    sys.modules[name] = module
    return module


def load_vllm_attention(vllm_dir: Path) -> tuple[types.ModuleType, ArchPlatform]:
    import triton
    import triton.language as tl

    platform = ArchPlatform()
    for name in ("vllm", "vllm.v1", "vllm.v1.attention", "vllm.v1.attention.ops"):
        _package(name)
    envs = types.ModuleType("vllm.envs")
    envs.VLLM_BATCH_INVARIANT = False  # type: ignore[attr-defined]
    sys.modules["vllm.envs"] = envs
    sys.modules["vllm"].envs = envs  # type: ignore[attr-defined]

    class _Logger(logging.LoggerAdapter):
        def debug_once(self, *a: Any, **k: Any) -> None:
            self.debug(*a)

        def info_once(self, *a: Any, **k: Any) -> None:
            self.info(*a)

        def warning_once(self, *a: Any, **k: Any) -> None:
            self.warning(*a)

    logger_mod = types.ModuleType("vllm.logger")
    logger_mod.init_logger = lambda name: _Logger(logging.getLogger(name), {})  # type: ignore[attr-defined]
    sys.modules["vllm.logger"] = logger_mod
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = platform  # type: ignore[attr-defined]
    sys.modules["vllm.platforms"] = platforms
    triton_utils = types.ModuleType("vllm.triton_utils")
    triton_utils.triton = triton  # type: ignore[attr-defined]
    triton_utils.tl = tl  # type: ignore[attr-defined]
    sys.modules["vllm.triton_utils"] = triton_utils
    kv = types.ModuleType("vllm.v1.kv_cache_interface")
    kv.KVQuantMode = _KVQuantMode  # type: ignore[attr-defined]
    sys.modules["vllm.v1.kv_cache_interface"] = kv
    modules = {}
    for short in ("triton_attention_helpers", "triton_unified_attention"):
        full = f"vllm.v1.attention.ops.{short}"
        spec = importlib.util.spec_from_file_location(full, vllm_dir / f"{short}.py")
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[full] = module
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        modules[short] = module
    return modules["triton_unified_attention"], platform


@contextlib.contextmanager
def shared_limit(limit: int | None) -> Iterator[None]:
    """Make torch.cuda.get_device_properties report ``limit`` as the opt-in shared memory (None: real value)."""
    import torch

    if limit is None:
        yield
        return
    real = torch.cuda.get_device_properties

    class _Props:
        def __init__(self, device: Any) -> None:
            self._device = device

        def __getattr__(self, name: str) -> Any:
            return getattr(real(self._device), name)

        shared_memory_per_block_optin = limit

    torch.cuda.get_device_properties = lambda device=None: _Props(device)  # type: ignore[assignment,return-value]
    try:
        yield
    finally:
        torch.cuda.get_device_properties = real


VLLM_KERNELS = ("kernel_unified_attention", "reduce_segments")
VLLM_CONSTEXPRS = ("TILE_SIZE", "IS_3D", "BLOCK_M", "HEAD_SIZE_PADDED", "NUM_SEGMENTS_PER_SEQ")


class LaunchCapture:
    """Wraps JIT functions' ``run`` to record each launch's constexprs and compiled kernel.

    Defaults are vLLM's two kernels; the SGLang run (attention_gpu_sglang) passes its own names and keys."""

    def __init__(
        self, module: types.ModuleType, kernels: tuple[str, ...] = VLLM_KERNELS,
        constexprs: tuple[str, ...] = VLLM_CONSTEXPRS,
    ) -> None:
        self.launches: list[dict[str, Any]] = []
        for name in kernels:
            fn = getattr(module, name)
            original = getattr(fn, "_t4patch_original_run", fn.run)  # wrap once, even if captured twice

            def run(*args: Any, _orig: Any = original, _name: str = name, **kwargs: Any) -> Any:
                kernel = _orig(*args, **kwargs)
                record = {"kernel": _name, **{key: kwargs.get(key) for key in constexprs}}
                if kernel is not None:
                    record.update(_kernel_resources(kernel))
                self.launches.append(record)
                return kernel

            fn.run = run
            fn._t4patch_original_run = original

    def take(self) -> list[dict[str, Any]]:
        out, self.launches = self.launches, []
        return out


_RES = re.compile(r"REG:(\d+)\s+STACK:(\d+)")


def _kernel_resources(kernel: Any) -> dict[str, Any]:
    """Shared bytes, Triton's n_regs/n_spills (from the loaded module), and cuobjdump's REG/STACK of the cubin."""
    out: dict[str, Any] = {"shared": int(kernel.metadata.shared), "num_warps": int(kernel.metadata.num_warps)}
    with contextlib.suppress(Exception):
        kernel._init_handles()  # loads the module so n_regs / n_spills exist
    out["n_regs"] = getattr(kernel, "n_regs", None)
    out["n_spills"] = getattr(kernel, "n_spills", None)
    try:
        from triton import knobs

        tool = knobs.nvidia.cuobjdump.path
        with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
            handle.write(kernel.asm["cubin"])
            handle.flush()
            text = subprocess.run([tool, "-res-usage", handle.name], capture_output=True, text=True).stdout
        match = _RES.search(text)
        if match:
            out["cuobjdump_reg"] = int(match.group(1))
            out["cuobjdump_stack"] = int(match.group(2))
    except Exception as exc:  # noqa: BLE001 - the cross-check is optional
        out["cuobjdump_error"] = f"{type(exc).__name__}: {exc}"
    return out


# ----------------------------------------------------------------------------------------------------------
# Paged inputs and the reference


def make_batch(
    head: int, seqs: list[tuple[int, int]], *, heads: int = 8, kv_heads: int = 1, block: int = 16,
    seed: int = 0,
) -> dict[str, Any]:
    """Random paged batch: seqs = [(query_len, context_len)], blocks handed out in a random order."""
    import torch

    device = DEVICE
    gen = torch.Generator(device="cpu").manual_seed(seed)
    blocks_per_seq = [math.ceil(ctx / block) for _, ctx in seqs]
    total_blocks = sum(blocks_per_seq) + 3
    perm = torch.randperm(total_blocks, generator=gen)
    max_blocks = max(blocks_per_seq)
    block_table = torch.zeros(len(seqs), max_blocks, dtype=torch.int32)
    used = 0
    for i, n in enumerate(blocks_per_seq):
        block_table[i, :n] = perm[used : used + n]
        used += n
    physical = torch.randn(total_blocks, block, kv_heads, 2 * head, generator=gen).to(torch.float16)
    tokens = sum(q for q, _ in seqs)
    q = torch.randn(tokens, heads, head, generator=gen).to(torch.float16)
    cu = [0]
    for qlen, _ in seqs:
        cu.append(cu[-1] + qlen)
    return {
        "q": q.to(device),
        "physical": physical.to(device),
        "block_table": block_table.to(device),
        "cu_seqlens_q": torch.tensor(cu, dtype=torch.int32, device=device),
        "seqused_k": torch.tensor([ctx for _, ctx in seqs], dtype=torch.int32, device=device),
        "seqs": seqs,
        "head": head,
        "heads": heads,
        "kv_heads": kv_heads,
        "block": block,
    }


def kv_views(batch: dict[str, Any]) -> tuple[Any, Any]:
    # TritonAttentionImpl.forward: logical (B, H, N, 2*hs) -> transpose(1, 2) -> split K | V.
    kv = batch["physical"].permute(0, 2, 1, 3).transpose(1, 2)
    return kv.split(batch["head"], dim=-1)


def reference(batch: dict[str, Any], scale: float, window: int, fp16_p: bool = False) -> Any:
    """float32 attention per sequence from the same paged cache: causal, optional sliding window.

    ``fp16_p``: round the probabilities to fp16 before P @ V, as the kernel does (it feeds P to tl.dot in V's
    dtype); the distance of that from the float32 reference is the error fp16 itself costs."""
    import torch

    k_cache, v_cache = kv_views(batch)
    outs = []
    group = batch["heads"] // batch["kv_heads"]
    for i, (qlen, ctx) in enumerate(batch["seqs"]):
        start = int(batch["cu_seqlens_q"][i])
        q = batch["q"][start : start + qlen].float()  # (qlen, H, D)
        nblk = math.ceil(ctx / batch["block"])
        idx = batch["block_table"][i, :nblk].long()
        k = k_cache[idx].reshape(-1, batch["kv_heads"], batch["head"])[:ctx].float()
        v = v_cache[idx].reshape(-1, batch["kv_heads"], batch["head"])[:ctx].float()
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale
        qpos = torch.arange(ctx - qlen, ctx, device=q.device)[:, None]
        kpos = torch.arange(ctx, device=q.device)[None, :]
        visible = kpos <= qpos
        if window:
            visible &= (qpos - kpos) < window
        scores = scores.masked_fill(~visible[None], float("-inf"))
        probs = scores.softmax(-1)
        if fp16_p:
            probs = probs.half().float()
        outs.append(torch.einsum("hqk,khd->qhd", probs, v))
    return torch.cat(outs)


def run_unified(
    module: Any, batch: dict[str, Any], scale: float, window: int, scratch: dict[str, Any] | None,
    threshold: int = 128, segments: int = 16,
) -> Any:
    import torch

    k_cache, v_cache = kv_views(batch)
    out = torch.empty_like(batch["q"])
    descale = torch.ones(1, dtype=torch.float32, device=out.device).expand((len(batch["seqs"]), batch["kv_heads"]))
    max_q = max(q for q, _ in batch["seqs"])
    max_k = max(c for _, c in batch["seqs"])
    module.unified_attention(
        q=batch["q"], k=k_cache, v=v_cache, out=out, cu_seqlens_q=batch["cu_seqlens_q"], max_seqlen_q=max_q,
        seqused_k=batch["seqused_k"], max_seqlen_k=max_k, softmax_scale=scale, causal=True,
        window_size=(window - 1, 0) if window else (-1, -1), block_table=batch["block_table"], softcap=0,
        q_descale=None, k_descale=descale, v_descale=descale,
        seq_threshold_3D=threshold if scratch else None,
        num_par_softmax_segments=segments if scratch else None,
        softmax_segm_output=scratch["output"] if scratch else None,
        softmax_segm_max=scratch["max"] if scratch else None,
        softmax_segm_expsum=scratch["expsum"] if scratch else None,
    )
    return out


def builder_scratch(headdim: int, heads: int = 8, rows: int = 128, segments: int = 16, guard: bool = False) -> dict[str, Any]:
    """Split-K scratch as TritonAttentionMetadataBuilder allocates it, for a model-wide head size ``headdim``.

    With ``guard``, ``output`` is a view into a larger buffer whose tail (as large as ``output`` itself) is
    filled with a sentinel, so writes past the allocation vLLM would make become visible.
    """
    import torch

    pad = 1 << (headdim - 1).bit_length()
    n = rows * heads * segments * pad
    if guard:
        backing = torch.full((2 * n,), 1234.5, dtype=torch.float32, device=DEVICE)
        output = backing[:n].view(rows, heads, segments, pad)
        output.zero_()
    else:
        backing = None
        output = torch.empty(rows, heads, segments, pad, dtype=torch.float32, device=DEVICE)
    return {
        "output": output,
        "max": torch.empty(rows, heads, segments, dtype=torch.float32, device=DEVICE),
        "expsum": torch.empty(rows, heads, segments, dtype=torch.float32, device=DEVICE),
        "backing": backing,
        "elements": n,
    }


# ----------------------------------------------------------------------------------------------------------
# Experiments


def _sync() -> None:
    import torch

    if DEVICE == "cuda":
        torch.cuda.synchronize()


LAYERS = (("sliding", 256, 512), ("full", 512, 0))


def cases(small: bool) -> list[tuple[str, list[tuple[int, int]]]]:
    import random

    rnd = random.Random(7)
    if small:
        return [
            ("prefill", [(64, 64), (40, 100)]),
            ("decode-small", [(1, rnd.randint(40, 200)) for _ in range(3)]),
            ("decode-large", [(1, rnd.randint(20, 120)) for _ in range(130)]),
        ]
    return [
        ("prefill", [(700, 700), (300, 1100)]),  # second: chunked prefill over an 800-token prefix
        ("decode-small", [(1, rnd.randint(600, 2000)) for _ in range(4)]),  # 3D split-K + reduce_segments
        ("decode-large", [(1, rnd.randint(50, 1500)) for _ in range(200)]),  # > 128 seqs: 2D
    ]


def numerics(module: Any, platform: ArchPlatform, small: bool) -> list[dict[str, Any]]:
    import torch

    capture = LaunchCapture(module)
    rows = []
    for layer, head, window in LAYERS:
        scale = 1.0 / math.sqrt(head)
        for name, seqs in cases(small):
            batch = make_batch(head, seqs, seed=zlib.crc32(f"{layer}/{name}".encode()))
            ref = reference(batch, scale, window)
            floor = float((reference(batch, scale, window, fp16_p=True).half().float() - ref).abs().max())
            row: dict[str, Any] = {"layer": layer, "head": head, "window": window, "case": name,
                                   "num_seqs": len(seqs), "tokens": int(batch["q"].shape[0]),
                                   "fp16_floor_max_abs_err": floor, "ref_max_abs": float(ref.abs().max())}
            outs = {}
            for label, cap, limit in (("sm75-clamped", (7, 5), T4_LIMIT), ("stock-sm90-tiles", (9, 0), None)):
                platform.capability = cap
                scratch = builder_scratch(512)  # vLLM 0.33 sizes scratch with the model-wide (max) head 512
                with shared_limit(limit):
                    out = run_unified(module, batch, scale, window, scratch)
                _sync()
                outs[label] = out
                launches = capture.take()
                err = (out.float() - ref).abs()
                row[label] = {
                    "max_abs_err": float(err.max()),
                    "mean_abs_err": float(err.mean()),
                    "launches": launches,
                    "finite": bool(torch.isfinite(out).all()),
                }
            row["clamped_vs_stock_max_abs"] = float((outs["sm75-clamped"].float() - outs["stock-sm90-tiles"].float()).abs().max())
            row["ok"] = row["sm75-clamped"]["max_abs_err"] <= BOUND and row["sm75-clamped"]["finite"]
            rows.append(row)
            print(f"numerics {layer:7s} {name:12s} clamped err {row['sm75-clamped']['max_abs_err']:.2e} "
                  f"stock err {row['stock-sm90-tiles']['max_abs_err']:.2e} fp16 floor {floor:.2e} tiles "
                  f"{[(l['kernel'][:6], l['TILE_SIZE'], l['IS_3D']) for l in row['sm75-clamped']['launches']]}",
                  flush=True)
    return rows


def scratch_experiment(module: Any, platform: ArchPlatform, small: bool) -> list[dict[str, Any]]:
    """3D split-K on a head-512 layer with the scratch sized for head 256 (the suspicion) and for 512 (what
    vLLM 0.33 allocates for Gemma 4); batch sizes around rows / 2 = 64."""
    capture = LaunchCapture(module)
    rows = []
    head, window = 512, 0
    scale = 1.0 / math.sqrt(head)
    # vLLM: rows = min(seq_threshold_3D (128 // 1 KV head), max_num_seqs); --small shrinks rows to 16.
    rows_3d = 16 if small else 128
    batches = (8, 9, 12, 16) if small else (32, 64, 65, 100, 128)
    for headdim in (256, 512):
        for batch_size in batches:
            platform.capability = (9, 0)
            seqs = [(1, (40 if small else 300) + 7 * i) for i in range(batch_size)]
            batch = make_batch(head, seqs, seed=batch_size)
            ref = reference(batch, scale, window)
            scratch = builder_scratch(headdim, rows=rows_3d, guard=True)
            out = run_unified(module, batch, scale, window, scratch)
            _sync()
            tail = scratch["backing"][scratch["elements"]:]
            touched = int((tail != 1234.5).sum())
            launches = capture.take()
            err = float((out.float() - ref).abs().max())
            # Elements the 3D kernel addresses: token t, head h, segment s, dim d at
            # t*(H*S*512) + h*(S*512) + s*512 + d, for t < batch_size.
            needed = batch_size * 8 * 16 * 512
            rows.append({
                "scratch_headdim": headdim,
                "scratch_rows": rows_3d,
                "scratch_elements": scratch["elements"],
                "batch": batch_size,
                "path": "3d" if any(l.get("IS_3D") for l in launches) else "2d",
                "elements_addressed_by_3d_kernel": needed,
                "guard_elements_overwritten": touched,
                "max_abs_err": err,
            })
            print(f"scratch headdim {headdim} batch {batch_size:3d}: path {rows[-1]['path']} guard overwritten "
                  f"{touched} err {err:.2e}", flush=True)
    return rows


def sanitize_run(module: Any, platform: ArchPlatform, headdim: int, batch_size: int = 100) -> dict[str, Any]:
    """One 3D decode launch of a head-512 layer into an *exactly* sized scratch for ``headdim`` (no guard), for
    compute-sanitizer memcheck with PYTORCH_NO_CUDA_MEMORY_CACHING=1 (so the scratch is its own cudaMalloc)."""
    head = 512
    scale = 1.0 / math.sqrt(head)
    platform.capability = (9, 0)
    batch = make_batch(head, [(1, 300 + 7 * i) for i in range(batch_size)], seed=batch_size)
    scratch = builder_scratch(headdim, rows=128, guard=False)
    out = run_unified(module, batch, scale, 0, scratch)
    _sync()
    err = float((out.float() - reference(batch, scale, 0)).abs().max())
    print(f"sanitize: scratch headdim {headdim}, batch {batch_size}: max abs err {err:.2e}", flush=True)
    return {"scratch_headdim": headdim, "batch": batch_size, "scratch_bytes": scratch["elements"] * 4,
            "bytes_addressed_by_3d_kernel": batch_size * 8 * 16 * 512 * 4, "max_abs_err": err}


def device_info() -> dict[str, Any]:
    import torch
    import triton

    if DEVICE != "cuda":
        return {"name": "cpu (Triton interpreter)", "torch": torch.__version__, "triton": triton.__version__}
    props = torch.cuda.get_device_properties(0)
    return {
        "name": props.name,
        "capability": [props.major, props.minor],
        "shared_memory_per_block_optin": getattr(props, "shared_memory_per_block_optin", None),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-dir", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--small", action="store_true", help="small shapes (for a quick local run)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--skip-scratch", action="store_true")
    parser.add_argument("--sanitize-headdim", type=int, default=None,
                        help="only the single exact-allocation launch for compute-sanitizer (256 or 512)")
    args = parser.parse_args(argv)
    global DEVICE
    DEVICE = args.device
    result: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "bound": BOUND}

    def save() -> None:
        args.out.write_text(json.dumps(result, indent=1, default=str), encoding="utf-8")

    try:
        result["device"] = device_info()
        print(json.dumps(result["device"]), flush=True)
        module, platform = load_vllm_attention(args.vllm_dir)
        result["vllm_files"] = {
            p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(args.vllm_dir.glob("*.py"))
        }
        save()
        if args.sanitize_headdim:
            result["sanitize"] = sanitize_run(module, platform, args.sanitize_headdim)
            return 0
        for name, fn in (("numerics", lambda: numerics(module, platform, args.small)),
                         ("scratch", lambda: [] if args.skip_scratch else scratch_experiment(module, platform, args.small))):
            t0 = time.time()
            try:
                result[name] = fn()
            except Exception:  # noqa: BLE001 - keep the other experiment's results
                result[f"{name}_error"] = traceback.format_exc()
                print(result[f"{name}_error"], flush=True)
            result[f"{name}_seconds"] = round(time.time() - t0, 1)
            save()
    finally:
        save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
