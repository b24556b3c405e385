"""GPU architectures: the one ``Arch`` type, read from the GPU table ``hardware/gpu-archs.toml``.

Every place that names an architecture (``verify attention --arch``, ``build --arch``, ``verify build --arch``,
the artifact check, the build benchmark) takes an :class:`Arch` from here, so "sm_75" is spelled in one way in
the code and a new architecture is one table entry. User input goes through :func:`parse_arch` (or
:func:`parse_build_target` where a CPU-only build is allowed): ``75``, ``sm_75``, ``sm75``, ``7.5`` and
``compute_75`` all name the same entry; anything else is one UsageError listing the known architectures.

The table is read by the strict data reader (unknown keys and wrong types refused, :class:`DataFileError`)
and checked on load (names ``sm_<major><minor>``, capability matching the name, warp size 32, a plausible
shared-memory limit): a typo in a limit would silently turn a misfit into a pass.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

from t4patch.data.locations import data_dir
from t4patch.data.reader import DataKind, Int, ListOf, MapOf, Str, Table, read
from t4patch.errors import DataFileError, UsageError

SCHEMA_VERSION = 1
ARCHS_FILE = "gpu-archs.toml"
CPU_WORD = "cpu"  # the user's word for "no GPU code" (build --arch cpu); never an Arch
# Turing (Tesla T4): the architecture t4patch exists for, as a compute capability and as its sm number
TURING_CAPABILITY = (7, 5)
TURING = TURING_CAPABILITY[0] * 10 + TURING_CAPABILITY[1]  # 75, as in sm_75 and the fatbin entry headers
_ARCH_NAME = re.compile(r"^sm_(?P<major>\d)(?P<minor>\d)$")
# "75", "sm_75", "sm75", "compute_75", "7.5" (case and surrounding space ignored)
_USER_SPELLING = re.compile(r"^(?:sm_?|compute_)?(?P<major>\d)\.?(?P<minor>\d)$")


@dataclass(frozen=True)
class Arch:
    """One GPU architecture as a compile target and its launch limit."""

    name: str  # "sm_75"
    major: int
    minor: int
    warp_size: int
    shared_limit: int  # bytes: shared_memory_per_block_optin
    gpus: str

    @property
    def capability(self) -> int:
        """75 for sm_75: the number nvcc, CMake (CMAKE_CUDA_ARCHITECTURES) and cargo (CUDA_COMPUTE_CAP) take."""
        return self.major * 10 + self.minor

    @property
    def digits(self) -> str:
        """"75": the capability as the text build tools are given."""
        return str(self.capability)

    @property
    def dotted(self) -> str:
        """"7.5": how NVIDIA's tables and torch.cuda write a compute capability."""
        return f"{self.major}.{self.minor}"

    @property
    def pair(self) -> tuple[int, int]:
        return (self.major, self.minor)

    @property
    def sass(self) -> str:
        """"sm_75": the name of this architecture's machine code in a fatbin."""
        return self.name

    @property
    def ptx(self) -> str:
        """"compute_75": the name of this architecture's PTX in a fatbin."""
        return f"compute_{self.capability}"

    def __str__(self) -> str:
        return self.name

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "capability": [self.major, self.minor],
            "warp_size": self.warp_size,
            "shared_memory_per_block_optin": self.shared_limit,
            "gpus": self.gpus,
        }


GPU_TABLE = DataKind(
    label="GPU architecture table",
    error=DataFileError,
)
_SCHEMA = Table({
    "schema": Int(),
    "arch": MapOf(Table({
        "capability": ListOf(Int()),
        "warp_size": Int(),
        "shared_memory_per_block_optin": Int(),
        "gpus": Str(),
    }), nonempty=True),
})


def load_archs(path: Path | None = None) -> dict[str, Arch]:
    """All architectures of the GPU table (default: the shipped ``hardware/gpu-archs.toml``), by name."""
    if path is None:
        return dict(_shipped_archs())
    return _load(path)


@functools.lru_cache(maxsize=1)
def _shipped_archs() -> tuple[tuple[str, Arch], ...]:
    return tuple(_load(data_dir("hardware") / ARCHS_FILE).items())


def _load(path: Path) -> dict[str, Arch]:
    """Read and check the table: keys and types by the strict reader, then the facts each entry must obey."""
    data = read(path, _SCHEMA, GPU_TABLE, version=SCHEMA_VERSION)
    archs: dict[str, Arch] = {}
    for name, entry in data["arch"].items():
        match = _ARCH_NAME.match(name)
        if not match:
            raise GPU_TABLE.fail(path, f"arch.{name}: expected a table named sm_<major><minor>")
        major, minor = int(match["major"]), int(match["minor"])
        if entry["capability"] != [major, minor]:
            raise GPU_TABLE.fail(path, f"arch.{name}.capability: expected [{major}, {minor}], "
                                       f"found {entry['capability']!r}")
        if entry["warp_size"] != 32:
            raise GPU_TABLE.fail(path, f"arch.{name}.warp_size: expected 32 (every NVIDIA architecture), "
                                       f"found {entry['warp_size']}")
        shared = entry["shared_memory_per_block_optin"]
        if shared < 49152:  # every architecture since sm_30 gives a block at least 48 KiB
            raise GPU_TABLE.fail(path, f"arch.{name}.shared_memory_per_block_optin: expected an integer >= 49152 "
                                       f"(bytes), found {shared}")
        archs[name] = Arch(name=name, major=major, minor=minor, warp_size=32, shared_limit=shared,
                           gpus=entry["gpus"])
    return archs


def _unknown(text: str, archs: dict[str, Arch], option: str, allow_cpu: bool) -> UsageError:
    known = ", ".join(sorted(archs, key=lambda n: archs[n].capability)) + (f" or {CPU_WORD}" if allow_cpu else "")
    return UsageError(
        f"{option} {text.strip() or repr(text)}: expected one of {known} (also written 75 or 7.5), "
        "found no such architecture",
        hint=f"pass e.g. {option} sm_75 (Tesla T4); add an architecture to hardware/{ARCHS_FILE}",
    )


def parse_arch(text: str, *, archs: dict[str, Arch] | None = None, option: str = "--arch") -> Arch:
    """User input -> Arch: ``sm_75``, ``sm75``, ``75``, ``7.5`` or ``compute_75``; UsageError for anything else."""
    archs = archs if archs is not None else load_archs()
    match = _USER_SPELLING.match(text.strip().lower())
    name = f"sm_{match['major']}{match['minor']}" if match else None
    if name is None or name not in archs:
        raise _unknown(text, archs, option, allow_cpu=False)
    return archs[name]


def parse_build_target(text: str, *, archs: dict[str, Arch] | None = None, option: str = "--arch") -> Arch | None:
    """Like :func:`parse_arch`, and ``cpu`` is allowed: None means a CPU-only build (no GPU code)."""
    archs = archs if archs is not None else load_archs()
    if text.strip().lower() == CPU_WORD:
        return None
    try:
        return parse_arch(text, archs=archs, option=option)
    except UsageError:
        raise _unknown(text, archs, option, allow_cpu=True) from None


def arch_for_capability(major: int, minor: int, archs: dict[str, Arch] | None = None) -> Arch | None:
    """The table's entry for a compute capability a GPU reported, or None when the table lacks it."""
    archs = archs if archs is not None else load_archs()
    return archs.get(f"sm_{major}{minor}")
