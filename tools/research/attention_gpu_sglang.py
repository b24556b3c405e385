"""GPU run for `verify attention`, SGLang half: numerics of the *patched* SGLang 0.5.23 Triton attention with
the tiles a T4 gets, on a real GPU. Run on a CUDA machine, not part of the CLI:

    python -m tools.research.attention_gpu_sglang --sglang-dir DIR --out result.json

``DIR`` is a tree holding the patched wheel's ``sglang/kernels/ops/attention/{extend_attention,
decode_attention,score_mod}.py`` and ``sglang/srt/environ.py`` (the env registry the launchers read). The GPU
machine has no SGLang, so they are imported through the skeleton finder of
:mod:`t4patch.engines.sglang.attention` (real files, package ``__init__`` skipped, ``sglang.srt.utils`` a
stand-in answering "CUDA, not ROCm"). Unlike the CPU verifier the device here is real: only the two device
queries the launchers use to pick tiles are overridden, per run:

- ``torch.cuda.get_device_capability`` (and ``extend_attention.CUDA_CAPABILITY``, which SGLang reads once at
  import) answers 7.5 or 9.0;
- ``torch.cuda.get_device_properties(d).shared_memory_per_block_optin`` answers 65,536 (a T4) or the real value.

With (7.5, 65,536) the patched launchers choose what a T4 gets (extend: head 256 (32, 32), head 512 (16, 16);
grouped decode BLOCK_N 16 at head 512, 32 at head 256); with (9.0, real) SGLang's stock Hopper tiles. The
chosen kernels then compile and run *for this GPU*. What this shows: the T4 tile configuration computes the
right attention through SGLang's own launchers (token-indexed KV pool with shuffled slots, causal extend with
and without a prefix, sliding window 511 as Gemma 4 passes it, grouped decode with split-K stage 1 + stage 2).
What it cannot show: sm_75 codegen numerics (Triton's FMA path), T4 speed.

Every case is checked against a float32 torch reference built from the same pool; bound 2e-3 max abs error
on fp16 output.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import sys
import time
import traceback
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from t4patch.engines.sglang.attention import DECODE_MODULE, EXTEND_MODULE, UTILS_MODULE, SkeletonFinder, _utils_standin
from tools.research import attention_gpu as gpu

BOUND = gpu.BOUND
T4_LIMIT = gpu.T4_LIMIT
HEADS, KV_HEADS = 8, 1  # Gemma 4 E2B
MAX_KV_SPLITS = 8  # SGLang's --triton-attention-num-kv-splits default
# (layer, head size, SGLang's sliding_window_size): Gemma 4 passes config.sliding_window - 1 (gemma4_causal.py)
LAYERS = (("sliding", 256, 511), ("full", 512, -1))
FILES = (
    "sglang/kernels/ops/attention/extend_attention.py",
    "sglang/kernels/ops/attention/decode_attention.py",
    "sglang/kernels/ops/attention/score_mod.py",
    "sglang/srt/environ.py",
)
EXTEND_KERNELS = ("_fwd_kernel",)
DECODE_KERNELS = ("_fwd_grouped_kernel_stage1", "_fwd_kernel_stage2")
CONSTEXPRS = ("BLOCK_M", "BLOCK_N", "BLOCK_N_PREFIX", "BLOCK_H", "BLOCK_DMODEL", "BLOCK_DV", "num_warps",
              "num_stages", "SLIDING_WINDOW_SIZE")


def load_sglang_attention(root: Path) -> tuple[Any, Any]:
    """Import the two launcher modules from ``root`` (skeleton import; see module docstring)."""
    import importlib

    if "sglang" in sys.modules:
        raise RuntimeError("sglang is already imported; refusing to mix two copies")
    sys.meta_path.insert(0, SkeletonFinder(root, {UTILS_MODULE: _utils_standin()}))
    with target_arch((7, 5), T4_LIMIT):  # import-time CUDA_CAPABILITY; every run sets its own
        extend = importlib.import_module(EXTEND_MODULE)
        decode = importlib.import_module(DECODE_MODULE)
    for module in (extend, decode):
        if not Path(str(module.__file__)).resolve().is_relative_to(root.resolve()):
            raise RuntimeError(f"{module.__name__} was imported from {module.__file__}, not from {root}")
    if not hasattr(decode, "_t4patch_smem_limit_below_sm80"):
        raise RuntimeError(f"{DECODE_MODULE} is not patched (no _t4patch_smem_limit_below_sm80)")
    return extend, decode


@contextlib.contextmanager
def target_arch(capability: tuple[int, int], limit: int | None, extend: Any = None, decode: Any = None) -> Iterator[None]:
    """The launchers see ``capability`` and an opt-in shared limit ``limit`` (None: the real one)."""
    import torch

    real_cap, real_current = torch.cuda.get_device_capability, torch.cuda.current_device
    if gpu.DEVICE == "cuda":
        # Triton's CUDA driver binds torch.cuda.get_device_capability when it is first created and asks it for
        # the compile target; created under the override it would build sm_75 cubins this GPU cannot load.
        # Create it now, with the real function, and check below that the target stayed the real GPU.
        from triton.runtime import driver

        real_target = driver.active.get_current_target()
    torch.cuda.get_device_capability = lambda device=None: capability
    if gpu.DEVICE != "cuda":  # interpreter try-out on a CPU build: the launcher asks for device 0
        torch.cuda.current_device = lambda: 0
    saved = getattr(extend, "CUDA_CAPABILITY", None)
    if extend is not None:
        extend.CUDA_CAPABILITY = capability
    if decode is not None:
        decode._t4patch_smem_limit_below_sm80.cache_clear()
    try:
        if gpu.DEVICE == "cuda":
            if driver.active.get_current_target() != real_target:
                raise RuntimeError(f"Triton's compile target moved off this GPU ({real_target}) under the override")
            with gpu.shared_limit(limit):
                yield
        else:
            with _cpu_props(limit or 232448):
                yield
    finally:
        torch.cuda.get_device_capability, torch.cuda.current_device = real_cap, real_current
        if extend is not None:
            extend.CUDA_CAPABILITY = saved
        if decode is not None:
            decode._t4patch_smem_limit_below_sm80.cache_clear()


@contextlib.contextmanager
def _cpu_props(limit: int) -> Iterator[None]:
    import torch

    from t4patch.verify.attention.device import DeviceProperties

    real = torch.cuda.get_device_properties
    props = DeviceProperties("cpu stand-in", 0, 0, limit)
    torch.cuda.get_device_properties = lambda device=None: props  # type: ignore[assignment,return-value]
    try:
        yield
    finally:
        torch.cuda.get_device_properties = real


def _on_device(t: Any) -> Any:
    """On a CPU interpreter try-out the decode patch asks ``q.is_cuda``; answer True as a T4 would."""
    if gpu.DEVICE == "cuda":
        return t
    from t4patch.verify.attention.device import on_device

    return on_device(t)


# ----------------------------------------------------------------------------------------------------------
# Inputs: a token-indexed KV pool (page size 1) as SGLang's TritonAttnBackend hands it to the kernels


def make_pool_batch(head: int, seqs: list[tuple[int, int]], seed: int) -> dict[str, Any]:
    """seqs = [(new tokens, total length)]; every token's K/V sits in a random slot of the pool."""
    import torch

    gen = torch.Generator(device="cpu").manual_seed(seed)
    total = sum(ctx for _, ctx in seqs)
    slots = total + 17
    perm = torch.randperm(slots, generator=gen)
    k_pool = torch.randn(slots, KV_HEADS, head, generator=gen).to(torch.float16)
    v_pool = torch.randn(slots, KV_HEADS, head, generator=gen).to(torch.float16)
    tokens = sum(q for q, _ in seqs)
    q = torch.randn(tokens, HEADS, head, generator=gen).to(torch.float16)
    req_to_token, used = [], 0
    for _, ctx in seqs:
        req_to_token.append(perm[used : used + ctx].long())  # slot of each position of the sequence
        used += ctx
    dev = gpu.DEVICE
    return {"q": q.to(dev), "k_pool": k_pool.to(dev), "v_pool": v_pool.to(dev),
            "req_to_token": [r.to(dev) for r in req_to_token], "seqs": seqs, "head": head}


