"""Which fatbin containers of a library lack code for the target, and whether that is a build problem.

A released engine library (not a t4patch build) often carries translation units compiled only for newer GPUs on
purpose: Hopper/Blackwell-specific ones (SASS for sm_90 and up only: wgmma, TMA) never run on a T4, and ones
built for sm_80..sm_89 but not sm_75 need Ampere features (bf16, ``cp.async``). Rebuilding for sm_75 changes
neither, so the advice for such a file is not "rebuild" but what the gaps are; this reads that from the fatbin
entry headers (one container per CUDA translation unit), never from a list of kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

from t4patch.cuda.fatbin import FatbinSummary

NEWEST_FAMILY = 90  # SASS only for this capability or newer: architecture-specific code


@dataclass(frozen=True)
class ContainerGaps:
    target: int
    containers: int
    with_target: int  # containers with target SASS
    ptx_only: int  # no target SASS, but PTX the driver can JIT for the target
    newer_only: int  # no target code, SASS only for sm_90+
    ampere_class: int  # no target code, SASS for sm_80..sm_89

    @property
    def only_architecture_specific(self) -> bool:
        """Every gap is code that needs a newer GPU by design (rebuilding for the target cannot add it): some
        translation units have target code, or the whole library is Hopper/Blackwell-only."""
        if self.ptx_only or not self.newer_only + self.ampere_class:
            return False
        return self.with_target > 0 or self.ampere_class == 0

    def summary(self) -> str:
        t = f"sm_{self.target}"
        return (
            f"{self.with_target} of {self.containers} translation units have {t} SASS"
            + (f"; {self.ptx_only} only PTX the driver compiles at first use" if self.ptx_only else "")
            + (f"; {self.newer_only} are built only for sm_90 or newer (Hopper/Blackwell-specific, never run on {t})"
               if self.newer_only else "")
            + (f"; {self.ampere_class} are built for sm_80..sm_89 but not {t} (they need Ampere features: a {t} "
               "GPU fails only if the engine selects one of them)" if self.ampere_class else "")
        )


def container_gaps(summary: FatbinSummary, target: int) -> ContainerGaps:
    sass: dict[int, set[int]] = {}
    ptx: dict[int, set[int]] = {}
    for entry in summary.entries:
        (sass if entry.kind == "sass" else ptx).setdefault(entry.container, set()).add(entry.arch)
    with_target = ptx_only = newer = ampere = 0
    for container in range(summary.containers):
        archs = sass.get(container, set())
        if target in archs:
            with_target += 1
        elif any(a <= target for a in ptx.get(container, set())):
            ptx_only += 1
        elif archs and min(archs) >= NEWEST_FAMILY:
            newer += 1
        else:
            ampere += 1
    return ContainerGaps(target, summary.containers, with_target, ptx_only, newer, ampere)


def advice(files: list[tuple[str, FatbinSummary]], target: int, rebuild: str | None) -> str:
    """The next step after a failed check: rebuild when t4patch built it (``rebuild``), otherwise say what the
    gaps of each file are, since a released library's architecture-specific code cannot be rebuilt away."""
    gaps = [(name, container_gaps(summary, target)) for name, summary in files if summary.containers]
    released = [f"{name}: {g.summary()}" for name, g in gaps if g.only_architecture_specific]
    if rebuild is not None and not released:
        return f"rebuild for this architecture: {rebuild}"
    if released and len(released) == len(gaps):
        return (
            "; ".join(released) + f". Nothing to rebuild: what has no sm_{target} code needs newer GPUs by design; "
            "check that the engine does not select it on this GPU: t4patch doctor, t4patch verify attention"
        )
    return (
        "; ".join(f"{name}: {g.summary()}" for name, g in gaps)
        + (f". Rebuild for this architecture: {rebuild}" if rebuild else
           f". Rebuild the project that produced it with sm_{target} in its CUDA architecture list")
    )
