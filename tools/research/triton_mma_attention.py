"""Gemma 4 E2B attention of the patched engines, compiled for sm_75 by the patched Triton 3.8 on the CPU, then
executed from that PTX on a GPU through the driver JIT (evidence class: "sm_75 PTX executed on sm_XX through
driver JIT, T4 host parameters emulated"). Maintainer tool, not part of the CLI.

Step 1, on any machine (no GPU), once per dot path (the switch is read by the patched compiler)::

    PYTHONPATH=<patched triton 3.8.0 site> T4PATCH_TRITON_MMA=1 python -m tools.research.triton_mma_attention \\
        capture --vllm-dir V --sglang-dir S --bundle B/mma
    PYTHONPATH=<patched triton 3.8.0 site> T4PATCH_TRITON_MMA=0 python -m tools.research.triton_mma_attention \\
        capture --vllm-dir V --sglang-dir S --bundle B/fma

Step 2, on the GPU machine (any Triton; it only loads modules through the driver)::

    python -m tools.research.triton_mma_attention check --vllm-dir V --sglang-dir S --bundle B --out result.json

``V`` holds the patched vLLM 0.33.0 ``triton_unified_attention.py`` + ``triton_attention_helpers.py``, ``S`` a
tree with the patched SGLang 0.5.23 attention files (tools.research.attention_gpu_sglang.FILES). The cases,
inputs, stand-ins (capability 7.5, 65,536 B opt-in shared memory) and float32 references are the ones of
tools.research.attention_gpu / attention_gpu_sglang. In step 2 the engines' launchers run again on the same
inputs; every ``kernel[grid](...)`` is answered from the recorded sm_75 PTX (tools.research.triton_ptx_replay),
after checking that the launcher made the same launch (kernel, grid, constexprs, scalars). Bound: max abs error
2e-3 on the fp16 output against the float32 reference.

What this cannot show: T4 timing; differences between Turing's and this GPU's tensor cores executing the same
mma.sync; sm_75 register allocation (ptxas for sm_75 ran in step 1 and its counts are in the record, but the
driver compiled the PTX for this GPU).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import random
import sys
import time
import traceback
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tools.research import attention_gpu as gpu
from tools.research import triton_ptx_replay as replay

EVIDENCE = "sm_75 PTX (patched Triton 3.8.0, compiled on the CPU) executed on {sm} through driver JIT, T4 host parameters emulated"
MODES = ("mma", "fma")


def _sglang_splits(phase: str, seqs: list[tuple[int, int]]) -> list[int] | None:
    from tools.research import attention_gpu_sglang as sg

    if phase != "decode":
        return None
    rnd = random.Random(len(seqs))
    return [rnd.randint(1, sg.MAX_KV_SPLITS) for _ in seqs]


class Engines:
    """The two engines' launchers, loaded from the patched files, with the T4 stand-ins around every run."""

    def __init__(self, vllm_dir: Path | None, sglang_dir: Path | None) -> None:
        self.vllm = self.platform = self.extend = self.decode = None
        if vllm_dir:
            self.vllm, self.platform = gpu.load_vllm_attention(vllm_dir)
        if sglang_dir:
            from tools.research import attention_gpu_sglang as sg

            self.extend, self.decode = sg.load_sglang_attention(sglang_dir)

    def functions(self) -> dict[str, Any]:
        from tools.research import attention_gpu_sglang as sg

        out: dict[str, Any] = {}
        if self.vllm is not None:
            out.update({f"vllm.{n}": getattr(self.vllm, n) for n in gpu.VLLM_KERNELS})
        if self.extend is not None:
            out.update({f"sglang.{n}": getattr(self.extend, n) for n in sg.EXTEND_KERNELS})
            out.update({f"sglang.{n}": getattr(self.decode, n) for n in sg.DECODE_KERNELS})
        return out

    def cases(self, small: bool) -> list[dict[str, Any]]:
        from tools.research import attention_gpu_sglang as sg

        found = []
        if self.vllm is not None:
            for layer, head, window in gpu.LAYERS:
                for name, seqs in gpu.cases(small):
                    found.append({"id": f"vllm/{layer}/{name}", "engine": "vllm", "layer": layer, "head": head,
                                  "window": window, "case": name, "seqs": seqs,
                                  "seed": zlib.crc32(f"{layer}/{name}".encode())})
        if self.extend is not None:
            for layer, head, window in sg.LAYERS:
                for name, phase, seqs in sg.cases(small):
                    found.append({"id": f"sglang/{layer}/{name}", "engine": "sglang", "layer": layer, "head": head,
                                  "window": window, "case": name, "phase": phase, "seqs": seqs,
                                  "seed": zlib.crc32(f"sglang/{layer}/{name}".encode()),
                                  "splits": _sglang_splits(phase, seqs)})
        return found

    def batch(self, case: dict[str, Any]) -> dict[str, Any]:
        from tools.research import attention_gpu_sglang as sg

        if case["engine"] == "vllm":
            return gpu.make_batch(case["head"], case["seqs"], seed=case["seed"])
        return sg.make_pool_batch(case["head"], case["seqs"], seed=case["seed"])

    def reference(self, case: dict[str, Any], batch: dict[str, Any]) -> Any:
        from tools.research import attention_gpu_sglang as sg

        scale = 1.0 / math.sqrt(case["head"])
        if case["engine"] == "vllm":
            return gpu.reference(batch, scale, case["window"])
        window = case["window"]
        mask = (window, None) if case["phase"] == "extend" else (-1, sg.decode_window(batch, window))
        return sg.reference(batch, scale, *mask)

    def run(self, case: dict[str, Any], batch: dict[str, Any]) -> Any:
        from tools.research import attention_gpu_sglang as sg

        scale = 1.0 / math.sqrt(case["head"])
        if case["engine"] == "vllm":
            self.platform.capability = (7, 5)  # type: ignore[union-attr]
            scratch = gpu.builder_scratch(512)
            with _vllm_t4():
                return gpu.run_unified(self.vllm, batch, scale, case["window"], scratch)
        with sg.target_arch((7, 5), gpu.T4_LIMIT, self.extend, self.decode):
            if case["phase"] == "extend":
                return sg.run_extend(self.extend, batch, scale, case["window"])
            return sg.run_decode(self.decode, batch, scale, case["window"], case["splits"] or [])


