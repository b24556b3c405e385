"""Record Triton launches as sm_75 PTX on a CPU-only machine, and replay them through the CUDA driver elsewhere.

Why: the GPU machine has another Triton (3.6) than the one t4patch patches (3.8.0, too large to carry there),
and no T4. So the kernels are compiled HERE, by the patched Triton, for ``GPUTarget("cuda", 75, 32)``, and
only their PTX and launch facts travel. On the GPU machine the same Python launcher code runs again (the
engine's own ``unified_attention`` / ``extend_attention_fwd`` / ``decode_attention_fwd`` with the same
inputs), but each ``kernel[grid](...)`` is answered by :class:`Replayer`: it checks the call against the
recorded one (same kernel, grid, constexprs and scalar arguments, pointers as aligned as recorded, so the
sm_75 PTX's specialisation holds), loads the recorded PTX with ``cuModuleLoadData`` (the driver JIT-compiles
it for the GPU at hand) and launches it with ``cuLaunchKernel`` and the live tensors' addresses. No Triton
compile happens on the GPU machine; the instructions that run are the ones the patched Triton 3.8 chose for
sm_75 (``mma.sync.aligned.m16n8k8`` or FMA).

Record (JSON, one per launch, in launch order; ``ptx`` names a file in the bundle):
kernel, grid, num_warps, num_ctas, shared, global/profile scratch size and alignment, args (name, Triton
signature type, role "param" or "constexpr", value for scalars and constexprs, ``aligned16`` for pointers),
ptx, the PTX instruction counts (mma.sync, m16n8k8 f16, fma.rn.f32) and the TTGIR's dot work (:func:`ttgir_dots`).

Capture runs under ``PYTHONPATH=<patched triton 3.8 site>`` with torch CPU; replay needs torch with CUDA and
``libcuda.so.1``; both are maintainer tools (not shipped, not part of the CLI).
"""

from __future__ import annotations

import ctypes
import hashlib
import inspect
import json
import re
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

PTX_ARCH = 75
_ENTRY = re.compile(r"\.entry\s+(\w+)\s*\((.*?)\)", re.S)
_PARAM = re.compile(r"\.param\s+\.(\w+)")
# Turing fp16 tensor-core instructions (fp32 or fp16 accumulation); sm_80 tf32 dots also say m16n8k8, not f16.
TURING_F16_MMA = re.compile(r"mma\.sync\.aligned\.m16n8k8\.row\.col\.(?:f32|f16)\.f16\.f16\.(?:f32|f16)")


def ptx_counts(ptx: str) -> dict[str, int]:
    """Static instruction counts that tell the dot path apart."""
    return {
        "mma_sync": ptx.count("mma.sync"),
        "mma_m16n8k8_f16": len(TURING_F16_MMA.findall(ptx)),
        "fma_rn_f32": ptx.count("fma.rn.f32"),
        "cp_async": ptx.count("cp.async"),
    }


_DOT = re.compile(r"\btt\.dot\s[^:]*:\s*tensor<((?:\d+x)+)\w+,.*?->\s*tensor<((?:\d+x)+)\w+")
_MMA_WARPS = re.compile(r"nvidia_mma<\{versionMajor = (\d+), versionMinor = (\d+), warpsPerCTA = \[([\d, ]+)\]")


def ttgir_dots(ttgir: str) -> dict[str, Any]:
    """The dot work in the kernel's TTGIR, which does not depend on the dot path: ``dot_flops`` (2·M·N·K summed
    over every ``tt.dot`` in the code, once each: one pass of every loop body, per program), ``dots`` (how many),
    and ``mma_warps`` (``warpsPerCTA`` of the first MMA encoding, None on the FMA path). A T4 model needs the first
    to turn static instruction counts into time whatever tiles each path chose; the last shows how the MMA path
    spreads the tile over the warps (warps beyond the tile's 16×8 blocks repeat the same products)."""
    flops = dots = 0
    for line in ttgir.splitlines():
        match = _DOT.search(line)
        if match is None:
            continue
        a_dims = [int(d) for d in match.group(1)[:-1].split("x")]
        c_dims = [int(d) for d in match.group(2)[:-1].split("x")]
        product = 1
        for d in c_dims:
            product *= d
        flops += 2 * product * a_dims[-1]
        dots += 1
    warps = _MMA_WARPS.search(ttgir)
    return {"dot_flops": flops, "dots": dots,
            "mma_warps": [int(w) for w in warps.group(3).split(",")] if warps else None}


def ptx_params(ptx: str) -> tuple[str, list[str]]:
    """The entry's name and its parameters' PTX types, in order."""
    match = _ENTRY.search(ptx)
    if match is None:
        raise ValueError("no .entry in the PTX")
    return match.group(1), _PARAM.findall(match.group(2))


