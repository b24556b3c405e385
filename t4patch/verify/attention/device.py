"""Make the worker look like a machine with one GPU of the target architecture, to the engine's launcher code.

Launchers (and the patches t4patch ships for them) ask the *device* what it is: ``torch.cuda.
get_device_capability()``, ``get_device_properties(d).shared_memory_per_block_optin``, ``current_device()``,
``q.is_cuda`` / ``q.get_device()``. On a CPU-only verifier those calls fail or answer "no CUDA", and a patch
gated on them would silently not run. So, inside the worker only:

- those ``torch.cuda`` functions answer the architecture from ``gpu-archs.toml`` (device 0);
- the tensors handed to a launcher are :class:`ArchTensor`: ordinary CPU tensors (same storage, strides and
  dtype, so Triton specialises them exactly as it would device tensors) whose ``is_cuda`` is True and whose
  ``get_device()`` is 0. ``.device`` stays ``cpu`` so anything a launcher allocates "like q" stays on the CPU.

Nothing here runs a kernel; with Triton's driver replaced (:mod:`t4patch.verify.attention.triton_target`) a launch is a
compile.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DeviceProperties:
    """What ``torch.cuda.get_device_properties`` returns for the target architecture (the fields launchers read)."""

    name: str
    major: int
    minor: int
    shared_memory_per_block_optin: int
    warp_size: int = 32
    multi_processor_count: int = 1


def install_device(arch: dict[str, Any]) -> DeviceProperties:
    """Patch ``torch.cuda``'s device queries to answer ``arch`` (a ``gpu-archs.toml`` entry as JSON)."""
    import torch

    major, minor = arch["capability"]
    props = DeviceProperties(
        name=f"t4patch stand-in for {arch['name']} ({arch.get('gpus', '')})",
        major=major,
        minor=minor,
        shared_memory_per_block_optin=arch["shared_memory_per_block_optin"],
        warp_size=arch.get("warp_size", 32),
    )
    torch.cuda.get_device_capability = lambda device=None: (major, minor)
    torch.cuda.get_device_properties = lambda device=None: props  # type: ignore[assignment,return-value]
    torch.cuda.get_device_name = lambda device=None: props.name
    torch.cuda.current_device = lambda: 0
    return props


def arch_tensor_class() -> type:
    import torch

    class ArchTensor(torch.Tensor):
        """A CPU tensor that says it lives on CUDA device 0 (see module docstring)."""

        @property
        def is_cuda(self) -> bool:  # type: ignore[override]
            return True

        def get_device(self) -> int:
            return 0

    return ArchTensor


_ARCH_TENSOR: type | None = None


def on_device(tensor: Any) -> Any:
    """``tensor`` as an :class:`ArchTensor` sharing its storage (views of it stay ArchTensors)."""
    import torch

    global _ARCH_TENSOR
    if _ARCH_TENSOR is None:
        _ARCH_TENSOR = arch_tensor_class()
    return torch.Tensor._make_subclass(_ARCH_TENSOR, tensor)
