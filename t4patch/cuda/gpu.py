"""GPU facts without torch: the CUDA driver API (through ctypes) and NVML (nvidia-ml-py).

Importing torch to ask "is this a T4?" costs seconds and may not even be possible in t4patch's own venv.
The driver API gives exactly what the engines will see (same device order, CUDA_VISIBLE_DEVICES honoured):
name, compute capability, and the opt-in shared memory per block that Triton checks at launch. NVML adds the
driver version. Either may be missing (no GPU, a container without the driver); that is reported, not raised.
"""

from __future__ import annotations

import ctypes
from dataclasses import asdict, dataclass, field
from typing import Any

# cudaDeviceAttr / CUdevice_attribute values (cuda.h)
_ATTR_CC_MAJOR = 75
_ATTR_CC_MINOR = 76
_ATTR_SMEM_PER_BLOCK_OPTIN = 97
_ATTR_MULTIPROCESSOR_COUNT = 16


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    compute_capability: str  # "7.5"
    shared_memory_per_block_optin: int | None  # bytes; 65,536 on a T4
    multiprocessors: int | None
    memory_total_bytes: int | None

    @property
    def cc_tuple(self) -> tuple[int, int]:
        major, minor = self.compute_capability.split(".")
        return int(major), int(minor)

    @property
    def bf16(self) -> bool:
        """Native bf16 arithmetic (what engines check) starts at compute capability 8.0."""
        return self.cc_tuple >= (8, 0)

    @property
    def sm(self) -> str:
        major, minor = self.cc_tuple
        return f"sm_{major}{minor}"


@dataclass(frozen=True)
class GpuReport:
    gpus: tuple[Gpu, ...]
    driver_version: str | None
    cuda_driver_version: str | None
    sources: tuple[str, ...]
    problems: tuple[str, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        return {
            "gpus": [{**asdict(g), "bf16": g.bf16, "sm": g.sm} for g in self.gpus],
            "driver_version": self.driver_version,
            "cuda_driver_version": self.cuda_driver_version,
            "sources": list(self.sources),
            "problems": list(self.problems),
        }


def _cuda_version_string(value: int) -> str:
    return f"{value // 1000}.{(value % 1000) // 10}"


def _from_driver_api() -> tuple[list[Gpu], str | None]:
    """Devices as the CUDA driver enumerates them; raises OSError/RuntimeError when unavailable."""
    cuda = ctypes.CDLL("libcuda.so.1")

    def check(result: int, what: str) -> None:
        if result != 0:
            raise RuntimeError(f"{what} failed with CUresult {result}")

    check(cuda.cuInit(0), "cuInit")
    version = ctypes.c_int()
    check(cuda.cuDriverGetVersion(ctypes.byref(version)), "cuDriverGetVersion")
    count = ctypes.c_int()
    check(cuda.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
    gpus = []
    for index in range(count.value):
        device = ctypes.c_int()
        check(cuda.cuDeviceGet(ctypes.byref(device), index), "cuDeviceGet")

        def attribute(attr: int) -> int:
            value = ctypes.c_int()
            check(cuda.cuDeviceGetAttribute(ctypes.byref(value), attr, device), "cuDeviceGetAttribute")
            return value.value

        name = ctypes.create_string_buffer(256)
        check(cuda.cuDeviceGetName(name, 256, device), "cuDeviceGetName")
        total = ctypes.c_size_t()
        check(cuda.cuDeviceTotalMem_v2(ctypes.byref(total), device), "cuDeviceTotalMem")
        gpus.append(
            Gpu(
                index=index,
                name=name.value.decode(errors="replace"),
                compute_capability=f"{attribute(_ATTR_CC_MAJOR)}.{attribute(_ATTR_CC_MINOR)}",
                shared_memory_per_block_optin=attribute(_ATTR_SMEM_PER_BLOCK_OPTIN),
                multiprocessors=attribute(_ATTR_MULTIPROCESSOR_COUNT),
                memory_total_bytes=total.value,
            )
        )
    return gpus, _cuda_version_string(version.value)


def _from_nvml() -> tuple[list[Gpu], str | None, str | None]:
    import pynvml  # from nvidia-ml-py; light, no torch

    pynvml.nvmlInit()
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else driver
        cuda_version = _cuda_version_string(pynvml.nvmlSystemGetCudaDriverVersion())
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            gpus.append(
                Gpu(
                    index=index,
                    name=name.decode() if isinstance(name, bytes) else name,
                    compute_capability=f"{major}.{minor}",
                    shared_memory_per_block_optin=None,
                    multiprocessors=None,
                    memory_total_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
                )
            )
        return gpus, driver, cuda_version
    finally:
        pynvml.nvmlShutdown()


def detect() -> GpuReport:
    """Everything we can learn about the GPUs without torch; never raises for a missing GPU or driver."""
    problems: list[str] = []
    sources: list[str] = []
    gpus: list[Gpu] = []
    driver = cuda_version = None
    try:
        gpus, cuda_version = _from_driver_api()
        sources.append("cuda-driver-api")
    except (OSError, RuntimeError, AttributeError) as exc:
        problems.append(f"CUDA driver API unavailable: {exc}")
    try:
        nvml_gpus, driver, nvml_cuda = _from_nvml()
        sources.append("nvml")
        cuda_version = cuda_version or nvml_cuda
        if not gpus:
            gpus = nvml_gpus
    except ImportError:
        problems.append("nvidia-ml-py is not installed (pip install nvidia-ml-py)")
    except Exception as exc:  # noqa: BLE001 - pynvml raises NVMLError subclasses for every driver problem
        problems.append(f"NVML unavailable: {exc}")
    return GpuReport(tuple(gpus), driver, cuda_version, tuple(sources), tuple(problems))
