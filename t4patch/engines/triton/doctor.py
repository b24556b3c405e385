"""Doctor's Triton check: on a Turing GPU, does fp16 ``tl.dot`` run on the tensor cores or on fp32 FMA?

Read from files and the environment only (no ``import triton``): the installed Triton's patch state (the same
status machinery as ``t4patch status``) and the switch the patched compiler reads. Stock Triton >= 3.3 sends
every dot on compute capability < 8.0 to the FMA path (8.1 of a T4's 65 TFLOPS); the t4patch set gives fp16
dots back Triton's Turing lowering (mma.sync m16n8k8). On GPUs of cc >= 8.0 the set changes nothing.
"""

from __future__ import annotations

import os

from t4patch.contract import Check, Context, DoctorSection
from t4patch.environment import suggest
from t4patch.patching.registry import supported_versions
from t4patch.patching.status import engine_status

NAME = "triton"
CHECK = "triton-tensor-cores"
# The environment switch the patched compiler.py reads (patches/triton/*/0001-*.diff): "0" keeps the stock FMA
# path, unset / "" / "1" the tensor cores, anything else makes every compile fail with a ValueError.
SWITCH = "T4PATCH_TRITON_MMA"
MMA = "fp16 tl.dot compiled for sm_75 uses the tensor cores (mma.sync m16n8k8)"
FMA = "fp16 tl.dot compiled for sm_75 runs on fp32 FMA (8.1 of a T4's 65 TFLOPS)"


def switch_check(value: str | None, spec: str) -> Check | None:
    """The switch's verdict when it overrides the applied set (None: it does not)."""
    if value is None or value in ("", "1"):
        return None
    if value == "0":
        return Check(CHECK, "warn", f"{spec} is applied, but {SWITCH}=0 in this environment keeps the stock FMA "
                     f"path: {FMA}", fix=f"unset {SWITCH}")
    return Check(CHECK, "fail", f"{SWITCH}={value!r}: the patched Triton refuses to compile any kernel (expected 0 "
                 "or 1)", fix=f"unset {SWITCH}, or export {SWITCH}=0 to keep the FMA path")


def tensor_core_check(ctx: Context) -> Check | None:
    """None when Triton is not installed in the target."""
    status = engine_status(NAME, ctx.target)
    if status.installed is None:
        return None
    version = status.installed.version
    if not ctx.turing_relevant:
        return Check(CHECK, "ok", f"triton {version}: no Turing GPU here; the t4patch Triton set changes nothing "
                     "on compute capability >= 8.0")
    if status.overall == "applied":
        override = switch_check(os.environ.get(SWITCH), str(status.patch_set))
        return override or Check(CHECK, "ok", f"{status.patch_set} is applied: {MMA}; {SWITCH}=0 turns it off")
    if status.overall in ("not-applied", "partial"):
        return Check(CHECK, "warn", f"triton {version} is {status.overall}: {FMA}",
                     fix=suggest.command(ctx.target, "apply", str(status.patch_set)))
    if status.overall == "no-patch-set":
        versions = ", ".join(supported_versions(NAME))
        return Check(CHECK, "warn", f"triton {version} has no t4patch set (sets exist for {versions}): {FMA}",
                     fix=suggest.command(ctx.target, "list"))
    return Check(CHECK, "warn", f"triton {version}: {status.detail}", fix=suggest.command(ctx.target, "status",
                                                                                        NAME, "--check"))


def section(ctx: Context) -> DoctorSection | None:
    check = tensor_core_check(ctx)
    return None if check is None else DoctorSection(checks=(check,))