def _scalar(value: Any) -> Any:
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    return repr(value)


# ------------------------------------------------------------------------------------------------- capture


class Capture:
    """Make every launch of ``functions`` a compile for sm_75 and record it (CPU; patched Triton on the path)."""

    def __init__(self, functions: dict[str, Any], bundle: Path) -> None:
        self.functions = functions
        self.bundle = bundle
        self.bundle.mkdir(parents=True, exist_ok=True)
        self.records: list[dict[str, Any]] = []
        self._pending: list[dict[str, Any]] = []
        self._install_driver()
        for name, fn in functions.items():
            self._wrap(name, fn)

    def _install_driver(self) -> None:
        from triton.backends.compiler import GPUTarget
        from triton.runtime import driver as driver_config

        target = GPUTarget("cuda", PTX_ARCH, 32)
        pending = self._pending

        class _Launcher:
            def __init__(self, src: Any, metadata: Any) -> None:
                self.src = src
                self.metadata = metadata

            def __call__(self, gx: int, gy: int, gz: int, stream: Any, function: Any, *rest: Any) -> None:
                args = rest[4:]  # kernel_metadata, launch_metadata, enter hook, exit hook, then the arguments
                pending.append({"grid": [int(gx), int(gy), int(gz)], "src": self.src, "args": args})

        class _Utils:
            def get_device_properties(self, device: int) -> dict[str, int]:
                return {"max_shared_mem": 1 << 40, "multiprocessor_count": 40, "max_num_regs": 65536,
                        "warpSize": 32}

            def load_binary(self, name: str, kernel: bytes, shared: int, device: int) -> tuple[Any, ...]:
                return (None, None, 0, 0, 1024)

            def unload_module(self, module: Any) -> None:
                return None

        class _Driver:
            def __init__(self) -> None:
                self.utils = _Utils()
                self.launcher_cls = _Launcher

            def is_active(self) -> bool:
                return True

            def get_current_target(self) -> Any:
                return target

            def get_current_device(self) -> int:
                return 0

            def get_current_stream(self, device: int | None = None) -> int:
                return 0

            def get_device_interface(self) -> Any:
                import torch

                return torch.cuda

        driver_config.set_active(_Driver())

    def _wrap(self, name: str, fn: Any) -> None:
        inner = getattr(fn, "_t4patch_capture_inner", fn.run)

        def run(*args: Any, _inner: Any = inner, _name: str = name, **kwargs: Any) -> Any:
            before = len(self._pending)
            kernel = _inner(*args, **kwargs)
            if kwargs.get("warmup"):
                self.records.append(self._record(_name, kernel, None))
            else:
                if len(self._pending) != before + 1:
                    raise RuntimeError(f"{_name}: expected one launch, saw {len(self._pending) - before}")
                self.records.append(self._record(_name, kernel, self._pending.pop()))
            return kernel

        fn.run = run
        fn._t4patch_capture_inner = inner

    def _record(self, name: str, kernel: Any, launch: dict[str, Any] | None) -> dict[str, Any]:
        ptx = kernel.asm["ptx"]
        ptx = ptx if isinstance(ptx, str) else ptx.decode()
        digest = hashlib.sha256(ptx.encode()).hexdigest()
        path = self.bundle / f"{name}-{digest[:16]}.ptx"
        if not path.exists():
            path.write_text(ptx, encoding="utf-8")
        md = kernel.metadata
        if getattr(md.target, "arch", None) != PTX_ARCH:
            raise RuntimeError(f"{name}: compiled for {md.target}, expected sm_{PTX_ARCH}")
        record: dict[str, Any] = {
            "kernel": name, "warmup": launch is None, "ptx": path.name, "ptx_sha256": digest,
            "num_warps": int(md.num_warps), "num_ctas": int(md.num_ctas), "shared": int(md.shared),
            "global_scratch_size": int(getattr(md, "global_scratch_size", 0) or 0),
            "global_scratch_align": int(getattr(md, "global_scratch_align", 1) or 1),
            "profile_scratch_size": int(getattr(md, "profile_scratch_size", 0) or 0),
            "profile_scratch_align": int(getattr(md, "profile_scratch_align", 1) or 1),
            "triton_hash": str(md.hash), **ptx_counts(ptx), **ttgir_dots(str(kernel.asm.get("ttgir", ""))),
        }
        if launch is None:
            return record
        src = launch["src"]
        names = list(src.fn.arg_names)
        types = list(src.signature.values())
        if len(names) != len(types) or len(launch["args"]) != len(names):
            raise RuntimeError(f"{name}: {len(names)} names, {len(types)} types, {len(launch['args'])} arguments")
        args = []
        for arg_name, sig, value in zip(names, types, launch["args"]):
            entry: dict[str, Any] = {"name": arg_name, "sig": sig}
            if sig == "constexpr":
                entry.update(role="constexpr", value=_scalar(value))
            elif sig.startswith("*"):
                if not hasattr(value, "data_ptr"):
                    raise RuntimeError(f"{name}.{arg_name}: pointer argument is {type(value).__name__}")
                entry.update(role="param", aligned16=value.data_ptr() % 16 == 0)
            else:
                entry.update(role="param", value=_scalar(value))
            args.append(entry)
        entry_name, params = ptx_params(ptx)
        n_args = sum(1 for a in args if a["role"] == "param")
        if len(params) != n_args + 2:  # Triton 3.8 appends the global and profile scratch pointers
            raise RuntimeError(f"{name}: PTX entry {entry_name} has {len(params)} params, expected {n_args} + 2")
        record.update(grid=launch["grid"], entry=entry_name, ptx_param_types=params, args=args)
        return record

    def take(self) -> list[dict[str, Any]]:
        out, self.records = self.records, []
        return out


