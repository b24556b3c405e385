"""The generic readiness checks: the stack under every engine (torch, Triton, FlashInfer, the CUDA toolkit,
RAM and swap, several GPUs on one host). Which engine needs what (nvcc at run time, FlashInfer, flags for
GPUs without peer-to-peer) is asked of the engine table the context carries; each engine's own checks come
from its doctor hook (``Engine.doctor``), which the doctor command calls.

Every fact comes from files: torch's architecture list from the fatbin headers of ``libtorch_cuda.so``
(:mod:`t4patch.cuda.code_index`), versions and pins from dist-info, peer-to-peer from NVML.
"""

from __future__ import annotations

from t4patch.cuda.arch import TURING
from t4patch.cuda.code_index import code_architectures
from t4patch.cuda.nvcc import nvcc_release
from t4patch.readiness.model import Check, Context, requirement

TORCH_CUDA_LIBRARY = "torch/lib/libtorch_cuda.so"
# The article's rig, not a measured need: the seed article served Gemma 4 E2B with all six engines on a GCE
# n1-standard-2, which it prints as "7.4 GiB RAM" and for which it reports no swap. Neither the article nor any
# t4patch record measured the load's peak host memory (docs/troubleshooting.md §10 says so), so the only honest
# threshold is that VM: at or above it the load is known to have fit once; below it, it is not known either way.
ARTICLE_VM_RAM_GIB = 7.4
ARTICLE_VM = (f"the article's T4 VM ({ARTICLE_VM_RAM_GIB} GiB RAM, GCE n1-standard-2, where all six engines loaded "
              "Gemma 4 E2B; the load's peak was not measured)")
GIB = 2**30


def torch_fix(pip: str, version: str) -> str:
    """The CUDA build of the same torch release, into the environment ``pip`` installs to."""
    release = version.split("+")[0]
    return (
        f"{pip} --force-reinstall torch=={release} --index-url https://download.pytorch.org/whl/<cuda tag> "
        "(the CUDA build for your driver whose arch list has sm_75), then rerun t4patch doctor"
    )


def torch_cuda_arch(ctx: Context) -> Check:
    torch = ctx.target.find("torch")
    if torch is None:
        return Check("torch-cuda-arch", "ok", "torch is not installed in the target: nothing to check")
    pip = ctx.target.pip_install()
    library = torch.root / TORCH_CUDA_LIBRARY
    if not library.is_file():
        status = "fail" if ctx.gpus.gpus else "warn"
        return Check(
            "torch-cuda-arch", status, f"torch {torch.version} is a CPU-only build (no {TORCH_CUDA_LIBRARY})",
            fix=torch_fix(pip, torch.version),
        )
    archs = code_architectures(library)
    if archs.problem:
        return Check("torch-cuda-arch", "warn", f"could not read {library}: {archs.problem}")
    where = archs.runs_on(TURING)
    if where == "sass":
        return Check("torch-cuda-arch", "ok", f"torch {torch.version} has sm_75 machine code ({archs.describe()})")
    if not ctx.turing_relevant:
        return Check("torch-cuda-arch", "ok", f"torch {torch.version}: no sm_75 code, and no Turing GPU here")
    if where == "ptx":
        return Check(
            "torch-cuda-arch", "warn",
            f"torch {torch.version} has no sm_75 machine code, only PTX the driver compiles at first use "
            f"({archs.describe()}): slow first start",
            fix=torch_fix(pip, torch.version),
        )
    return Check(
        "torch-cuda-arch", "fail",
        f"torch {torch.version} has no code for sm_75 ({archs.describe()}): every kernel fails on a T4 with "
        "'no kernel image is available for execution on the device'",
        fix=torch_fix(pip, torch.version),
    )


def triton_version(ctx: Context) -> Check:
    triton = ctx.target.find("triton")
    torch = ctx.target.find("torch")
    pin = requirement(torch, "triton") if torch is not None else None
    if triton is None:
        if torch is not None and (torch.root / TORCH_CUDA_LIBRARY).is_file():
            spec = f"'triton{pin.specifier}'" if pin else "triton"
            return Check(
                "triton", "warn", "triton is not installed: the engines' Triton attention kernels cannot compile",
                fix=f"{ctx.target.pip_install()} {spec}",
            )
        return Check("triton", "ok", "triton is not installed (nothing here needs it without a CUDA torch)")
    if pin is not None and pin.specifier and not pin.specifier.contains(triton.version, prereleases=True):
        return Check(
            "triton", "warn",
            f"triton {triton.version} does not satisfy torch {torch.version if torch else '?'}'s "
            f"triton{pin.specifier}: compiled kernels may fail to load",
            fix=f"{ctx.target.pip_install()} 'triton{pin.specifier}'",
        )
    pinned = f" (torch pins triton{pin.specifier})" if pin is not None and pin.specifier else ""
    return Check("triton", "ok", f"triton {triton.version}{pinned}; it compiles for sm_75 (no bf16 there)")


