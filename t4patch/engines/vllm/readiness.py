"""vLLM's own readiness checks for `doctor`: on a host with several GPUs, whether vLLM's custom all-reduce
kernels (``cross_device_reduce*`` in its compiled op library) carry sm_75 machine code.

Reading the kernel names means decompressing the library's sm_75 cubins (about 0.4 s for vLLM 0.33.0), so the
check runs only where it matters: more than one GPU and a Turing GPU among them.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from t4patch.readiness.model import Check, Context

LIBRARY = "vllm/_C_stable_libtorch.abi3.so"
ALL_REDUCE = "cross_device_reduce"
TURING = 75


@lru_cache(maxsize=4)
def sm75_function_names(path: Path) -> tuple[str, ...]:
    """Every kernel name in the sm_75 cubins of ``path`` (decoded once per process)."""
    from t4patch.cuda.cubin import function_names
    from t4patch.cuda.fatbin import sass_payloads

    return tuple(name for cubin in sass_payloads(path, TURING) for name in function_names(cubin))


def all_reduce_code(ctx: Context) -> Check:
    vllm = ctx.target.find("vllm")
    assert vllm is not None
    library = vllm.root / LIBRARY
    if not library.is_file():
        return Check("vllm-all-reduce", "warn", f"{library} is missing", fix=vllm.reinstall_command())
    try:
        names = sm75_function_names(library)
    except Exception as exc:  # noqa: BLE001 - an unreadable library is reported, not fatal to doctor
        return Check("vllm-all-reduce", "warn", f"could not read the sm_75 kernels of {library}: {exc}")
    kernels = sum(1 for name in names if ALL_REDUCE in name)
    if kernels:
        return Check("vllm-all-reduce", "ok", f"vLLM {vllm.version}: {kernels} custom all-reduce kernels with sm_75 SASS")
    return Check(
        "vllm-all-reduce", "fail",
        f"vLLM {vllm.version}'s library has no sm_75 custom all-reduce kernels: tensor parallelism fails on T4s",
        fix="serve with --disable-custom-all-reduce",
    )


def checks(ctx: Context) -> list[Check]:
    if ctx.target.find("vllm") is None or len(ctx.gpus.gpus) < 2 or not ctx.turing:
        return []
    return [all_reduce_code(ctx)]
