"""Triton's fp16 attention on sm_75: FMA path (stock) vs Turing MMA path (t4patch Triton set), side by side.

Both variants are the sm_75 PTX the patched Triton 3.8.0 compiled on the CPU (tools.research.triton_mma_attention
``capture`` with T4PATCH_TRITON_MMA=0 and =1: the same launchers; the engine sets compile first below cc 8.0,
so each path runs with the tiles its own compile lets fit). On the GPU machine each case's launches are replayed
from that PTX (driver JIT) and timed with CUDA events, FMA and MMA in the same run, so the printed ratio is one
measurement on THIS GPU (sm_90 hardware executing sm_75 code: a hint about the instruction mix, not a T4
figure). Run from the repository root on a CUDA machine::

    python -m tools.bench.triton_mma_vs_fma --vllm-dir V --sglang-dir S --bundle B [--out bench.json]

Without a GPU, ``--model-only`` prints the T4 model alone, from the two captures (no engine files, no torch)::

    python -m tools.bench.triton_mma_vs_fma --model-only --bundle B [--out model.json]

The T4 column is a model, not a measurement: per launch, the warp-level instructions of one pass of the kernel
body (static counts in the sm_75 PTX: ``mma.sync.m16n8k8`` = 2,048 FLOP, ``fma.rn.f32`` = 64 FLOP per warp)
priced at the T4's 65 TFLOPS fp16 tensor / 8.1 TFLOPS fp32 peak, times the passes the case's useful attention
FLOPs need (useful FLOPs / the dot FLOPs of one pass, read from the TTGIR's ``tt.dot`` shapes, so each path is
priced with its own tiles and any work the MMA layout repeats across warps is charged), against its unique DRAM
bytes (Q, K, V, O once) at 320 GB/s; the larger of the two is the modeled time. It ignores shared-memory and
load/store issue limits (which slow the FMA path further), exp/max on the SFU, occupancy and masked-off tile
work; what it can say is whether a kernel is compute bound on a T4 and how much the dot path changes that.
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


def t4_model(launch: dict[str, Any], flops: float, bytes_: float) -> dict[str, float]:
    """Modeled T4 seconds of ``launch`` (see module docstring): its own passes, its own instruction counts."""
    body = launch.get("dot_flops") or 0
    if body <= 0:
        raise ValueError(f"{launch['kernel']}: the record has no TTGIR dot work (dot_flops); capture again with "
                         "tools.research.triton_mma_attention (records made before the dot_flops field lack it)")
    passes = flops / body
    per_warp = (launch["mma_m16n8k8_f16"] * FLOP_PER_MMA_M16N8K8 / T4_TENSOR_FP16
                + launch["fma_rn_f32"] * FLOP_PER_WARP_FMA / T4_FP32)
    compute = passes * launch["num_warps"] * per_warp
    memory = bytes_ / T4_DRAM
    issued = (launch["mma_m16n8k8_f16"] * FLOP_PER_MMA_M16N8K8 + launch["fma_rn_f32"] * FLOP_PER_WARP_FMA)
    return {"compute_s": compute, "memory_s": memory, "modeled_s": max(compute, memory),
            "bound": "compute" if compute >= memory else "memory", "passes": passes,
            "issued_per_dot_flop": issued * launch["num_warps"] / body}


TILE_NAMES = ("BLOCK_M", "BLOCK_Q", "TILE_SIZE", "BLOCK_N", "BLOCK_N_PREFIX", "BLOCK_H", "NUM_SEGMENTS_PER_SEQ")


def tiles(launch: dict[str, Any]) -> dict[str, Any]:
    """The launch's tile constexprs (whichever of TILE_NAMES the kernel has) and its warps."""
    found = {a["name"]: a["value"] for a in launch.get("args", ()) if a.get("role") == "constexpr"
             and a["name"] in TILE_NAMES}
    return {**found, "num_warps": launch["num_warps"]}


def attention_launches(case: dict[str, Any], mode: str) -> list[dict[str, Any]]:
    """The case's launched (not warm-up) kernels that have dots, checked to be on the path ``mode`` names."""
    found = [r for r in case["launches"] if not r["warmup"] and (r.get("dot_flops") or 0) > 0]
    if not found:
        raise ValueError(f"{case['id']} ({mode}): no launched kernel with dot work in the record")
    for r in found:
        on_mma = r["mma_m16n8k8_f16"] > 0
        if on_mma != (mode == "mma"):
            raise ValueError(f"{case['id']}: the {mode} capture's {r['kernel']} has {r['mma_m16n8k8_f16']} "
                             f"m16n8k8 per thread; the {mode} bundle must be captured with T4PATCH_TRITON_MMA="
                             f"{1 if mode == 'mma' else 0} under the patched Triton")
    return found