def reference(
    batch: dict[str, Any], scale: float, max_distance: int, first_visible: list[int] | None = None,
    fp16_p: bool = False,
) -> Any:
    """float32 attention per sequence: query at position p sees k with k <= p and p - k <= max_distance (< 0:
    no window) and k >= first_visible[i] (the decode window SGLang's backend cuts out of the pool).

    ``fp16_p``: round the probabilities to fp16 before P @ V as the kernels do (``p.to(v.dtype)``); its distance
    from the float32 reference is what fp16 itself costs (the "fp16 floor" of attention_gpu)."""
    import torch

    outs, start = [], 0
    for i, (qlen, ctx) in enumerate(batch["seqs"]):
        q = batch["q"][start : start + qlen].float()
        start += qlen
        slots = batch["req_to_token"][i]
        k = batch["k_pool"][slots].float().repeat_interleave(HEADS // KV_HEADS, dim=1)
        v = batch["v_pool"][slots].float().repeat_interleave(HEADS // KV_HEADS, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale
        qpos = torch.arange(ctx - qlen, ctx, device=q.device)[:, None]
        kpos = torch.arange(ctx, device=q.device)[None, :]
        visible = kpos <= qpos
        if max_distance >= 0:
            visible &= (qpos - kpos) <= max_distance
        if first_visible is not None:
            visible &= kpos >= first_visible[i]
        probs = scores.masked_fill(~visible[None], float("-inf")).softmax(-1)
        if fp16_p:
            probs = probs.half().float()
        outs.append(torch.einsum("hqk,khd->qhd", probs, v))
    return torch.cat(outs)


def run_extend(extend: Any, batch: dict[str, Any], scale: float, window: int) -> Any:
    """TritonAttnBackend.forward_extend (page size 1): new tokens' K/V contiguous, the prefix through
    (window_)kv_indptr / kv_indices into the pool; a sliding layer reads the window-clipped prefix
    (update_sliding_window_buffer: the last min(prefix, window) tokens, window_kv_offsets their start)."""
    import torch

    dev = gpu.DEVICE
    seqs = batch["seqs"]
    new_k, new_v, indices, indptr, offsets = [], [], [], [0], []
    for i, (qlen, ctx) in enumerate(seqs):
        slots = batch["req_to_token"][i]
        prefix = ctx - qlen
        new_k.append(batch["k_pool"][slots[prefix:]])
        new_v.append(batch["v_pool"][slots[prefix:]])
        keep = min(prefix, window) if window > 0 else prefix
        indices.append(slots[prefix - keep : prefix])
        indptr.append(indptr[-1] + keep)
        offsets.append(prefix - keep)
    qo = [0]
    for qlen, _ in seqs:
        qo.append(qo[-1] + qlen)
    q = _on_device(batch["q"])
    out = _on_device(torch.empty_like(batch["q"]))
    extend.extend_attention_fwd(
        q, _on_device(torch.cat(new_k).contiguous()), _on_device(torch.cat(new_v).contiguous()), out,
        _on_device(batch["k_pool"]), _on_device(batch["v_pool"]),
        torch.tensor(qo, dtype=torch.int32, device=dev), torch.tensor(indptr, dtype=torch.int32, device=dev),
        torch.cat(indices).contiguous(),
        None,  # custom_mask
        True,  # causal
        None,  # mask_indptr
        max(q for q, _ in seqs),
        1.0,  # k_scale
        1.0,  # v_scale
        sm_scale=scale,
        logit_cap=0.0,
        sliding_window_size=window,
        sinks=None,
        window_kv_offsets=torch.tensor(offsets, dtype=torch.int64, device=dev) if window > 0 else None,
        page_size=1,
        extend_seq_lens_cpu=[q for q, _ in seqs],
    )
    return out


def decode_window(batch: dict[str, Any], window: int) -> list[int]:
    """First position a decode query reads: TritonAttnBackend's update_sliding_window_buffer keeps the last
    min(seq_len, sliding_window_size) tokens (seq_len includes the new token)."""
    return [ctx - min(ctx, window) if window > 0 else 0 for _, ctx in batch["seqs"]]


def run_decode(decode: Any, batch: dict[str, Any], scale: float, window: int, splits: list[int]) -> Any:
    import torch

    dev = gpu.DEVICE
    first = decode_window(batch, window)
    indices, indptr = [], [0]
    for i, (_, ctx) in enumerate(batch["seqs"]):
        indices.append(batch["req_to_token"][i][first[i] :])
        indptr.append(indptr[-1] + ctx - first[i])
    n, head = len(batch["seqs"]), batch["head"]
    q = _on_device(batch["q"])
    out = _on_device(torch.empty_like(batch["q"]))
    logits = torch.empty(n, HEADS, MAX_KV_SPLITS, head, dtype=torch.float32, device=dev)
    lse = torch.empty(n, HEADS, MAX_KV_SPLITS, dtype=torch.float32, device=dev)
    decode.decode_attention_fwd(
        q, _on_device(batch["k_pool"]), _on_device(batch["v_pool"]), out,
        torch.tensor(indptr, dtype=torch.int32, device=dev), torch.cat(indices).contiguous(), logits, lse,
        torch.tensor(splits, dtype=torch.int32, device=dev), MAX_KV_SPLITS,
        scale, 1.0, 1.0,  # sm_scale, k_scale, v_scale
        logit_cap=0.0, sinks=None, xai_temperature_len=-1,
    )
    return out


# ----------------------------------------------------------------------------------------------------------


def cases(small: bool) -> list[tuple[str, str, list[tuple[int, int]]]]:
    """(name, phase, [(new tokens, total length)])."""
    import random

    rnd = random.Random(11)
    if small:
        return [
            ("extend", "extend", [(24, 24), (9, 40)]),
            ("decode", "decode", [(1, rnd.randint(20, 70)) for _ in range(3)]),
        ]
    return [
        # prefill without prefix; extend over an 800-token prefix (past the window); a short chunk over 100
        ("extend", "extend", [(700, 700), (300, 1100), (37, 137)]),
        ("decode-small", "decode", [(1, rnd.randint(600, 2000)) for _ in range(4)]),
        ("decode-large", "decode", [(1, rnd.randint(1, 1500)) for _ in range(200)]),
    ]


VARIANTS = (("sm75-patched", (7, 5), T4_LIMIT), ("stock-sm90-tiles", (9, 0), None))


def numerics(extend: Any, decode: Any, small: bool) -> list[dict[str, Any]]:
    import random

    import torch

    capture_e = gpu.LaunchCapture(extend, EXTEND_KERNELS, CONSTEXPRS)
    capture_d = gpu.LaunchCapture(decode, DECODE_KERNELS, CONSTEXPRS)
    rows = []
    for layer, head, window in LAYERS:
        scale = 1.0 / math.sqrt(head)
        for name, phase, seqs in cases(small):
            batch = make_pool_batch(head, seqs, seed=zlib.crc32(f"sglang/{layer}/{name}".encode()))
            mask = (window, None) if phase == "extend" else (-1, decode_window(batch, window))
            ref = reference(batch, scale, *mask)
            floor = float((reference(batch, scale, mask[0], mask[1], fp16_p=True).half().float() - ref).abs().max())
            if phase == "decode":
                rnd = random.Random(len(seqs))
                splits = [rnd.randint(1, MAX_KV_SPLITS) for _ in seqs]  # the backend's per-sequence count
            row: dict[str, Any] = {"layer": layer, "head": head, "sliding_window_size": window, "case": name,
                                   "phase": phase, "num_seqs": len(seqs), "tokens": int(batch["q"].shape[0]),
                                   "seqs": seqs if len(seqs) <= 4 else f"{len(seqs)} seqs",
                                   "ref_max_abs": float(ref.abs().max()), "fp16_floor_max_abs_err": floor}
            outs = {}
            for label, cap, limit in VARIANTS:
                with target_arch(cap, limit, extend, decode):
                    if phase == "extend":
                        out = run_extend(extend, batch, scale, window)
                    else:
                        out = run_decode(decode, batch, scale, window, splits)
                gpu._sync()
                outs[label] = out.as_subclass(torch.Tensor)
                err = (outs[label].float() - ref).abs()
                launches = capture_e.take() + capture_d.take()
                row[label] = {"max_abs_err": float(err.max()), "mean_abs_err": float(err.mean()),
                              "finite": bool(torch.isfinite(outs[label]).all()), "launches": launches}
            row["patched_vs_stock_max_abs"] = float(
                (outs["sm75-patched"].float() - outs["stock-sm90-tiles"].float()).abs().max())
            row["ok"] = all(row[label]["max_abs_err"] <= BOUND and row[label]["finite"] for label, _, _ in VARIANTS)
            rows.append(row)
            tiles = sorted({(l["kernel"], l["BLOCK_M"], l["BLOCK_N"]) for l in row["sm75-patched"]["launches"]})
            stock = sorted({(l["kernel"], l["BLOCK_M"], l["BLOCK_N"]) for l in row["stock-sm90-tiles"]["launches"]})
            print(f"sglang {layer:7s} {name:12s} sm75 err {row['sm75-patched']['max_abs_err']:.2e} "
                  f"stock err {row['stock-sm90-tiles']['max_abs_err']:.2e} diff {row['patched_vs_stock_max_abs']:.2e} "
                  f"fp16 floor {floor:.2e} "
                  f"tiles {tiles} stock {stock}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sglang-dir", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--small", action="store_true", help="small shapes (for a quick local run)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = parser.parse_args(argv)
    gpu.DEVICE = args.device
    result: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "bound": BOUND}

    def save() -> None:
        args.out.write_text(json.dumps(result, indent=1, default=str), encoding="utf-8")

    try:
        result["device"] = gpu.device_info()
        print(json.dumps(result["device"]), flush=True)
        result["sglang_files"] = {f: hashlib.sha256((args.sglang_dir / f).read_bytes()).hexdigest() for f in FILES}
        extend, decode = load_sglang_attention(args.sglang_dir)
        t0 = time.time()
        try:
            result["numerics"] = numerics(extend, decode, args.small)
            result["all_ok"] = all(row["ok"] for row in result["numerics"])
        except Exception:  # noqa: BLE001 - keep what was measured and the device info
            result["numerics_error"] = traceback.format_exc()
            print(result["numerics_error"], flush=True)
        result["numerics_seconds"] = round(time.time() - t0, 1)
    finally:
        save()
    return 0 if result.get("all_ok") else 1


if __name__ == "__main__":
    raise SystemExit(main())
