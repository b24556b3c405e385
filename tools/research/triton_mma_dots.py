"""fp16 dots of many shapes, compiled for sm_75 by the patched Triton 3.8.0 on the CPU, executed on a GPU from that
PTX (driver JIT): the shapes and accumulator types the Triton set enables that Triton's own test_dot skips at
compute capability 7.x (fp16 accumulation; its mixed-size cases, which it parametrises with tf32). Maintainer
tool, not part of the CLI; evidence class "sm_75 PTX executed on sm_XX through driver JIT"::

    PYTHONPATH=<patched triton 3.8.0 site> python -m tools.research.triton_mma_dots capture --bundle B
    python -m tools.research.triton_mma_dots check --bundle B --out dots.json      # on the GPU machine

The kernel is test_dot's single-block ``z = tl.dot(x, y, out_dtype=...)`` with strided (row- or column-major)
operands, plus rank-3 (batched) ``tl.dot``s, which the set keeps on the stock FMA path (Triton's Turing lowering
asserts "Turing only supports batch size 1" for some of them). Inputs: seeded normal * 0.1 in fp16 (as test_dot); reference: float32 matmul of the same fp16 values;
bound as test_dot's: |z - ref| <= 1e-3 + 0.01 |ref| for fp32 accumulation, 1e-2 + 0.01 |ref| for fp16.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tools.research import triton_ptx_replay as replay

# (M, N, K, num_warps): test_dot's base and mixed-size shapes (>= 16 in every dimension, as on NVIDIA), then smaller
SHAPES = [(64, 64, 64, 4), (32, 32, 32, 4), (16, 16, 16, 4), (128, 256, 32, 8), (128, 16, 32, 4),
          (32, 128, 64, 4), (128, 128, 64, 4), (64, 128, 128, 4), (32, 128, 64, 2), (64, 64, 32, 4),
          (32, 32, 128, 16), (128, 128, 64, 2), (64, 128, 128, 2),
          # under an MMA tile (16 x 8): Triton pads them onto mma.sync too (test_dot's small cases run on HIP only)
          (1, 64, 64, 1), (2, 2, 16, 1), (64, 2, 64, 2), (16, 8, 16, 4), (8, 64, 16, 4), (1, 16, 16, 4),
          (16, 16, 16, 1), (4, 32, 32, 4)]
# (batch, M, N, K, num_warps): rank-3 tl.dot, kept on FMA by the set (checked: right numbers, no mma)
BATCHED = [(2, 32, 32, 32, 4), (4, 16, 16, 16, 4), (2, 64, 64, 32, 4), (8, 16, 32, 64, 4), (2, 16, 8, 16, 1)]
T4_SHARED = 65536


def cases() -> list[dict[str, Any]]:
    plain = [{"id": f"{m}x{n}x{k}-w{w}-{'colA' if ca else 'rowA'}-{'colB' if cb else 'rowB'}-acc{acc}",
              "batch": 0, "M": m, "N": n, "K": k, "num_warps": w, "col_a": ca, "col_b": cb, "acc": acc}
             for (m, n, k, w) in SHAPES for ca in (False, True) for cb in (False, True) for acc in ("fp32", "fp16")]
    batched = [{"id": f"b{b}x{m}x{n}x{k}-w{w}-acc{acc}", "batch": b, "M": m, "N": n, "K": k, "num_warps": w,
                "col_a": False, "col_b": False, "acc": acc}
               for (b, m, n, k, w) in BATCHED for acc in ("fp32", "fp16")]
    return plain + batched


def _kernels() -> dict[str, Any]:
    import triton
    import triton.language as tl

    @triton.jit
    def t4patch_dot(X, stride_xm, stride_xk, Y, stride_yk, stride_yn, Z, stride_zm, stride_zn,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, OUT_F16: tl.constexpr):
        off_m = tl.arange(0, BLOCK_M)
        off_n = tl.arange(0, BLOCK_N)
        off_k = tl.arange(0, BLOCK_K)
        x = tl.load(X + off_m[:, None] * stride_xm + off_k[None, :] * stride_xk)
        y = tl.load(Y + off_k[:, None] * stride_yk + off_n[None, :] * stride_yn)
        if OUT_F16:
            z = tl.dot(x, y, out_dtype=tl.float16)
        else:
            z = tl.dot(x, y, out_dtype=tl.float32)
        tl.store(Z + off_m[:, None] * stride_zm + off_n[None, :] * stride_zn, z)

    @triton.jit
    def t4patch_bdot(X, Y, Z, B: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, OUT_F16: tl.constexpr):
        ob = tl.arange(0, B)[:, None, None]
        om = tl.arange(0, BLOCK_M)
        on = tl.arange(0, BLOCK_N)
        ok = tl.arange(0, BLOCK_K)
        x = tl.load(X + ob * BLOCK_M * BLOCK_K + om[None, :, None] * BLOCK_K + ok[None, None, :])
        y = tl.load(Y + ob * BLOCK_K * BLOCK_N + ok[None, :, None] * BLOCK_N + on[None, None, :])
        if OUT_F16:
            z = tl.dot(x, y, out_dtype=tl.float16)
        else:
            z = tl.dot(x, y, out_dtype=tl.float32)
        tl.store(Z + ob * BLOCK_M * BLOCK_N + om[None, :, None] * BLOCK_N + on[None, None, :], z)

    return {"t4patch_dot": t4patch_dot, "t4patch_bdot": t4patch_bdot}


def _inputs(case: dict[str, Any], device: str) -> tuple[Any, Any, Any]:
    import torch

    gen = torch.Generator(device="cpu").manual_seed(case["M"] * 7919 + case["N"] * 31 + case["K"])
    m, n, k, b = case["M"], case["N"], case["K"], case.get("batch", 0)
    dtype = torch.float16 if case["acc"] == "fp16" else torch.float32
    if b:
        x = (torch.randn(b, m, k, generator=gen) * 0.1).half().to(device)
        y = (torch.randn(b, k, n, generator=gen) * 0.1).half().to(device)
        return x, y, torch.zeros(b, m, n, dtype=dtype, device=device)
    x = (torch.randn(k, m, generator=gen).T if case["col_a"] else torch.randn(m, k, generator=gen)) * 0.1
    y = (torch.randn(n, k, generator=gen).T if case["col_b"] else torch.randn(k, n, generator=gen)) * 0.1
    x, y = x.half().to(device), y.half().to(device)
    return x, y, torch.zeros(m, n, dtype=dtype, device=device)


def _launch(kernels: dict[str, Any], case: dict[str, Any], x: Any, y: Any, z: Any) -> None:
    tiles = {"BLOCK_M": case["M"], "BLOCK_N": case["N"], "BLOCK_K": case["K"], "OUT_F16": case["acc"] == "fp16",
             "num_warps": case["num_warps"]}
    if case.get("batch"):
        kernels["t4patch_bdot"][(1,)](x, y, z, B=case["batch"], **tiles)
        return
    kernels["t4patch_dot"][(1,)](x, x.stride(0), x.stride(1), y, y.stride(0), y.stride(1), z, z.stride(0),
                                 z.stride(1), **tiles)


def capture(bundle: Path) -> int:
    kernels = _kernels()
    cap = replay.Capture(kernels, bundle)
    out = []
    for case in cases():
        _launch(kernels, case, *_inputs(case, "cpu"))
        (record,) = cap.take()
        out.append({**case, "launches": [record]})
        print(f"{case['id']:32s} shared {record['shared']:6d} mma f16 {record['mma_m16n8k8_f16']:4d} "
              f"fma.f32 {record['fma_rn_f32']:5d}", flush=True)
    replay.save(out, bundle / "records.json")
    return 0


def check(bundle: Path, out_path: Path) -> int:
    import torch

    kernels = _kernels()
    player = replay.Replayer(kernels)
    rows = []
    for case in json.loads((bundle / "records.json").read_text()):
        record = case["launches"][0]
        x, y, z = _inputs(case, "cuda")
        row: dict[str, Any] = {k: case.get(k) for k in ("id", "batch", "M", "N", "K", "num_warps", "col_a", "col_b",
                                                        "acc")}
        row.update(shared=record["shared"], mma_m16n8k8_f16=record["mma_m16n8k8_f16"],
                   fma_rn_f32=record["fma_rn_f32"], fits_t4=record["shared"] <= T4_SHARED)
        with player.expecting(case["launches"], bundle):
            _launch(kernels, case, x, y, z)
        torch.cuda.synchronize()
        ref = x.float() @ y.float()
        atol = 1e-2 if case["acc"] == "fp16" else 1e-3
        excess = ((z.float() - ref).abs() - (atol + 0.01 * ref.abs())).max()
        # rank-2 fp16 dots take the tensor cores; rank-3 (batched) ones stay on the stock FMA path by the set's gate
        expected_path = record["mma_m16n8k8_f16"] == 0 if case.get("batch") else record["mma_m16n8k8_f16"] > 0
        row.update(max_abs_err=float((z.float() - ref).abs().max()), ok=bool(excess <= 0)
                   and bool(torch.isfinite(z).all()) and expected_path)
        rows.append(row)
        print(f"{case['id']:32s} shared {row['shared']:6d} fits T4 {row['fits_t4']!s:5s} mma {row['mma_m16n8k8_f16']:4d} "
              f"err {row['max_abs_err']:.2e} ok {row['ok']}", flush=True)
    out_path.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    print(f"{sum(r['ok'] for r in rows)} of {len(rows)} ok", flush=True)
    return 0 if all(r["ok"] for r in rows) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    sub.add_parser("capture").add_argument("--bundle", type=Path, required=True)
    p = sub.add_parser("check")
    p.add_argument("--bundle", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    return capture(args.bundle) if args.step == "capture" else check(args.bundle, args.out)


if __name__ == "__main__":
    sys.exit(main())