def model_case(fma_case: dict[str, Any], mma_case: dict[str, Any]) -> dict[str, Any]:
    """Both paths of one case: each path's attention launches with their own tiles, summed, and the ratio."""
    if fma_case["id"] != mma_case["id"]:
        raise ValueError(f"the captures list different cases: {fma_case['id']} vs {mma_case['id']}")
    flops, bytes_ = attention_work(mma_case)
    row: dict[str, Any] = {"case": mma_case["id"], "useful_flops": flops, "unique_bytes": bytes_}
    for mode, case in (("fma", fma_case), ("mma", mma_case)):
        launches = []
        for r in attention_launches(case, mode):
            launches.append({"kernel": r["kernel"], "grid": r.get("grid"), "tiles": tiles(r), "shared": r["shared"],
                             "mma_m16n8k8_f16": r["mma_m16n8k8_f16"], "fma_rn_f32": r["fma_rn_f32"],
                             "dot_flops": r["dot_flops"], "mma_warps": r.get("mma_warps"),
                             "t4": t4_model(r, flops, bytes_)})
        row[mode] = {"launches": launches, "modeled_s": sum(l["t4"]["modeled_s"] for l in launches)}
    row["modeled_ratio"] = row["fma"]["modeled_s"] / row["mma"]["modeled_s"]
    return row


def _tile_text(t: dict[str, Any]) -> str:
    return " ".join(f"{k.replace('NUM_SEGMENTS_PER_SEQ', 'SEGS')}={v}" for k, v in t.items() if k != "num_warps") \
        + f" w{t['num_warps']}"


def model_only(bundle: Path, out: Path | None) -> int:
    """The T4 model from the two CPU captures alone (no GPU, no engine files)."""
    captures = {}
    for mode in ("fma", "mma"):
        path = bundle / mode / "records.json"
        if not path.is_file():
            print(f"{path} is missing: capture it with PYTHONPATH=<patched triton site> T4PATCH_TRITON_MMA="
                  f"{1 if mode == 'mma' else 0} python -m tools.research.triton_mma_attention capture ... "
                  f"--bundle {bundle / mode}", file=sys.stderr)
            return 2
        captures[mode] = json.loads(path.read_text())
    if len(captures["fma"]) != len(captures["mma"]):
        print(f"the captures hold {len(captures['fma'])} (fma) and {len(captures['mma'])} (mma) cases",
              file=sys.stderr)
        return 2
    try:
        rows = [model_case(f, m) for f, m in zip(captures["fma"], captures["mma"])]
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    print("T4 model from instruction counts, not a measurement (sm_75 PTX compiled on the CPU; 65 TFLOPS fp16 "
          "tensor, 8.1 TFLOPS fp32, 320 GB/s)")
    print("mma / fma: static m16n8k8 / fma.rn.f32 per thread; issued/dot: FLOPs the warps issue per FLOP of the "
          "TTGIR's dots (above 1: products repeated across warps); layout: the MMA encoding's warpsPerCTA")
    print(f"{'case':28s} {'path':4s} {'tiles':44s} {'layout':7s} {'shared':>7s} {'mma':>4s} {'fma':>5s} "
          f"{'issued/dot':>10s} {'T4 us':>8s} {'bound':7s} {'FMA/MMA':>8s}")
    for row in rows:
        for mode in ("fma", "mma"):
            for launch in row[mode]["launches"]:
                t4 = launch["t4"]
                ratio = f"{row['modeled_ratio']:7.2f}x" if mode == "mma" else ""
                layout = "x".join(map(str, launch["mma_warps"])) if launch["mma_warps"] else "-"
                print(f"{row['case']:28s} {mode:4s} {_tile_text(launch['tiles']):44s} {layout:7s} {launch['shared']:7d} "
                      f"{launch['mma_m16n8k8_f16']:4d} {launch['fma_rn_f32']:5d} {t4['issued_per_dot_flop']:9.2f}x "
                      f"{t4['modeled_s'] * 1e6:8.1f} {t4['bound']:7s} {ratio:>8s}")
    if out:
        out.write_text(json.dumps({"label": "T4 model from instruction counts, not a measurement",
                                   "captures": {m: str(bundle / m) for m in ("fma", "mma")},
                                   "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rows": rows},
                                  indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-dir", type=Path)
    parser.add_argument("--sglang-dir", type=Path)
    parser.add_argument("--bundle", type=Path, required=True, help="holds mma/ and fma/ captures")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--model-only", action="store_true",
                        help="no GPU: print the T4 model from the captures alone")
    args = parser.parse_args(argv)
    if args.model_only:
        return model_only(args.bundle, args.out)

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
            if fma["kernel"] != mma["kernel"]:  # grids may differ: each path runs the tiles it compiles to
                raise RuntimeError(f"{case['id']}: FMA and MMA launch different kernels ({fma['kernel']} vs "
                                   f"{mma['kernel']}); the comparison would not be like for like")
            row = {"case": case["id"], "kernel": mma["kernel"], "grid": mma["grid"], "grid_fma": fma["grid"],
                   "tiles_fma": tiles(fma), "tiles_mma": tiles(mma), "shared_fma": fma["shared"],
                   "shared_mma": mma["shared"], "fma_s": fma["seconds"], "mma_s": mma["seconds"],
                   "measured_ratio": fma["seconds"] / mma["seconds"],
                   "counts_fma": {k: fma[k] for k in ("mma_m16n8k8_f16", "fma_rn_f32")},
                   "counts_mma": {k: mma[k] for k in ("mma_m16n8k8_f16", "fma_rn_f32")}}
            if mma.get("dot_flops"):  # the attention kernel itself (not the split-K reduction)
                t4_fma, t4_mma = t4_model(fma, flops, bytes_), t4_model(mma, flops, bytes_)
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
