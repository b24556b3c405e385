"""Which path a compiled Triton kernel's ``tl.dot`` took: tensor cores (``mma``) or fp32 FMA, read from its IR.

Below compute capability 8.0 stock Triton lowers every ``tl.dot`` to fp32 FMA (AccelerateMatmul returns early:
triton-lang/triton#5066); t4patch's Triton set puts fp16 x fp16 dots of sm_75 back on ``mma.sync m16n8k8``. What
ran is read from three texts Triton writes for every compile, never inferred from versions or settings:

- TTIR (before any GPU lowering): each ``tt.dot`` with the element types the kernel author wrote. The FMA path
  widens fp16 operands to fp32 in TTGIR, so only TTIR still says a dot was fp16 x fp16.
- TTGIR (after AccelerateMatmul): each dot's result encoding; an ``#ttg.nvidia_mma`` parent (or a Hopper /
  Blackwell tensor-core op) is the tensor-core path, a blocked layout is FMA.
- PTX: the instructions that ran, counted: ``mma.sync`` (tensor cores, Ampere/Turing forms) and ``fma.rn.f32``
  (the FMA path's inner product, plus any scalar fp32 FMA the kernel has anyway: softmax, rescaling).

Pure text functions, so they are tested on synthetic IR without torch, Triton or a compile.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# One dot in TTIR: `tt.dot %a, %b, %c ... : tensor<16x512xf16> * tensor<512x16xf16> -> tensor<16x16xf32>`.
_TTIR_DOT = re.compile(r"\btt\.dot\s[^\n]*?:\s*tensor<([^>]*)>\s*\*\s*tensor<([^>]*)>\s*->\s*tensor<([^>]*)>")
# One dot in TTGIR: the result type's encoding, an alias (`#mma`, `#blocked2`) or an inline attribute.
_TTGIR_DOT = re.compile(r"\btt\.dot\s[^\n]*->\s*tensor<[^,>]*,\s*(#[\w.]+)")
# Tensor-core dots of later GPUs have their own ops (wgmma on sm_90, tcgen05 on sm_100): never the FMA path.
_TTGIR_TC_OPS = re.compile(r"\bttng\.(warp_group_dot|tc_gen5_mma)\b")
_ALIAS = re.compile(r"^\s*(#[\w.]+)\s*=\s*(#[\w.]+)", re.MULTILINE)
_MMA_SYNC = re.compile(r"^\s*(?:@%?\w+\s+)?mma\.sync\.", re.MULTILINE)
_FMA_F32 = re.compile(r"^\s*(?:@%?\w+\s+)?fma\.rn\.f32\s", re.MULTILINE)
_TENSOR_CORE_ENCODINGS = ("#ttg.nvidia_mma",)

# Paths a launch is reported on.
PATH_MMA = "mma"  # every dot on tensor cores
PATH_FMA = "fma"  # every dot on fp32 FMA
PATH_MIXED = "mixed"  # some of each
PATH_NONE = "none"  # the kernel has no dot (reductions, copies)


@dataclass(frozen=True)
class Dot:
    """One ``tt.dot`` of a kernel: operand and accumulator element types (TTIR) and whether it is on tensor cores."""

    a: str
    b: str
    acc: str
    tensor_cores: bool | None  # None: the TTGIR did not say (missing, or fewer dots than TTIR)

    @property
    def fp16(self) -> bool:
        return self.a == "f16" and self.b == "f16"

    def to_json(self) -> dict[str, object]:
        return {"a": self.a, "b": self.b, "acc": self.acc, "tensor_cores": self.tensor_cores}


@dataclass(frozen=True)
class KernelPath:
    """What one compiled kernel's dots ran on, and the instruction counts that show it."""

    dots: tuple[Dot, ...]
    mma_sync: int | None  # PTX `mma.sync` instructions; None without PTX
    fma_f32: int | None  # PTX `fma.rn.f32` instructions; None without PTX

    @property
    def path(self) -> str | None:
        """mma / fma / mixed / none; None when the IR needed to tell is missing."""
        if not self.dots:
            return PATH_NONE
        seen = {d.tensor_cores for d in self.dots}
        if None in seen:
            return None
        if seen == {True}:
            return PATH_MMA
        if seen == {False}:
            return PATH_FMA
        return PATH_MIXED

    @property
    def fp16_dots_on_fma(self) -> int:
        """fp16 x fp16 dots that did not reach tensor cores (unknown counts as not reached: nothing proves it)."""
        return sum(1 for d in self.dots if d.fp16 and d.tensor_cores is not True)

    @property
    def has_fp16_dot(self) -> bool:
        return any(d.fp16 for d in self.dots)

    def to_json(self) -> dict[str, object]:
        return {
            "dot_path": self.path,
            "mma_sync": self.mma_sync,
            "fma_rn_f32": self.fma_f32,
            "dots": [d.to_json() for d in self.dots],
        }


def element_type(tensor_type: str) -> str:
    """``16x512xf16`` (or ``16x512xf16, #enc``) -> ``f16``: the element type of an MLIR ranked tensor type."""
    shape = tensor_type.split(",", 1)[0].strip()
    return shape.rsplit("x", 1)[-1]


def ttir_dots(ttir: str) -> list[tuple[str, str, str]]:
    """(a, b, acc) element types of every ``tt.dot`` in TTIR, in order."""
    return [(element_type(a), element_type(b), element_type(c)) for a, b, c in _TTIR_DOT.findall(ttir)]


def ttgir_dot_on_tensor_cores(ttgir: str) -> list[bool]:
    """Per dot of TTGIR, in order: is its result in a tensor-core (MMA) encoding?"""
    aliases = dict(_ALIAS.findall(ttgir))
    found = []
    for line in ttgir.splitlines():
        if _TTGIR_TC_OPS.search(line):
            found.append(True)
            continue
        match = _TTGIR_DOT.search(line)
        if not match:
            continue
        encoding: str = aliases.get(match.group(1)) or match.group(1)
        found.append(encoding.startswith(_TENSOR_CORE_ENCODINGS))
    return found


def count_mma_sync(ptx: str) -> int:
    return len(_MMA_SYNC.findall(ptx))


def count_fma_f32(ptx: str) -> int:
    return len(_FMA_F32.findall(ptx))


def analyse(ttir: str | None, ttgir: str | None, ptx: str | None) -> KernelPath:
    """The dots of one compile and the instruction counts of its PTX (any text may be missing: None)."""
    types = ttir_dots(ttir) if ttir is not None else []
    cores: list[bool] = ttgir_dot_on_tensor_cores(ttgir) if ttgir is not None else []
    if ttir is None and cores:  # no TTIR: the dots are known from TTGIR, their types are not
        types = [("?", "?", "?")] * len(cores)
    # Passes before TTGIR do not add or drop dots on the sm_7x/sm_8x pipelines; if the counts ever disagree,
    # nothing is claimed about any dot.
    matched = len(cores) == len(types)
    dots = tuple(
        Dot(a=a, b=b, acc=acc, tensor_cores=cores[i] if matched else None) for i, (a, b, acc) in enumerate(types)
    )
    return KernelPath(
        dots=dots,
        mma_sync=count_mma_sync(ptx) if ptx is not None else None,
        fma_f32=count_fma_f32(ptx) if ptx is not None else None,
    )
