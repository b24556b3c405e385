"""What a patched SGLang needs beside it on a Turing GPU, checked from files alone (for `t4patch doctor`).

The patched SGLang runs Marlin through a vLLM release's compiled kernels below compute capability 8.0; which
release, and which library of it, is the patch set's ``[[requires]]`` entry (data, read here). That only works
when that vLLM is installed in the same environment (with ``--no-deps``: the two pin different torch versions)
and its library really carries sm_75 Marlin machine code. Both are checked without importing anything:
metadata for versions, the CUDA fatbin of the library for the kernels (``cuobjdump`` cross-checks when it is
on PATH).
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field
from typing import Any

from packaging.requirements import Requirement

from t4patch.contract import Context, DoctorSection
from t4patch.cuda.arch import TURING
from t4patch.engines.requirements import companion
from t4patch.engines.vllm.marlin import LIBRARY as DEFAULT_LIBRARY  # where vLLM keeps it, when the manifest names none
from t4patch.environment.target import InstalledDistribution, TargetEnvironment
from t4patch.errors import T4PatchError
from t4patch.patching.companions import companion_gaps
from t4patch.patching.local_version import release_of
from t4patch.patching.manifest import Companion
from t4patch.readiness.model import requirement

COMPANION = "vllm"  # the engine whose compiled Marlin the patched SGLang calls below cc 8.0


@dataclass(frozen=True)
class SglangReadiness:
    sglang_version: str
    companion: Companion | None  # the vLLM release the installed SGLang's patch set requires
    vllm_version: str | None
    torch_version: str | None
    torch_pins: dict[str, str]  # distribution -> its torch requirement
    library: str | None
    sm75_marlin_kernels: int | None  # Marlin kernels with sm_75 SASS in vLLM's library
    sm75_repack_kernels: int | None
    cuobjdump_sm75_cubins: int | None  # cross-check, when cuobjdump is available
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "sglang_version": self.sglang_version,
            "vllm_version": self.vllm_version,
            "torch_version": self.torch_version,
            "torch_pins": self.torch_pins,
            "vllm_library": self.library,
            "sm75_marlin_kernels": self.sm75_marlin_kernels,
            "sm75_repack_kernels": self.sm75_repack_kernels,
            "cuobjdump_sm75_cubins": self.cuobjdump_sm75_cubins,
            "warnings": self.warnings,
        }


def torch_requirement(dist: InstalledDistribution) -> str | None:
    """The distribution's own `Requires-Dist: torch...` specifier (unconditional ones; "any" when unpinned)."""
    req = requirement(dist, "torch")
    return None if req is None else (str(req.specifier) or "any")


def cuobjdump_sm75_cubins(path: str) -> int | None:
    from t4patch.cuda.arch import parse_arch
    from t4patch.cuda.cuobjdump import list_code

    listing = list_code(path, ptx=False, timeout=300)
    return None if listing is None else listing.cubins_for(parse_arch(str(TURING)))