@contextlib.contextmanager
def _vllm_t4() -> Iterator[None]:
    """The T4's opt-in shared memory for vLLM's launcher, on a GPU (the real device otherwise) or the CPU."""
    if gpu.DEVICE == "cuda":
        with gpu.shared_limit(gpu.T4_LIMIT):
            yield
        return
    import torch

    from t4patch.verify.attention.device import DeviceProperties

    real = torch.cuda.get_device_properties
    props = DeviceProperties("Tesla T4 stand-in", 7, 5, gpu.T4_LIMIT)
    torch.cuda.get_device_properties = lambda device=None: props  # type: ignore[assignment,return-value]
    try:
        yield
    finally:
        torch.cuda.get_device_properties = real


def capture(args: argparse.Namespace) -> int:
    import os

    import triton

    gpu.DEVICE = "cpu"
    engines = Engines(args.vllm_dir, args.sglang_dir)
    cap = replay.Capture(engines.functions(), args.bundle)
    out: dict[str, Any] = {"triton": triton.__version__, "triton_file": triton.__file__,
                           "T4PATCH_TRITON_MMA": os.environ.get("T4PATCH_TRITON_MMA"), "cases": []}
    for case in engines.cases(args.small):
        t0 = time.time()
        batch = engines.batch(case)
        engines.run(case, batch)
        records = cap.take()
        out["cases"].append({**case, "launches": records})
        summary = [(r["kernel"].split(".")[-1][:14], r["shared"], r["mma_m16n8k8_f16"], r["fma_rn_f32"]) for r in records]
        print(f"{case['id']:28s} {time.time() - t0:5.1f} s  (kernel, shared, mma f16, fma.f32): {summary}", flush=True)
    replay.save(out["cases"], args.bundle / "records.json")
    (args.bundle / "capture.json").write_text(json.dumps({k: v for k, v in out.items() if k != "cases"}, indent=1))
    return 0


