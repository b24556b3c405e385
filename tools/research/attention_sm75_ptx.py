"""GPU run: the sm_75 PTX Triton generates for the patched vLLM / SGLang attention, executed on a newer GPU.

Evidence class: "sm_75 code executed on sm_XX through PTX JIT, T4 host parameters emulated". Run on a CUDA
machine, not part of the CLI:

    python -m tools.research.attention_sm75_ptx --vllm-dir DIR --sglang-dir DIR --out result.json

What happens per launch. The engine's own launcher runs (patched vLLM 0.33.0 ``unified_attention``: 2D, 3D
split-K and ``reduce_segments``; patched SGLang 0.5.23 ``extend_attention_fwd`` and grouped
``decode_attention_fwd``), told it is on a T4 (compute capability 7.5, 65,536 B opt-in shared memory; the
stand-ins of :mod:`tools.research.attention_gpu` / ``attention_gpu_sglang``), so it picks the T4's tiles.
Triton then compiles each kernel for ``GPUTarget("cuda", 75, 32)`` — the target ``t4patch verify attention``
compiles for on the CPU — instead of this GPU: every launched JIT function gets a separate per-device cache
created while the driver's ``get_current_target`` answers sm_75. When Triton loads the compiled kernel, the
sm_75 cubin (which this GPU cannot run) is replaced by the kernel's own sm_75 PTX, so ``cuModuleLoadData``
hands PTX to the driver, which JIT-compiles it for this GPU. The launch itself is Triton's launcher with the
engine's arguments. So the instructions Triton selected for sm_75 — ``mma.sync.m16n8k8`` for fp16 ``tl.dot``
below cc 8.0, no ``cp.async``, its sm_75 layouts — are what run.

Each case also runs the same tiles compiled natively for this GPU ("native"), so the difference that is due to
sm_75 code generation alone is visible. Reference: float32 torch attention from the same paged cache / pool.
Bound: 2e-3 max abs error on fp16 output (as the sm_90 runs of 2026-11-29).

What it cannot show: T4 timing; hardware rounding differences between the Turing and this GPU's tensor cores
executing the same PTX; sm_75 register allocation (ptxas for sm_75 ran at compile time — its REG/STACK are
reported from the sm_75 cubin — but the driver compiled the PTX for this GPU).
"""

from __future__ import annotations

import argparse
import collections
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

from tools.research import attention_gpu as gpu

BOUND = gpu.BOUND
T4_LIMIT = gpu.T4_LIMIT
PTX_ARCH = 75
NATIVE = "native {sm} compile of the same T4 tiles (ran on {sm})"



class PtxJit:
    """Compile ``functions`` for sm_75 and load their PTX through the driver, inside :meth:`active`."""

    def __init__(self, functions: list[Any]) -> None:
        from triton.backends.compiler import GPUTarget
        from triton.runtime import driver

        self.functions = functions
        self.driver = driver.active
        self.real_target = self.driver.get_current_target()
        self.target = GPUTarget("cuda", PTX_ARCH, self.real_target.warp_size)
        self.caches: dict[int, Any] = {}
        self.launched: list[Any] = []  # the CompiledKernel of every launch made while active, in order
        self.on = False
        for fn in functions:
            if not hasattr(fn, "device_caches") or not hasattr(fn, "create_binder"):
                raise RuntimeError(f"Triton {self._version()}: JITFunction has no device_caches/create_binder; this harness needs Triton >= 3.2")

    def track(self) -> None:
        """Wrap each function's (already captured) ``run`` to remember which compiled kernel every launch used."""
        for fn in self.functions:
            inner = fn.run

            def run(*args: Any, _inner: Any = inner, **kwargs: Any) -> Any:
                kernel = _inner(*args, **kwargs)
                self.launched.append(kernel)
                return kernel

            fn.run = run

    def take(self) -> list[Any]:
        out, self.launched = self.launched, []
        return out

    @staticmethod
    def _version() -> str:
        import triton

        return triton.__version__

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        from triton.compiler.compiler import CompiledKernel

        real_get_target = self.driver.get_current_target
        real_init = CompiledKernel._init_handles
        saved = {id(fn): fn.device_caches for fn in self.functions}

        def init_handles(kernel: Any) -> None:
            if kernel.module is None:
                target = getattr(kernel.metadata, "target", None)
                arch = getattr(target, "arch", None)
                if arch is None:
                    raise RuntimeError("compiled kernel metadata has no target.arch; cannot tell sm_75 kernels apart")
                if arch == PTX_ARCH and self.real_target.arch != PTX_ARCH:
                    ptx = kernel.asm["ptx"]
                    text = ptx if isinstance(ptx, str) else ptx.decode()
                    target_line = next((ln.strip() for ln in text.splitlines() if ln.strip().startswith(".target")), "")
                    if target_line.split()[1:2] != [f"sm_{PTX_ARCH}"]:
                        raise RuntimeError(f"{kernel.name}: PTX says {target_line!r}, expected .target sm_{PTX_ARCH}")
                    kernel.kernel = text.encode()  # bytes keep a trailing NUL: cuModuleLoadData reads it as PTX
                    kernel._t4patch_loaded = {
                        "loaded_as": "ptx",
                        "ptx_target": target_line,
                        "ptx_version": next((ln.strip() for ln in text.splitlines() if ln.strip().startswith(".version")), ""),
                        "ptx_sha256": hashlib.sha256(text.encode()).hexdigest(),
                        "ptx_mma_m16n8k8": text.count("m16n8k8"),
                        "ptx_mma_m16n8k16": text.count("m16n8k16"),
                        "ptx_cp_async": text.count("cp.async"),
                    }
            real_init(kernel)

        self.driver.get_current_target = lambda: self.target
        CompiledKernel._init_handles = init_handles
        try:
            for fn in self.functions:
                if id(fn) not in self.caches:
                    # create_binder reads the (now sm_75) target; one cache per function for the whole run
                    self.caches[id(fn)] = collections.defaultdict(fn.create_binder)
                fn.device_caches = self.caches[id(fn)]
            yield
        finally:
            self.driver.get_current_target = real_get_target
            CompiledKernel._init_handles = real_init
            for fn in self.functions:
                fn.device_caches = saved[id(fn)]


