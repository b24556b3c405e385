"""Triton's fp16 attention on sm_75: FMA path (stock) vs Turing MMA path (t4patch Triton set), side by side.

Both variants are the sm_75 PTX the patched Triton 3.8.0 compiled on the CPU (tools.research.triton_mma_attention
``capture`` with T4PATCH_TRITON_MMA=0 and =1: same launcher, same tiles, only the dot path differs). On the GPU
machine each case's launches are replayed from that PTX (driver JIT) and timed with CUDA events, FMA and MMA in
the same run, so the printed ratio is one measurement on THIS GPU (sm_90 hardware executing sm_75 code: a hint
about the instruction mix, not a T4 figure). Run from the repository root on a CUDA machine::

    python -m tools.bench.triton_mma_vs_fma --vllm-dir V --sglang-dir S --bundle B [--out bench.json]

The T4 column is a model, not a measurement: per launch, the warp-level instructions of one loop iteration
(static counts in the sm_75 PTX: ``mma.sync.m16n8k8`` = 2,048 FLOP, ``fma.rn.f32`` = 64 FLOP per warp) priced
at the T4's 65 TFLOPS fp16 tensor / 8.1 TFLOPS fp32 peak, times the iterations the case's useful attention FLOPs
need, against its unique DRAM bytes (Q, K, V, O once) at 320 GB/s; the larger of the two is the modeled time.
It ignores shared-memory and load/store issue limits (which slow the FMA path further), exp/max on the SFU, and
occupancy; what it can say is whether a kernel is compute bound on a T4 and how much the dot path changes that.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

T4_TENSOR_FP16 = 65e12
T4_FP32 = 8.1e12
T4_DRAM = 320e9
FLOP_PER_MMA_M16N8K8 = 16 * 8 * 8 * 2
FLOP_PER_WARP_FMA = 32 * 2
REPEATS = 20


def _event_timer(repeats: int) -> Any:
    import torch

    def timing(go: Any) -> float:
        for _ in range(3):
            go()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            go()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / repeats

    return timing


def attention_work(case: dict[str, Any]) -> tuple[float, float]:
    """(useful attention FLOPs, unique DRAM bytes) of the case: 8 query heads on 1 KV head, fp16."""
    heads, head = 8, case["head"]
    window = case.get("window") or 0
    if case["engine"] == "sglang":
        window = window + 1 if window > 0 else 0  # SGLang counts the distance (p - k <= window)
    pairs = 0
    kv_tokens = 0
    for qlen, ctx in case["seqs"]:
        for pos in range(ctx - qlen, ctx):
            pairs += min(pos + 1, window) if window else pos + 1
        kv_tokens += min(ctx, window + qlen) if window else ctx
    tokens = sum(q for q, _ in case["seqs"])
    flops = 4.0 * head * heads * pairs
    bytes_ = 2.0 * head * (2 * tokens * heads + 2 * kv_tokens)
    return flops, bytes_


def t4_model(launch: dict[str, Any], mma_launch: dict[str, Any], flops: float, bytes_: float) -> dict[str, float]:
    """Modeled T4 seconds of ``launch`` (see module docstring); ``mma_launch`` fixes the work per iteration."""
    flop_per_warp_iter = mma_launch["mma_m16n8k8_f16"] * FLOP_PER_MMA_M16N8K8
    warp_iters = flops / flop_per_warp_iter
    compute = warp_iters * (launch["mma_m16n8k8_f16"] * FLOP_PER_MMA_M16N8K8 / T4_TENSOR_FP16
                            + launch["fma_rn_f32"] * FLOP_PER_WARP_FMA / T4_FP32)
    memory = bytes_ / T4_DRAM
    return {"compute_s": compute, "memory_s": memory, "modeled_s": max(compute, memory)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-dir", type=Path)
    parser.add_argument("--sglang-dir", type=Path)
    parser.add_argument("--bundle", type=Path, required=True, help="holds mma/ and fma/ captures")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    args = parser.parse_args(argv)

    import torch

    from tools.research import attention_gpu as gpu
    from tools.research import triton_ptx_replay as replay
    from tools.research.triton_mma_attention import Engines

    if not torch.cuda.is_available():
        print("needs a CUDA GPU: the sm_75 PTX is executed through the driver JIT", file=sys.stderr)
        return 11
    gpu.DEVICE = "cuda"
    engines = Engines(args.vllm_dir, args.sglang_dir)
    bundles = {m: json.loads((args.bundle / m / "records.json").read_text()) for m in ("fma", "mma")}
    player = replay.Replayer(engines.functions())
    player.timing = _event_timer(args.repeats)
    sm = "sm_{}{}".format(*torch.cuda.get_device_capability())
    rows = []
    print(f"device {torch.cuda.get_device_name()} ({sm}); sm_75 PTX through driver JIT; {args.repeats} launches each")
    print(f"{'case':28s} {'kernel':26s} {'FMA us':>9s} {'MMA us':>9s} {sm + ' FMA/MMA':>13s} "
          f"{'T4 FMA us':>10s} {'T4 MMA us':>10s} {'T4 model FMA/MMA':>17s}")
    for index, case in enumerate(bundles["mma"]):
        batch = engines.batch(case)
        done: dict[str, list[dict[str, Any]]] = {}
        for mode in ("fma", "mma"):
            with player.expecting(bundles[mode][index]["launches"], args.bundle / mode):
                engines.run(case, batch)
            torch.cuda.synchronize()
            done[mode] = [r for r in player.done if not r["warmup"]]
        flops, bytes_ = attention_work(case)
        for fma, mma in zip(done["fma"], done["mma"]):
            if fma["kernel"] != mma["kernel"] or fma["grid"] != mma["grid"]:
                raise RuntimeError(f"{case['id']}: FMA and MMA launches differ ({fma['kernel']} {fma['grid']} vs "
                                   f"{mma['kernel']} {mma['grid']}); the comparison would not be like for like")
            row = {"case": case["id"], "kernel": mma["kernel"], "grid": mma["grid"], "shared_fma": fma["shared"],
                   "shared_mma": mma["shared"], "fma_s": fma["seconds"], "mma_s": mma["seconds"],
                   "measured_ratio": fma["seconds"] / mma["seconds"],
                   "counts_fma": {k: fma[k] for k in ("mma_m16n8k8_f16", "fma_rn_f32")},
                   "counts_mma": {k: mma[k] for k in ("mma_m16n8k8_f16", "fma_rn_f32")}}
            if mma["mma_m16n8k8_f16"]:  # the attention kernel itself (not the split-K reduction)
                t4_fma, t4_mma = t4_model(fma, mma, flops, bytes_), t4_model(mma, mma, flops, bytes_)
                row.update(t4_fma=t4_fma, t4_mma=t4_mma, modeled_ratio=t4_fma["modeled_s"] / t4_mma["modeled_s"],
                           useful_flops=flops, unique_bytes=bytes_)
            rows.append(row)
            model = (f"{row['t4_fma']['modeled_s'] * 1e6:10.1f} {row['t4_mma']['modeled_s'] * 1e6:10.1f} "
                     f"{row['modeled_ratio']:16.2f}x") if "modeled_ratio" in row else f"{'':10s} {'':10s} {'-':>17s}"
            print(f"{case['id']:28s} {mma['kernel'].split('.')[-1][:26]:26s} {fma['seconds'] * 1e6:9.1f} "
                  f"{mma['seconds'] * 1e6:9.1f} {row['measured_ratio']:12.2f}x {model}", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "sm": sm, "repeats": args.repeats,
                                        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rows": rows},
                                       indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