def _sm() -> str:
    import torch

    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def check(args: argparse.Namespace) -> int:
    import torch

    gpu.DEVICE = "cuda"
    engines = Engines(args.vllm_dir, args.sglang_dir)
    bundles = {mode: json.loads((args.bundle / mode / "records.json").read_text()) for mode in MODES
               if (args.bundle / mode / "records.json").exists()}
    if "mma" not in bundles:
        raise SystemExit(f"{args.bundle}/mma/records.json is missing")
    player = replay.Replayer(engines.functions())
    result: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "bound": gpu.BOUND,
                              "evidence_class": EVIDENCE.format(sm=_sm()), "device": gpu.device_info(),
                              "capture": {m: json.loads((args.bundle / m / "capture.json").read_text()) for m in bundles},
                              "cases": []}
    for index, case in enumerate(bundles["mma"]):
        if args.only and not any(s in case["id"] for s in args.only):
            continue
        batch = engines.batch(case)
        ref = engines.reference(case, batch)
        row: dict[str, Any] = {k: case[k] for k in ("id", "engine", "layer", "head", "case")}
        row["tokens"] = int(batch["q"].shape[0])
        for mode, records in bundles.items():
            recorded = records[index]
            if recorded["id"] != case["id"]:
                raise RuntimeError(f"{mode} bundle case {index} is {recorded['id']}, expected {case['id']}")
            try:
                with player.expecting(recorded["launches"], args.bundle / mode):
                    out = engines.run(case, batch)
                torch.cuda.synchronize()
                err = (out.float() - ref).abs()
                row[mode] = {"max_abs_err": float(err.max()), "mean_abs_err": float(err.mean()),
                             "finite": bool(torch.isfinite(out).all()),
                             "launches": [{k: r.get(k) for k in ("kernel", "grid", "num_warps", "shared",
                                                                "mma_m16n8k8_f16", "fma_rn_f32", "cp_async",
                                                                "sm_jit_regs", "sm_jit_spills", "ptx_sha256",
                                                                "warmup")} for r in player.done]}
            except Exception:  # noqa: BLE001 - the row records it; the run goes on
                row[mode] = {"error": traceback.format_exc()}
        mma = row["mma"]
        row["ok"] = ("error" not in mma and mma["finite"] and mma["max_abs_err"] <= gpu.BOUND
                     and all(l["warmup"] or l["mma_m16n8k8_f16"] > 0 for l in mma["launches"]
                             if "reduce" not in l["kernel"] and "stage2" not in l["kernel"]))
        result["cases"].append(row)
        fma = row.get("fma", {})
        print(f"{case['id']:28s} mma err {mma.get('max_abs_err', float('nan')):.2e}  fma err "
              f"{fma.get('max_abs_err', float('nan')):.2e}  ok {row['ok']}  "
              f"{[(l['kernel'].split('.')[-1][:14], l['shared'], l['mma_m16n8k8_f16'], l['fma_rn_f32']) for l in mma.get('launches', [])]}"
              f"{'  ERROR ' + mma['error'][-300:] if 'error' in mma else ''}", flush=True)
        args.out.write_text(json.dumps(result, indent=1, default=str))
    rows = result["cases"]
    result["all_ok"] = bool(rows) and all(r["ok"] for r in rows)
    args.out.write_text(json.dumps(result, indent=1, default=str))
    print(f"cases {len(rows)}, ok {sum(r['ok'] for r in rows)}, max mma err "
          f"{max((r['mma'].get('max_abs_err', float('inf')) for r in rows), default=float('nan')):.3e}", flush=True)
    return 0 if result["all_ok"] else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    for name in ("capture", "check"):
        p = sub.add_parser(name)
        p.add_argument("--vllm-dir", type=Path)
        p.add_argument("--sglang-dir", type=Path)
        p.add_argument("--bundle", type=Path, required=True)
        p.add_argument("--small", action="store_true")
        if name == "check":
            p.add_argument("--out", type=Path, required=True)
            p.add_argument("--only", nargs="*", default=[])
    args = parser.parse_args(argv)
    return capture(args) if args.step == "capture" else check(args)


if __name__ == "__main__":
    sys.exit(main())