def check(target: TargetEnvironment) -> SglangReadiness | None:
    """None when SGLang is not installed in ``target``; otherwise what it has and lacks for Turing."""
    from t4patch.cuda.fatbin import cuda_architectures
    from t4patch.engines.vllm.readiness import sm75_kernel_counts

    sglang = target.find("sglang")
    if sglang is None:
        return None
    vllm = target.find(COMPANION)
    torch = target.find("torch")
    needs = companion("sglang", sglang.version, COMPANION)
    wanted = needs.version if needs else "?"
    warnings: list[str] = []
    pins = {d.name: pin for d in (sglang, vllm) if d is not None and (pin := torch_requirement(d))}
    library = gemm = repack = cross = None
    # the install command status --check and apply's warning print too (patching.companions): aimed at the
    # target (its interpreter's pip, or --target DIR), --no-deps (vLLM's own torch pin would replace SGLang's)
    gaps = companion_gaps([needs], target) if needs else []
    install_vllm = gaps[0].fix if gaps else f"{target.pip_install()} --no-deps vllm=={wanted}"
    if vllm is None:
        warnings.append(
            f"vLLM is not installed beside SGLang: below cc 8.0 patched SGLang runs Marlin through vLLM's "
            f"kernels; install it after SGLang: {install_vllm}"
        )
    elif release_of(vllm.version) != wanted:  # a `t4patch wheel` install is its release
        warnings.append(
            f"vLLM {vllm.version} is installed; the SGLang patch set calls vLLM {wanted}'s Marlin API: {install_vllm}"
        )
    if vllm is not None:
        so = vllm.root / ((needs.library if needs else None) or DEFAULT_LIBRARY)
        if not so.is_file():
            warnings.append(f"{so} is missing: reinstall with {vllm.reinstall_command()}")
        else:
            library = str(so)
            try:
                # decoded once and cached: the vLLM all-reduce check reads the same sm_75 kernels
                counts = sm75_kernel_counts(so)
                gemm, repack = counts["marlin_gemm"], counts["marlin_repack"]
            except T4PatchError as exc:
                # Without a zstd decoder the kernel names cannot be read; the entry headers still say
                # whether sm_75 machine code is there at all.
                try:
                    sm75 = cuda_architectures(so, decode=False).containers_by_sass.get(f"sm_{TURING}", 0)
                except T4PatchError:
                    sm75 = 0
                warnings.append(
                    f"could not list the kernels in {so} ({exc.message}); its fatbin has sm_75 SASS in {sm75} "
                    "containers; to check for Marlin specifically, give t4patch a zstd decoder: "
                    f"{shlex.quote(sys.executable)} -m pip install zstandard"
                )
            else:
                if not gemm or not repack:
                    warnings.append(
                        f"{so} has {gemm} sm_75 Marlin GEMM and {repack} repack kernels: this vLLM build cannot run "
                        f"Marlin on a T4; put the PyPI wheel back: {target.pip_install()} --force-reinstall --no-deps "
                        f"vllm=={wanted}"
                    )
            cross = cuobjdump_sm75_cubins(library)
    sglang_pin = pins.get("sglang")
    if torch is not None and sglang_pin and sglang_pin != "any":
        # vLLM's pin (torch==2.14.0) is expected to differ: it is installed with --no-deps and its compiled
        # library uses only torch's stable C ABI. SGLang's own pin is the one that must hold.
        if not Requirement(f"torch{sglang_pin}").specifier.contains(torch.version.split("+")[0], prereleases=True):
            warnings.append(
                f"torch {torch.version} does not satisfy SGLang's torch{sglang_pin}: install SGLang's torch "
                f"({target.pip_install()} {shlex.quote('torch' + sglang_pin)}); vLLM, installed with --no-deps, "
                "stays as it is"
            )
    elif torch is None:
        wanted_torch = "torch" + (sglang_pin if sglang_pin and sglang_pin != "any" else "")
        warnings.append(
            f"torch is not installed in this environment: {target.pip_install()} {shlex.quote(wanted_torch)} "
            "(SGLang's own pin)"
        )
    return SglangReadiness(
        sglang.version, needs, vllm.version if vllm else None, torch.version if torch else None, pins, library,
        gemm, repack, cross, warnings,
    )


def section(ctx: Context) -> DoctorSection | None:
    """Doctor's SGLang section: its block, its advice and its checks; None when SGLang is not installed."""
    from t4patch.engines.sglang.readiness import kernel_code

    ready = check(ctx.target)
    if ready is None:
        return None
    lines = [f"  vLLM beside it:   {ready.vllm_version or 'not installed'}"]
    if ready.library:
        cross = (
            f"; cuobjdump lists {ready.cuobjdump_sm75_cubins} sm_75 cubins"
            if ready.cuobjdump_sm75_cubins is not None
            else ""
        )
        lines.append(
            f"  vLLM library:     {ready.sm75_marlin_kernels} Marlin GEMM and {ready.sm75_repack_kernels} repack "
            f"kernels with sm_75 SASS{cross}"
        )
    pins = ", ".join(f"{name} torch{pin}" for name, pin in ready.torch_pins.items()) or "none"
    lines.append(f"  torch:            {ready.torch_version or 'not installed'} (pins: {pins})")
    wanted = ready.companion.version if ready.companion else "?"
    return DoctorSection(
        checks=(kernel_code(ctx),),
        title=f"SGLang {ready.sglang_version} on Turing (Marlin runs through vLLM {wanted}):",
        lines=tuple(lines),
        warnings=tuple(ready.warnings),
        data=ready.to_json(),
    )