def _annotate(launches: list[dict[str, Any]], kernels: list[Any], expect_ptx: bool) -> list[str]:
    """Attach what the driver loaded to each launch; return problems (a PTX-mode launch that was not PTX)."""
    if len(launches) != len(kernels):
        return [f"{len(launches)} launches captured but {len(kernels)} compiled kernels tracked"]
    problems = []
    for launch, kernel in zip(launches, kernels):
        loaded = getattr(kernel, "_t4patch_loaded", None)
        launch["compiled_for"] = f"sm_{getattr(getattr(kernel.metadata, 'target', None), 'arch', '?')}"
        if expect_ptx:
            if loaded is None:
                problems.append(f"{launch['kernel']}: no sm_{PTX_ARCH} PTX was loaded for this launch")
            else:
                launch.update(loaded)
            if launch.get("shared", 0) > T4_LIMIT:
                problems.append(f"{launch['kernel']}: sm_75 compile asks for {launch['shared']} B > {T4_LIMIT}")
        elif loaded is not None:
            problems.append(f"{launch['kernel']}: native run used an sm_{PTX_ARCH} PTX kernel")
    return problems


def _sm() -> str:
    import torch

    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def _evidence() -> str:
    """This run's evidence class, in the words every report uses (t4patch.evidence)."""
    import torch

    from t4patch import evidence

    return evidence.ptx_jit(tuple(torch.cuda.get_device_capability()), host_emulated=True)  # type: ignore[arg-type]


def vllm_numerics(module: Any, platform: Any, small: bool) -> list[dict[str, Any]]:
    import torch

    capture = gpu.LaunchCapture(module)
    ptx = PtxJit([getattr(module, name) for name in gpu.VLLM_KERNELS])
    ptx.track()
    rows = []
    for layer, head, window in gpu.LAYERS:
        scale = 1.0 / math.sqrt(head)
        for name, seqs in gpu.cases(small):
            batch = gpu.make_batch(head, seqs, seed=zlib.crc32(f"{layer}/{name}".encode()))
            ref = gpu.reference(batch, scale, window)
            floor = float((gpu.reference(batch, scale, window, fp16_p=True).half().float() - ref).abs().max())
            row: dict[str, Any] = {"engine": "vllm", "layer": layer, "head": head, "window": window, "case": name,
                                   "num_seqs": len(seqs), "tokens": int(batch["q"].shape[0]),
                                   "fp16_floor_max_abs_err": floor, "ref_max_abs": float(ref.abs().max())}
            outs = {}
            for label, use_ptx in (("sm75-ptx", True), ("native", False)):
                platform.capability = (7, 5)
                scratch = gpu.builder_scratch(512)
                with gpu.shared_limit(T4_LIMIT), (ptx.active() if use_ptx else contextlib.nullcontext()):
                    out = gpu.run_unified(module, batch, scale, window, scratch)
                torch.cuda.synchronize()
                launches = capture.take()
                problems = _annotate(launches, ptx.take(), use_ptx)
                err = (out.float() - ref).abs()
                outs[label] = out
                row[label] = {"max_abs_err": float(err.max()), "mean_abs_err": float(err.mean()),
                              "finite": bool(torch.isfinite(out).all()), "launches": launches, "problems": problems}
            row["ptx_vs_native_max_abs"] = float((outs["sm75-ptx"].float() - outs["native"].float()).abs().max())
            row["ok"] = (row["sm75-ptx"]["max_abs_err"] <= BOUND and row["sm75-ptx"]["finite"]
                         and not row["sm75-ptx"]["problems"])
            rows.append(row)
            tiles = [(l["kernel"][:6], l.get("TILE_SIZE"), l.get("IS_3D"), l.get("shared")) for l in row["sm75-ptx"]["launches"]]
            print(f"vllm {layer:7s} {name:12s} sm75-ptx err {row['sm75-ptx']['max_abs_err']:.2e} native err "
                  f"{row['native']['max_abs_err']:.2e} ptx-vs-native {row['ptx_vs_native_max_abs']:.2e} "
                  f"floor {floor:.2e} tiles {tiles} problems {row['sm75-ptx']['problems']}", flush=True)
    return rows