def nvcc_at_runtime(ctx: Context) -> Check:
    needs = [
        f"{dist} ({why})"
        for dist, why in (*((e.name, e.runtime_nvcc) for e in ctx.engines), ("flashinfer-python", FLASHINFER_JIT))
        if why and ctx.target.find(dist) is not None
    ]
    path, version = nvcc_release()
    if path is not None:
        return Check("nvcc", "ok", f"nvcc {version or '?'} at {path}" + (f", needed by {'; '.join(needs)}" if needs else ""))
    if not needs:
        return Check("nvcc", "ok", "no CUDA compiler found, and nothing installed here compiles kernels at run time")
    return Check(
        "nvcc", "warn",
        f"no CUDA compiler (nvcc) on PATH or under $CUDA_HOME, but {'; '.join(needs)} compile kernels at run time",
        fix="install the CUDA toolkit's compiler on the serving box (e.g. apt-get install cuda-nvcc-12-8, or "
        "pip install nvidia-cuda-nvcc-cu12) and put it on PATH or set CUDA_HOME",
    )


FLASHINFER_JIT = "FlashInfer JIT-compiles its kernels for the GPU at first use"


def flashinfer_turing(ctx: Context) -> Check:
    flashinfer = ctx.target.find("flashinfer-python")
    if flashinfer is None:
        return Check("flashinfer", "ok", "flashinfer-python is not installed")
    if not ctx.turing_relevant:
        return Check("flashinfer", "ok", f"flashinfer-python {flashinfer.version}; no Turing GPU here")
    users = [e.label for e in ctx.installed_engines() if e.flashinfer_on_turing]
    fixes = [f"{e.label}: {e.flashinfer_on_turing}" for e in ctx.installed_engines() if e.flashinfer_on_turing]
    return Check(
        "flashinfer", "warn",
        f"flashinfer-python {flashinfer.version} on sm_75: FlashInfer's sm_75 support is broken "
        f"(flashinfer#3620)" + (f"; {' and '.join(users)} still call it" if users else ""),
        fix="; ".join(fixes) or "serve with the engine's Triton attention backend",
    )


def memory_for_model(ctx: Context) -> Check:
    ram, swap = ctx.memory.get("ram_total"), ctx.memory.get("swap_total") or 0
    if ram is None:
        return Check("memory", "warn", "could not read RAM and swap (/proc/meminfo)")
    total = (ram + swap) / GIB
    text = f"RAM {ram / GIB:.1f} GiB + swap {swap / GIB:.1f} GiB = {total:.1f} GiB"
    # /proc/meminfo's MemTotal is what the article's "7.4 GiB" VM prints; allow its own rounding
    if total >= ARTICLE_VM_RAM_GIB - 0.05:
        return Check("memory", "ok", f"{text}: at least {ARTICLE_VM}")
    missing = ARTICLE_VM_RAM_GIB - total
    return Check(
        "memory", "warn",
        f"{text}: less than {ARTICLE_VM}, so loading may be OOM-killed (or may fit)",
        fix=f"add swap before loading, {max(1, round(missing + 0.5))} GiB or more: "
        f"sudo fallocate -l {max(1, round(missing + 0.5))}G /swapfile && sudo chmod 600 /swapfile && "
        "sudo mkswap /swapfile && sudo swapon /swapfile",
    )


def _p2p_pairs(count: int) -> list[tuple[int, int, bool]] | str:
    """(i, j, peer-to-peer read supported) for every GPU pair, from NVML; a string says why it is unknown."""
    try:
        import pynvml
    except ImportError:
        return "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - any NVML failure means: unknown
        return f"NVML unavailable ({exc})"
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        pairs = []
        for i in range(count):
            for j in range(i + 1, count):
                status = pynvml.nvmlDeviceGetP2PStatus(handles[i], handles[j], pynvml.NVML_P2P_CAPS_INDEX_READ)
                pairs.append((i, j, status == pynvml.NVML_P2P_STATUS_OK))
        return pairs
    except Exception as exc:  # noqa: BLE001
        return f"NVML could not report peer-to-peer status ({exc})"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting down a library that failed is not a finding
            pass


def multi_gpu(ctx: Context) -> Check:
    count = len(ctx.gpus.gpus)
    if count < 2:
        return Check("multi-gpu", "ok", f"{count} GPU{'s' if count != 1 else ''}: no tensor parallelism to check")
    pairs = _p2p_pairs(count)
    flags = "; ".join(f"{e.label}: {e.multi_gpu_without_p2p}" for e in ctx.installed_engines()
                      if e.multi_gpu_without_p2p)
    if isinstance(pairs, str):
        return Check("multi-gpu", "warn", f"{count} GPUs; peer-to-peer status unknown: {pairs}", fix=flags or None)
    without = [f"{i}-{j}" for i, j, ok in pairs if not ok]
    if not without:
        return Check("multi-gpu", "ok", f"{count} GPUs, peer-to-peer reads between every pair")
    return Check(
        "multi-gpu", "warn",
        f"{count} GPUs without peer-to-peer between {', '.join(without)} (PCIe, no NVLink): custom all-reduce "
        "kernels need P2P",
        fix=flags or "disable the engine's custom all-reduce for tensor parallelism",
    )


GENERIC = (torch_cuda_arch, triton_version, nvcc_at_runtime, flashinfer_turing, memory_for_model, multi_gpu)


def run_checks(ctx: Context) -> list[Check]:
    """Every generic check, in doctor's order (the engines' own follow, from their doctor hooks)."""
    return [check(ctx) for check in GENERIC]