# -------------------------------------------------------------------------------------------------- replay


def _pack(ptx_type: str, sig: str, value: Any) -> ctypes.Array[ctypes.c_char]:
    """One kernel parameter's bytes, laid out as the PTX parameter type says."""
    size = {"u8": 1, "s8": 1, "b8": 1, "u16": 2, "s16": 2, "b16": 2, "f16": 2, "u32": 4, "s32": 4, "b32": 4,
            "f32": 4, "u64": 8, "s64": 8, "b64": 8, "f64": 8}[ptx_type]
    if sig.startswith("fp") or sig.startswith("bf"):
        fmt = {2: "<e", 4: "<f", 8: "<d"}[size]
        if sig.startswith("bf"):
            raise ValueError("bf16 scalar arguments are not supported by this replayer")
        data = struct.pack(fmt, float(value))
    else:
        data = int(value).to_bytes(size, "little", signed=int(value) < 0)
    return ctypes.create_string_buffer(data, size)


class _Cuda:
    """The few driver-API calls the replay needs, through ctypes (independent of the local Triton's launcher)."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")

    def check(self, result: int, what: str) -> None:
        if result != 0:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(result, ctypes.byref(name))
            raise RuntimeError(f"{what}: CUDA error {result} {name.value.decode() if name.value else ''}")

    def launch(self, function: int, grid: list[int], threads: int, shared: int, stream: int,
               params: list[ctypes.Array[ctypes.c_char]]) -> None:
        pointers = (ctypes.c_void_p * len(params))(*[ctypes.cast(p, ctypes.c_void_p) for p in params])
        self.check(self.lib.cuLaunchKernel(
            ctypes.c_void_p(function), ctypes.c_uint(grid[0]), ctypes.c_uint(grid[1]), ctypes.c_uint(grid[2]),
            ctypes.c_uint(threads), ctypes.c_uint(1), ctypes.c_uint(1), ctypes.c_uint(shared),
            ctypes.c_void_p(stream), pointers, None), "cuLaunchKernel")


class Replayer:
    """Answer each launch of ``functions`` with the next recorded launch of that kernel, run from its PTX."""

    def __init__(self, functions: dict[str, Any]) -> None:
        from triton.runtime import driver

        self.functions = functions
        self.bundle = Path(".")
        self.driver = driver.active
        self.cuda = _Cuda()
        self.modules: dict[Path, tuple[Any, int, int, int]] = {}  # ptx file -> (module, function, regs, spills)
        self.queue: list[dict[str, Any]] = []
        self.done: list[dict[str, Any]] = []
        self.timing: Callable[[Callable[[], None]], float] | None = None  # set by the benchmark
        for name, fn in functions.items():
            self._wrap(name, fn)

    @contextmanager
    def expecting(self, records: list[dict[str, Any]], bundle: Path) -> Iterator[None]:
        """Replay ``records`` (one case's launches, PTX files in ``bundle``); every record must be used, in order."""
        self.bundle = bundle
        self.queue, self.done = [dict(r) for r in records], []
        yield
        if self.queue:
            raise RuntimeError(f"{len(self.queue)} recorded launches were not made again, first "
                               f"{self.queue[0]['kernel']}: the launcher took another path here")

    def _load(self, record: dict[str, Any]) -> tuple[Any, int, int, int]:
        path = self.bundle / record["ptx"]
        if path not in self.modules:
            import torch

            text = path.read_text(encoding="utf-8")
            if hashlib.sha256(text.encode()).hexdigest() != record["ptx_sha256"]:
                raise RuntimeError(f"{record['ptx']}: sha256 differs from the record")
            if f".target sm_{PTX_ARCH}" not in text:
                raise RuntimeError(f"{record['ptx']}: not sm_{PTX_ARCH} PTX")
            device = torch.cuda.current_device()
            module, function, n_regs, n_spills, _ = self.driver.utils.load_binary(
                record["entry"], text.encode() + b"\0", record["shared"], device)
            self.modules[path] = (module, function, n_regs, n_spills)
        return self.modules[path]

    def _wrap(self, name: str, fn: Any) -> None:
        signature = inspect.signature(fn.fn)
        arg_names = list(fn.arg_names)

        def run(*args: Any, grid: Any, warmup: bool, _name: str = name, **kwargs: Any) -> Any:
            if not self.queue:
                raise RuntimeError(f"{_name}: launched, but no recorded launch is left")
            record = self.queue.pop(0)
            if record["kernel"] != _name or record["warmup"] != bool(warmup):
                raise RuntimeError(f"{_name} (warmup={warmup}) launched where the record has {record['kernel']} "
                                   f"(warmup={record['warmup']})")
            bound = signature.bind_partial(*args, **{k: v for k, v in kwargs.items() if k in arg_names})
            bound.apply_defaults()
            if warmup:
                self.done.append(record)
                return _Compiled(record)
            self._launch(_name, record, dict(bound.arguments), grid)
            self.done.append(record)
            return _Compiled(record)

        fn.run = run

    def _launch(self, name: str, record: dict[str, Any], values: dict[str, Any], grid: Any) -> None:
        import torch

        live_grid = grid(values) if callable(grid) else grid
        live_grid = [int(g) for g in (*tuple(live_grid), 1, 1)[:3]]
        if live_grid != record["grid"]:
            raise RuntimeError(f"{name}: grid {live_grid} here, {record['grid']} recorded")
        params: list[ctypes.Array[ctypes.c_char]] = []
        ptx_types = record["ptx_param_types"]
        keep: list[Any] = []
        for arg in record["args"]:
            value = values.get(arg["name"])
            if arg["role"] == "constexpr":
                if _scalar(value) != arg["value"] and not (value is None and arg["value"] is None):
                    raise RuntimeError(f"{name}.{arg['name']}: {value!r} here, {arg['value']!r} recorded")
                continue
            ptx_type = ptx_types[len(params)]
            if arg["sig"].startswith("*"):
                if not isinstance(value, torch.Tensor) or not value.is_cuda:
                    raise RuntimeError(f"{name}.{arg['name']}: expected a CUDA tensor, got {type(value).__name__}")
                ptr = value.data_ptr()
                if arg["aligned16"] and ptr % 16:
                    raise RuntimeError(f"{name}.{arg['name']}: PTX assumes 16-byte alignment, pointer is {ptr:#x}")
                params.append(_pack(ptx_type, "u64", ptr))
            else:
                if _scalar(value) != arg["value"]:
                    raise RuntimeError(f"{name}.{arg['name']}: {value!r} here, {arg['value']!r} recorded")
                params.append(_pack(ptx_type, arg["sig"], value))
        blocks = record["grid"][0] * record["grid"][1] * record["grid"][2] * record["num_ctas"]
        for kind in ("global", "profile"):
            size = record[f"{kind}_scratch_size"]
            if size:
                buffer = torch.zeros(blocks * size + record[f"{kind}_scratch_align"], dtype=torch.uint8, device="cuda")
                keep.append(buffer)
                params.append(_pack(ptx_types[len(params)], "u64", buffer.data_ptr()))
            else:
                params.append(_pack(ptx_types[len(params)], "u64", 0))
        _, function, n_regs, n_spills = self._load(record)
        record["sm_jit_regs"], record["sm_jit_spills"] = n_regs, n_spills
        stream = torch.cuda.current_stream().cuda_stream
        threads = 32 * record["num_warps"]

        def go() -> None:
            self.cuda.launch(function, record["grid"], threads, record["shared"], stream, params)

        go()
        if self.timing is not None:
            record["seconds"] = self.timing(go)
        del keep


class _Compiled:
    """What a replayed ``kernel[grid](...)`` / ``.warmup(...)`` returns: the recorded compile's facts."""

    def __init__(self, record: dict[str, Any]) -> None:
        self.metadata = type("Metadata", (), {"shared": record["shared"], "num_warps": record["num_warps"]})()
        self.n_regs = record.get("sm_jit_regs")
        self.n_spills = record.get("sm_jit_spills")
        self.name = record["kernel"]


def save(records: list[dict[str, Any]], path: Path) -> None:
    path.write_text(json.dumps(records, indent=1), encoding="utf-8")