def sglang_numerics(extend: Any, decode: Any, small: bool) -> list[dict[str, Any]]:
    import random

    import torch

    from tools.research import attention_gpu_sglang as sg

    capture_e = gpu.LaunchCapture(extend, sg.EXTEND_KERNELS, sg.CONSTEXPRS)
    capture_d = gpu.LaunchCapture(decode, sg.DECODE_KERNELS, sg.CONSTEXPRS)
    ptx = PtxJit([getattr(extend, n) for n in sg.EXTEND_KERNELS] + [getattr(decode, n) for n in sg.DECODE_KERNELS])
    ptx.track()
    rows = []
    for layer, head, window in sg.LAYERS:
        scale = 1.0 / math.sqrt(head)
        for name, phase, seqs in sg.cases(small):
            batch = sg.make_pool_batch(head, seqs, seed=zlib.crc32(f"sglang/{layer}/{name}".encode()))
            mask = (window, None) if phase == "extend" else (-1, sg.decode_window(batch, window))
            ref = sg.reference(batch, scale, *mask)
            floor = float((sg.reference(batch, scale, mask[0], mask[1], fp16_p=True).half().float() - ref).abs().max())
            splits = None
            if phase == "decode":
                rnd = random.Random(len(seqs))
                splits = [rnd.randint(1, sg.MAX_KV_SPLITS) for _ in seqs]
            row: dict[str, Any] = {"engine": "sglang", "layer": layer, "head": head, "sliding_window_size": window,
                                   "case": name, "phase": phase, "num_seqs": len(seqs),
                                   "tokens": int(batch["q"].shape[0]), "ref_max_abs": float(ref.abs().max()),
                                   "fp16_floor_max_abs_err": floor}
            outs = {}
            for label, use_ptx in (("sm75-ptx", True), ("native", False)):
                with sg.target_arch((7, 5), T4_LIMIT, extend, decode), (ptx.active() if use_ptx else contextlib.nullcontext()):
                    if phase == "extend":
                        out = sg.run_extend(extend, batch, scale, window)
                    else:
                        out = sg.run_decode(decode, batch, scale, window, splits or [])
                torch.cuda.synchronize()
                launches = capture_e.take() + capture_d.take()
                kernels = ptx.take()
                # the two captures are concatenated per module: order the tracked kernels the same way
                names = [getattr(k, "name", "") for k in kernels]
                kernels = [k for k, n in zip(kernels, names) if n in sg.EXTEND_KERNELS] + [k for k, n in zip(kernels, names) if n not in sg.EXTEND_KERNELS]
                problems = _annotate(launches, kernels, use_ptx)
                outs[label] = out.as_subclass(torch.Tensor)
                err = (outs[label].float() - ref).abs()
                row[label] = {"max_abs_err": float(err.max()), "mean_abs_err": float(err.mean()),
                              "finite": bool(torch.isfinite(outs[label]).all()), "launches": launches, "problems": problems}
            row["ptx_vs_native_max_abs"] = float((outs["sm75-ptx"].float() - outs["native"].float()).abs().max())
            row["ok"] = (row["sm75-ptx"]["max_abs_err"] <= BOUND and row["sm75-ptx"]["finite"]
                         and not row["sm75-ptx"]["problems"])
            rows.append(row)
            tiles = sorted({(l["kernel"], l.get("BLOCK_M"), l.get("BLOCK_N"), l.get("shared")) for l in row["sm75-ptx"]["launches"]})
            print(f"sglang {layer:7s} {name:12s} sm75-ptx err {row['sm75-ptx']['max_abs_err']:.2e} native err "
                  f"{row['native']['max_abs_err']:.2e} ptx-vs-native {row['ptx_vs_native_max_abs']:.2e} "
                  f"floor {floor:.2e} tiles {tiles} problems {row['sm75-ptx']['problems']}", flush=True)
    return rows


