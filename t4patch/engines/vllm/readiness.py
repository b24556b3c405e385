"""vLLM's own readiness checks for `doctor`: on a host with several GPUs, whether vLLM's custom all-reduce
kernels (``cross_device_reduce*`` in its compiled op library) carry sm_75 machine code; and the kernel-name
rule for the Marlin kernels of that library, which the SGLang doctor (whose patched Marlin runs them) reads too.

Reading the kernel names means decompressing the library's sm_75 cubins (about 0.4 s for vLLM 0.33.0), so the
check runs only where it matters: more than one GPU and a Turing GPU among them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

from t4patch.contract import Check, Context, DoctorSection
from t4patch.cuda.arch import TURING
from t4patch.cuda.cubin import function_names
from t4patch.engines.vllm.marlin import LIBRARY

ALL_REDUCE = "cross_device_reduce"


def count_marlin_names(names: Iterable[str]) -> tuple[int, int]:
    """(Marlin GEMM kernels, Marlin repack kernels) among kernel names."""
    gemm = repack = 0
    for name in names:
        if "marlin_repack" in name.lower():
            repack += 1
        elif re.search(r"6Marlin[I0-9]|MarlinDefault", name):
            gemm += 1
    return gemm, repack


def count_marlin_kernels(cubins: Iterable[bytes]) -> tuple[int, int]:
    """(Marlin GEMM kernels, Marlin repack kernels) among the function symbols of the given cubins."""
    return count_marlin_names(name for cubin in cubins for name in function_names(cubin))


@lru_cache(maxsize=4)
def sm75_function_names(path: Path) -> tuple[str, ...]:
    """Every kernel name in the sm_75 cubins of ``path`` (decoded once per process)."""
    from t4patch.cuda.fatbin import sass_payloads

    return tuple(name for cubin in sass_payloads(path, TURING) for name in function_names(cubin))


def _cache_file(path: Path) -> Path:
    import hashlib

    from t4patch.fileio.cache import cache_dir

    info = path.stat()
    key = hashlib.sha256(f"{path.resolve()}\0{info.st_size}\0{info.st_mtime_ns}".encode()).hexdigest()[:24]
    return cache_dir("doctor") / f"sm75-kernels-{key}.json"


def sm75_kernel_counts(path: Path) -> dict[str, int]:
    """How many sm_75 Marlin GEMM, Marlin repack and custom all-reduce kernels ``path`` holds.

    Decoding the cubins takes about 0.4 s, so the counts are kept in t4patch's cache keyed by the library's
    path, size and modification time (a reinstalled library is a new key); the cache is an optimisation only:
    an unreadable or unwritable cache means decoding again.
    """
    import json

    cache = _cache_file(path)
    try:
        counts = json.loads(cache.read_text(encoding="utf-8"))
        if isinstance(counts, dict) and all(isinstance(v, int) for v in counts.values()) and len(counts) == 3:
            return counts
    except (OSError, ValueError):
        pass
    names = sm75_function_names(path)
    gemm, repack = count_marlin_names(names)
    counts = {"marlin_gemm": gemm, "marlin_repack": repack, "all_reduce": sum(1 for n in names if ALL_REDUCE in n)}
    try:
        from t4patch.fileio.atomic import write_json_atomic

        cache.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(cache, counts)
    except OSError:
        pass
    return counts


def all_reduce_code(ctx: Context) -> Check:
    vllm = ctx.target.find("vllm")
    assert vllm is not None
    library = vllm.root / LIBRARY
    if not library.is_file():
        return Check("vllm-all-reduce", "warn", f"{library} is missing", fix=vllm.reinstall_command())
    try:
        kernels = sm75_kernel_counts(library)["all_reduce"]
    except Exception as exc:  # noqa: BLE001 - an unreadable library is reported, not fatal to doctor
        return Check("vllm-all-reduce", "warn", f"could not read the sm_75 kernels of {library}: {exc}")
    if kernels:
        return Check("vllm-all-reduce", "ok", f"vLLM {vllm.version}: {kernels} custom all-reduce kernels with sm_75 SASS")
    return Check(
        "vllm-all-reduce", "fail",
        f"vLLM {vllm.version}'s library has no sm_75 custom all-reduce kernels: tensor parallelism fails on T4s",
        fix="serve with --disable-custom-all-reduce",
    )


def section(ctx: Context) -> DoctorSection | None:
    """vLLM's doctor findings: the all-reduce check, only where several GPUs include a Turing one."""
    if ctx.target.find("vllm") is None or len(ctx.gpus.gpus) < 2 or not ctx.turing:
        return None
    return DoctorSection(checks=(all_reduce_code(ctx),))
