"""Turn every Triton launch into a compile for a chosen GPU architecture, with no GPU present.

Triton asks its *active driver* for the current target, compiles for it, then asks the driver to load the
binary and launch it. Installing a driver whose target is ``GPUTarget("cuda", <cc>, 32)`` and whose
load/launch steps only record what they were given makes ``kernel[grid](...)`` inside an engine's own
launcher do exactly the compile a real launch on that GPU would do (same specialisation, same constexprs,
same options), and nothing else. What is recorded per launch:

- ``metadata.shared``: the bytes the launch asks for; Triton refuses a launch when it exceeds the device's
  opt-in limit (``CompiledKernel._init_handles``), and the caller applies that same comparison;
- ``n_regs`` / ``n_spills``: on a GPU, Triton reads them from the loaded module (cuFuncGetAttribute NUM_REGS
  and LOCAL_SIZE_BYTES / 4). Here the same two numbers are read from the compiled cubin with the cuobjdump
  Triton bundles (``REG`` and the per-thread ``STACK`` frame, where spills live), and handed to Triton through
  ``load_binary`` so they land on the CompiledKernel exactly where a real load puts them;
- the path its dots took (tensor cores or fp32 FMA) and the PTX's ``mma.sync`` / ``fma.rn.f32`` counts
  (:mod:`t4patch.verify.attention.kernel_path`), from the TTIR, TTGIR and PTX of that very compile, which
  Triton hands to ``knobs.runtime.kernel_load_start_hook`` (the files of its cache entry) just before the load.

This module is imported only inside the worker process (it needs torch and triton); nothing here runs at
import time.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from t4patch.verify.attention.kernel_path import KernelPath, analyse

# Reported as the device's opt-in shared memory to Triton's own launch check. The harness must see every
# kernel of a case (Triton would stop at the first misfit), so Triton's check is disabled and the caller
# applies the identical comparison (shared > limit) against the architecture's real limit.
_NO_LIMIT = 1 << 40


@dataclass
class Launch:
    """One ``kernel[grid](...)`` of the engine, compiled for the target instead of run."""

    kernel: str
    grid: tuple[int, int, int]
    constexprs: dict[str, Any]
    num_warps: int
    num_stages: int
    shared: int
    n_regs: int | None
    n_spills: int | None
    local_bytes: int | None  # per-thread local memory (stack frame) the spills live in
    cache_key: str
    kernel_path: KernelPath | None = None  # None: the compile's IR was not handed over (see Recorder.note_load)

    def to_json(self) -> dict[str, Any]:
        return {
            **(self.kernel_path.to_json() if self.kernel_path is not None else {"dot_path": None}),
            "kernel": self.kernel,
            "grid": list(self.grid),
            "constexprs": {k: _jsonable(v) for k, v in self.constexprs.items()},
            "num_warps": self.num_warps,
            "num_stages": self.num_stages,
            "shared_bytes": self.shared,
            "registers": self.n_regs,
            "spills": self.n_spills,
            "local_bytes_per_thread": self.local_bytes,
            "triton_cache_key": self.cache_key,
        }


def _jsonable(value: Any) -> Any:
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
    return str(value)


@dataclass
class Recorder:
    """Collects launches; the harness slices ``launches`` per case."""

    capability: int
    launches: list[Launch] = field(default_factory=list)
    resource_notes: list[str] = field(default_factory=list)
    _usage_cache: dict[bytes, tuple[int | None, int | None]] = field(default_factory=dict)
    paths: dict[str, KernelPath] = field(default_factory=dict)  # compile hash -> what its dots ran on

    def note_load(self, name: str, metadata_group: dict[str, str], compile_hash: str) -> None:
        """Read the TTIR, TTGIR and PTX of the compile about to be loaded (its cache entry's files)."""
        if compile_hash in self.paths:
            return
        texts: dict[str, str | None] = {}
        for ext in ("ttir", "ttgir", "ptx"):
            path = metadata_group.get(f"{name}.{ext}")
            try:
                texts[ext] = Path(path).read_text(encoding="utf-8") if path else None
            except OSError:
                texts[ext] = None
        missing = [ext for ext, text in texts.items() if text is None]
        if missing:
            self._note(f"Triton's cache entry of {name} has no {'/'.join(missing)}: its dot path is not reported")
        self.paths[compile_hash] = analyse(texts["ttir"], texts["ttgir"], texts["ptx"])

    def resource_usage(self, cubin: bytes) -> tuple[int | None, int | None]:
        """(registers, local bytes per thread) of the single kernel in ``cubin``, via cuobjdump -res-usage."""
        if cubin in self._usage_cache:
            return self._usage_cache[cubin]
        result: tuple[int | None, int | None] = (None, None)
        tool = _cuobjdump()
        if tool is None:
            self._note("cuobjdump not found next to Triton: registers and spills are not reported")
        else:
            from t4patch.cuda.cuobjdump import resource_usage

            usage, why = resource_usage(cubin, tool=tool)
            if usage is None:
                self._note(why or "cuobjdump -res-usage gave no resource line")
            else:
                result = (usage.registers, usage.stack)
        self._usage_cache[cubin] = result
        return result

    def _note(self, text: str) -> None:
        if text not in self.resource_notes:
            self.resource_notes.append(text)


def _cuobjdump() -> str | None:
    from triton import knobs

    try:
        path = knobs.nvidia.cuobjdump.path
    except Exception:  # noqa: BLE001 - any failure to locate the tool means "not available"
        return None
    return path if path and os.path.exists(path) else None


def install(capability: int) -> Recorder:
    """Make Triton compile every launch for ``sm_<capability>`` and record it; returns the recorder."""
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver as driver_config

    recorder = Recorder(capability=capability)
    target = GPUTarget("cuda", capability, 32)

    class _RecordingLauncher:
        """Stands in for the C launcher Triton builds per compiled kernel; called once per launch."""

        def __init__(self, src: Any, metadata: Any) -> None:
            self.src = src
            self.metadata = metadata
            names = list(src.fn.arg_names)
            # ASTSource.constants maps argument paths (tuples of indices) to values; top-level ones are 1-tuples.
            self.constexprs = {
                names[path[0]]: value for path, value in src.constants.items() if len(path) == 1
            }

        def __call__(self, gx: int, gy: int, gz: int, stream: Any, function: Any, *rest: Any) -> None:
            n_regs, local_bytes = function if isinstance(function, tuple) else (None, None)
            recorder.launches.append(
                Launch(
                    kernel=self.src.fn.__name__,
                    grid=(int(gx), int(gy), int(gz)),
                    constexprs=dict(self.constexprs),
                    num_warps=int(self.metadata.num_warps),
                    num_stages=int(self.metadata.num_stages),
                    shared=int(self.metadata.shared),
                    n_regs=n_regs,
                    n_spills=(local_bytes // 4) if local_bytes is not None else None,
                    local_bytes=local_bytes,
                    cache_key=str(getattr(self.metadata, "hash", "")),
                    kernel_path=recorder.paths.get(str(getattr(self.metadata, "hash", ""))),
                )
            )

    class _Utils:
        def get_device_properties(self, device: int) -> dict[str, int]:
            return {"max_shared_mem": _NO_LIMIT, "multiprocessor_count": 1, "max_num_regs": 65536, "warpSize": 32}

        def load_binary(self, name: str, kernel: bytes, shared: int, device: int) -> tuple[Any, ...]:
            n_regs, local_bytes = recorder.resource_usage(kernel)
            # (module, function, n_regs, n_spills, n_max_threads); "function" carries the raw numbers to the
            # launcher, which is the only consumer of it here.
            n_spills = (local_bytes // 4) if local_bytes is not None else 0
            return (None, (n_regs, local_bytes), n_regs or 0, n_spills, 1024)

        def unload_module(self, module: Any) -> None:
            return None

    class _CompileOnlyDriver:
        def __init__(self) -> None:
            self.utils = _Utils()
            self.launcher_cls = _RecordingLauncher

        def is_active(self) -> bool:
            return True

        def get_current_target(self) -> Any:
            return target

        def get_current_device(self) -> int:
            # One device id per architecture keeps Triton's per-device binder caches apart.
            return capability

        def get_current_stream(self, device: int | None = None) -> int:
            return 0

        def get_device_interface(self) -> Any:
            import torch

            return torch.cuda

    driver_config.set_active(_CompileOnlyDriver())
    _add_load_hook(recorder)
    return recorder


def _add_load_hook(recorder: Recorder) -> None:
    """Have Triton hand every compile's cache files to ``recorder`` before it loads the binary."""
    from triton import knobs

    def hook(module: Any, function: Any, name: str, metadata_group: dict[str, str], compile_hash: str) -> None:
        recorder.note_load(name, metadata_group, compile_hash)

    chain = knobs.runtime.kernel_load_start_hook
    if hasattr(chain, "add"):  # 3.7+: a HookChain
        chain.add(hook)
    else:
        knobs.runtime.kernel_load_start_hook = hook
