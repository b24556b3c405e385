"""SGLang's own readiness checks for `doctor`: sglang-kernel's sm_75 code, and what SGLang still calls in it.

sglang-kernel ships compiled CUDA ops; a build without sm_75 machine code (and no PTX the driver could compile
for it) fails on a T4 with "no kernel image is available for execution on the device" the first time SGLang
reaches one of its ops. Which ops those are is read from the installed SGLang itself (the names its CUDA
layers import from ``sgl_kernel``), not from a list kept here.
"""

from __future__ import annotations

import re

from t4patch.contract import Check, Context
from t4patch.cuda.arch import TURING
from t4patch.cuda.code_index import code_architectures
from t4patch.readiness.model import shared_libraries

KERNEL_DISTRIBUTION = "sglang-kernel"
# SGLang modules whose CUDA branch imports sgl_kernel ops at import time (read, never imported)
CALLERS = ("sglang/srt/layers/activation.py", "sglang/srt/layers/layernorm.py", "sglang/srt/layers/sampler.py")
_IMPORT = re.compile(r"from\s+sgl_kernel\s+import\s+(\([^)]*\)|[^\n]+)")
# flags that route SGLang to sglang-kernel's own ops instead of the Triton / patched paths
AVOID = "--enable-torch-compile"


def imported_ops(ctx: Context) -> list[str]:
    """The sgl_kernel names SGLang's CUDA layers import, read from the installed files."""
    sglang = ctx.target.find("sglang")
    if sglang is None:
        return []
    names: set[str] = set()
    for rel in CALLERS:
        try:
            text = (sglang.root / rel).read_text(encoding="utf-8")
        except OSError:
            continue
        for match in _IMPORT.finditer(text):
            for part in match.group(1).strip("()").replace("\n", " ").split(","):
                name = part.split(" as ")[0].strip()
                if name.isidentifier():
                    names.add(name)
    return sorted(names)


def kernel_code(ctx: Context) -> Check:
    dist = ctx.target.find(KERNEL_DISTRIBUTION)
    if dist is None:
        return Check("sglang-kernel", "ok", f"{KERNEL_DISTRIBUTION} is not installed")
    libraries = shared_libraries(dist)
    if not libraries:
        return Check("sglang-kernel", "warn", f"{KERNEL_DISTRIBUTION} {dist.version}: RECORD lists no .so files")
    archs = [code_architectures(dist.root / rel) for rel in libraries]
    turing = [a for a in archs if a.runs_on(TURING) != "none"]
    sass = sorted({s for a in archs for s in a.sass})
    ptx = sorted({p for a in archs for p in a.ptx})
    found = f"SASS {', '.join(f'sm_{s}' for s in sass) or 'none'}, PTX {', '.join(f'compute_{p}' for p in ptx) or 'none'}"
    if turing:
        return Check(
            "sglang-kernel", "ok",
            f"{KERNEL_DISTRIBUTION} {dist.version}: {len(turing)} of {len(archs)} libraries carry sm_75 code ({found})",
        )
    if not ctx.turing_relevant:
        return Check("sglang-kernel", "ok", f"{KERNEL_DISTRIBUTION} {dist.version}: no sm_75 code, no Turing GPU here")
    ops = imported_ops(ctx)
    return Check(
        "sglang-kernel", "fail",
        f"{KERNEL_DISTRIBUTION} {dist.version} has no sm_75 code in any of its {len(archs)} libraries ({found}); "
        + (f"SGLang still imports {', '.join(ops)} from it, " if ops else "")
        + "and every call that reaches one fails with 'no kernel image is available'",
        fix=f"do not serve with {AVOID} (it falls back to sglang-kernel's own ops); keep the Triton attention "
        "backend and the patched Marlin path",
    )


def checks(ctx: Context) -> list[Check]:
    if ctx.target.find("sglang") is None:
        return []
    return [kernel_code(ctx)]
