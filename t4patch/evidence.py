"""The evidence class of every report: what kind of run a claim about sm_75 rests on, named in one place.

A report about Turing code says which of these it is, and says it in these words, so a reader (and a test)
can tell a CPU compile from a run on another GPU from a T4 measurement at a glance:

- :data:`COMPILED_ON_CPU`: the code was compiled for sm_75 on the CPU; nothing ran on a GPU;
- :func:`ran_on`: the code ran on another GPU, as that GPU's own build (not the Turing code paths);
- :func:`ptx_jit`: sm_75 PTX was JIT-compiled by the driver and executed on another GPU, T4 host parameters
  emulated (or, with ``host_emulated=False``, the host code followed the real GPU);
- :func:`measured_on_t4`: the run happened on a T4 (or another sm_75 board).

:func:`for_run` picks the class from what ran where. Numbers are not evidence classes; they stay in each report.
"""

from __future__ import annotations

from t4patch.cuda.arch import TURING_CAPABILITY

COMPILED_ON_CPU = "compiled for sm_75 on the CPU"
_RAN_ON = "ran on {sm}"
_PTX_JIT = "sm_75 code executed on {sm} through PTX JIT"
_EMULATED = ", T4 host parameters emulated"
_MEASURED = "measured on a T4"


def sm_name(capability: tuple[int, int]) -> str:
    """(9, 0) -> "sm_90"."""
    return f"sm_{capability[0]}{capability[1]}"


def parse_capability(text: str) -> tuple[int, int]:
    """"9.0" -> (9, 0) (a compute capability as torch and nvidia-smi print it)."""
    major, _, minor = text.partition(".")
    return int(major), int(minor or 0)


def ran_on(capability: tuple[int, int]) -> str:
    """Another GPU ran its own build of the code: "ran on sm_90"."""
    return _RAN_ON.format(sm=sm_name(capability))


def ptx_jit(capability: tuple[int, int], *, host_emulated: bool = True) -> str:
    """sm_75 PTX executed on ``capability`` through driver JIT; with ``host_emulated`` the host code believed
    it ran on a T4 (its capability, shared memory and SM count): "sm_75 code executed on sm_90 through PTX
    JIT, T4 host parameters emulated"."""
    return _PTX_JIT.format(sm=sm_name(capability)) + (_EMULATED if host_emulated else "")


def measured_on_t4(capability: tuple[int, int] = TURING_CAPABILITY, *, board: str | None = None) -> str:
    """The run was on a Turing GPU itself: "measured on a T4" (``board`` names another sm_75 board)."""
    return _MEASURED if board is None else f"measured on a {board} ({sm_name(capability)})"


def for_run(capability: tuple[int, int] | None, *, sm75_ptx_only: bool = False, host_emulated: bool = False) -> str:
    """The class of a run: None (no GPU) is a CPU compile; a Turing GPU is a T4 measurement; another GPU
    running sm_75 PTX alone is a PTX-JIT run; anything else ran that GPU's own build."""
    if capability is None:
        return COMPILED_ON_CPU
    if capability == TURING_CAPABILITY:
        return measured_on_t4(capability)
    if sm75_ptx_only:
        return ptx_jit(capability, host_emulated=host_emulated)
    return ran_on(capability)