def _dot_kernel_source() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def t4patch_ptx_selftest_dot(a_ptr, b_ptr, c_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
        offs_m = tl.arange(0, M)
        offs_n = tl.arange(0, N)
        offs_k = tl.arange(0, K)
        a = tl.load(a_ptr + offs_m[:, None] * K + offs_k[None, :])
        b = tl.load(b_ptr + offs_k[:, None] * N + offs_n[None, :])
        tl.store(c_ptr + offs_m[:, None] * N + offs_n[None, :], tl.dot(a, b))

    return t4patch_ptx_selftest_dot


def selftest() -> dict[str, Any]:
    """One fp16 tl.dot (64 x 64 x 64) compiled for sm_75 and run through the PTX path: the harness itself works
    (the kernel was compiled for sm_75, loaded as PTX, and computed a matmul)."""
    import torch

    fn = _dot_kernel_source()
    ptx = PtxJit([fn])
    ptx.track()
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(64, 64, generator=gen).half().cuda()
    b = torch.randn(64, 64, generator=gen).half().cuda()
    c = torch.empty(64, 64, dtype=torch.float32, device="cuda")
    with ptx.active():
        fn[(1,)](a, b, c, M=64, N=64, K=64)
    torch.cuda.synchronize()
    (kernel,) = ptx.take()
    err = float((c - a.float() @ b.float()).abs().max())
    return {"compiled_for": f"sm_{kernel.metadata.target.arch}", **getattr(kernel, "_t4patch_loaded", {"loaded_as": "cubin?"}),
            "max_abs_err_vs_fp32_matmul": err, "ok": err < 1e-2 and getattr(kernel, "_t4patch_loaded", None) is not None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-dir", type=Path, help="patched triton_unified_attention.py + triton_attention_helpers.py")
    parser.add_argument("--sglang-dir", type=Path, help="tree with the patched SGLang attention files (attention_gpu_sglang.FILES)")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--small", action="store_true", help="small shapes (a quick try-out)")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("needs a CUDA GPU (the point is the driver's PTX JIT)", file=sys.stderr)
        return 11
    result: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "bound": BOUND,
                              "evidence_class": _evidence(), "ptx_arch": PTX_ARCH,
                              "t4_shared_limit": T4_LIMIT}

    def save() -> None:
        args.out.write_text(json.dumps(result, indent=1, default=str), encoding="utf-8")

    try:
        result["device"] = gpu.device_info()
        print(json.dumps(result["device"]), flush=True)
        result["selftest"] = selftest()
        print(f"selftest: {json.dumps(result['selftest'])}", flush=True)
        if not result["selftest"]["ok"]:
            raise RuntimeError("the sm_75 PTX self-test failed; the engine runs would not show what they claim")
        if args.vllm_dir:
            result["vllm_files"] = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(args.vllm_dir.glob("*.py"))}
            t0 = time.time()
            try:
                module, platform = gpu.load_vllm_attention(args.vllm_dir)
                result["vllm"] = vllm_numerics(module, platform, args.small)
            except Exception:  # noqa: BLE001 - keep the other engine's results
                result["vllm_error"] = traceback.format_exc()
                print(result["vllm_error"], flush=True)
            result["vllm_seconds"] = round(time.time() - t0, 1)
            save()
        if args.sglang_dir:
            from tools.research import attention_gpu_sglang as sg

            result["sglang_files"] = {f: hashlib.sha256((args.sglang_dir / f).read_bytes()).hexdigest() for f in sg.FILES}
            t0 = time.time()
            try:
                extend, decode = sg.load_sglang_attention(args.sglang_dir)
                result["sglang"] = sglang_numerics(extend, decode, args.small)
            except Exception:  # noqa: BLE001
                result["sglang_error"] = traceback.format_exc()
                print(result["sglang_error"], flush=True)
            result["sglang_seconds"] = round(time.time() - t0, 1)
        rows = result.get("vllm", []) + result.get("sglang", [])
        result["all_ok"] = bool(rows) and all(r["ok"] for r in rows) and not any(k.endswith("_error") for k in result)
    finally:
        save()
    return 0 if result.get("all_ok") else 1


if __name__ == "__main__":
    raise SystemExit(main())
