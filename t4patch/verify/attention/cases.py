"""The data `verify attention` runs on: GPU architecture limits and the per-engine case table.

Both are shipped TOML (``verify/gpu-archs.toml``, ``verify/attention-cases.toml``) so a new architecture or a
new engine version is a data change, and both are validated here on load: a typo in a limit would silently
turn a misfit into a pass, which is exactly what this command exists to prevent.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from t4patch.data.locations import data_dir
from t4patch.data.tomlcompat import tomllib
from t4patch.errors import PatchSetError, UsageError

SCHEMA_VERSION = 1
ARCHS_FILE = "gpu-archs.toml"
CASES_FILE = "attention-cases.toml"
DRIVERS = ("vllm-unified-attention", "sglang-triton-attention")
PHASES = ("prefill", "decode")
_ARCH_NAME = re.compile(r"^sm_(?P<major>\d)(?P<minor>\d)$")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
_DTYPES = ("float16", "bfloat16", "float32")


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
        return self.major * 10 + self.minor

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "capability": [self.major, self.minor],
            "warp_size": self.warp_size,
            "shared_memory_per_block_optin": self.shared_limit,
            "gpus": self.gpus,
        }


@dataclass(frozen=True)
class Layer:
    name: str
    head_size: int
    sliding_window: int  # 0: none


@dataclass(frozen=True)
class Model:
    name: str
    num_query_heads: int
    num_kv_heads: int
    dtype: str
    kv_block_size: int
    layers: tuple[Layer, ...]

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "num_query_heads": self.num_query_heads,
            "num_kv_heads": self.num_kv_heads,
            "dtype": self.dtype,
            "kv_block_size": self.kv_block_size,
            "layers": [
                {"name": l.name, "head_size": l.head_size, "sliding_window": l.sliding_window} for l in self.layers
            ],
        }


@dataclass(frozen=True)
class Case:
    name: str
    phase: str  # "prefill" | "decode"
    num_seqs: int
    query_len: int
    context_len: int
    path: str  # the code path the engine must take

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "phase": self.phase,
            "num_seqs": self.num_seqs,
            "query_len": self.query_len,
            "context_len": self.context_len,
            "path": self.path,
        }


@dataclass(frozen=True)
class EngineCases:
    """How to drive one engine's attention launcher and which cases to feed it."""

    key: str  # table name, e.g. "vllm"
    distribution: str
    versions: tuple[str, ...]
    driver: str
    triton_series: str  # "3.8": the Triton the engine's pinned torch requires
    files: tuple[str, ...]  # launcher files (relative to site-packages) whose sha256 the report records
    kernel_tiles: dict[str, tuple[str, ...]]  # kernel name -> constexprs to report as its tiles
    cases: tuple[Case, ...]
    settings: dict[str, int]  # driver-specific integers (max_num_seqs, max_kv_splits)


@dataclass(frozen=True)
class CaseTable:
    model: Model
    engines: tuple[EngineCases, ...]

    def engine(self, key: str) -> EngineCases | None:
        for engine in self.engines:
            if engine.key == key:
                return engine
        return None


def _fail(path: Path, problem: str) -> PatchSetError:
    return PatchSetError(
        f"{path}: {problem}",
        hint="this shipped data file is broken; reinstall t4patch (pip install --force-reinstall t4patch)",
    )


def _read(path: Path) -> dict[str, object]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise _fail(path, "expected a TOML file, found nothing") from None
    except tomllib.TOMLDecodeError as exc:
        raise _fail(path, f"expected valid TOML, found a syntax error ({exc})") from None
    if data.get("schema") != SCHEMA_VERSION:
        raise _fail(path, f"expected schema = {SCHEMA_VERSION}, found {data.get('schema')!r}")
    return data


def _int(table: dict[str, object], key: str, path: Path, where: str, minimum: int = 1) -> int:
    value = table.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise _fail(path, f"{where}.{key}: expected an integer >= {minimum}, found {value!r}")
    return value


def _str(table: dict[str, object], key: str, path: Path, where: str) -> str:
    value = table.get(key)
    if not isinstance(value, str) or not value.strip():
        raise _fail(path, f"{where}.{key}: expected a non-empty string, found {value!r}")
    return value


def load_archs(path: Path | None = None) -> dict[str, Arch]:
    """All architectures of ``gpu-archs.toml``, by name."""
    path = path or data_dir("verify") / ARCHS_FILE
    data = _read(path)
    table = data.get("arch")
    if not isinstance(table, dict) or not table:
        raise _fail(path, "expected [arch.sm_XY] tables, found none")
    archs: dict[str, Arch] = {}
    for name, entry in table.items():
        match = _ARCH_NAME.match(name)
        if not match or not isinstance(entry, dict):
            raise _fail(path, f"arch {name!r}: expected a table named sm_<major><minor>")
        cap = entry.get("capability")
        major, minor = int(match["major"]), int(match["minor"])
        if cap != [major, minor]:
            raise _fail(path, f"arch.{name}.capability: expected [{major}, {minor}], found {cap!r}")
        warp = _int(entry, "warp_size", path, f"arch.{name}")
        if warp != 32:
            raise _fail(path, f"arch.{name}.warp_size: expected 32 (every NVIDIA architecture), found {warp}")
        archs[name] = Arch(
            name=name,
            major=major,
            minor=minor,
            warp_size=warp,
            shared_limit=_int(entry, "shared_memory_per_block_optin", path, f"arch.{name}", minimum=49152),
            gpus=_str(entry, "gpus", path, f"arch.{name}"),
        )
    return archs


def resolve_arch(text: str, archs: dict[str, Arch] | None = None) -> Arch:
    """``--arch`` value -> Arch; accepts ``sm_75``, ``sm75``, ``75`` and ``7.5``."""
    archs = archs if archs is not None else load_archs()
    cleaned = text.strip().lower().replace("sm_", "").replace("sm", "").replace(".", "")
    name = f"sm_{cleaned}"
    if name not in archs:
        raise UsageError(
            f"--arch {text}: expected one of {', '.join(sorted(archs))}, found no such architecture",
            hint="pass e.g. --arch sm_75 (Tesla T4) or --arch sm_80 (A100)",
        )
    return archs[name]


def load_cases(path: Path | None = None) -> CaseTable:
    """The case table of ``attention-cases.toml``, validated."""
    path = path or data_dir("verify") / CASES_FILE
    data = _read(path)
    model = _load_model(data, path)
    engines_table = data.get("engine")
    if not isinstance(engines_table, dict) or not engines_table:
        raise _fail(path, "expected [engine.<name>] tables, found none")
    engines = tuple(_load_engine(key, entry, model, path) for key, entry in engines_table.items())
    return CaseTable(model=model, engines=engines)


def _load_model(data: dict[str, object], path: Path) -> Model:
    table = data.get("model")
    if not isinstance(table, dict):
        raise _fail(path, "expected a [model] table, found none")
    dtype = _str(table, "dtype", path, "model")
    if dtype not in _DTYPES:
        raise _fail(path, f"model.dtype: expected one of {', '.join(_DTYPES)}, found {dtype!r}")
    raw_layers = data.get("layer")
    if not isinstance(raw_layers, list) or not raw_layers:
        raise _fail(path, "expected [[layer]] entries, found none")
    layers = []
    for i, entry in enumerate(raw_layers):
        where = f"layer[{i}]"
        name = _str(entry, "name", path, where)
        if not _NAME.match(name) or any(l.name == name for l in layers):
            raise _fail(path, f"{where}.name: expected a unique lowercase name, found {name!r}")
        layers.append(
            Layer(
                name=name,
                head_size=_int(entry, "head_size", path, where, minimum=16),
                sliding_window=_int(entry, "sliding_window", path, where, minimum=0),
            )
        )
    heads = _int(table, "num_query_heads", path, "model")
    kv_heads = _int(table, "num_kv_heads", path, "model")
    if heads % kv_heads:
        raise _fail(path, f"model: num_query_heads {heads} is not a multiple of num_kv_heads {kv_heads}")
    block = _int(table, "kv_block_size", path, "model")
    if block % 16:
        raise _fail(path, f"model.kv_block_size: expected a multiple of 16, found {block}")
    return Model(
        name=_str(table, "name", path, "model"),
        num_query_heads=heads,
        num_kv_heads=kv_heads,
        dtype=dtype,
        kv_block_size=block,
        layers=tuple(layers),
    )


def _load_engine(key: str, entry: object, model: Model, path: Path) -> EngineCases:
    where = f"engine.{key}"
    if not isinstance(entry, dict):
        raise _fail(path, f"{where}: expected a table")
    driver = _str(entry, "driver", path, where)
    if driver not in DRIVERS:
        raise _fail(path, f"{where}.driver: expected one of {', '.join(DRIVERS)}, found {driver!r}")
    versions = entry.get("versions")
    if not isinstance(versions, list) or not versions or not all(isinstance(v, str) for v in versions):
        raise _fail(path, f"{where}.versions: expected a list of version strings, found {versions!r}")
    series = _str(entry, "triton", path, where)
    if not re.match(r"^\d+\.\d+$", series):
        raise _fail(path, f"{where}.triton: expected a major.minor series like \"3.8\", found {series!r}")
    files = entry.get("files")
    if not isinstance(files, list) or not files or not all(isinstance(f, str) and f.endswith(".py") for f in files):
        raise _fail(path, f"{where}.files: expected a list of .py paths, found {files!r}")
    for f in files:
        if f.startswith("/") or ".." in Path(f).parts:
            raise _fail(path, f"{where}.files: expected paths relative to site-packages, found {f!r}")
    kernels = entry.get("kernel")
    if not isinstance(kernels, dict) or not kernels:
        raise _fail(path, f"{where}: expected [{where}.kernel.<name>] tables, found none")
    kernel_tiles: dict[str, tuple[str, ...]] = {}
    for name, table in kernels.items():
        tiles = table.get("tiles") if isinstance(table, dict) else None
        if not isinstance(tiles, list) or not tiles or not all(isinstance(t, str) for t in tiles):
            raise _fail(path, f"{where}.kernel.{name}.tiles: expected a list of constexpr names, found {tiles!r}")
        kernel_tiles[name] = tuple(tiles)
    raw_cases = entry.get("case")
    if not isinstance(raw_cases, list) or not raw_cases:
        raise _fail(path, f"{where}: expected [[{where}.case]] entries, found none")
    cases: list[Case] = []
    for i, raw in enumerate(raw_cases):
        cwhere = f"{where}.case[{i}]"
        name = _str(raw, "name", path, cwhere)
        if not _NAME.match(name) or any(c.name == name for c in cases):
            raise _fail(path, f"{cwhere}.name: expected a unique lowercase name, found {name!r}")
        phase = _str(raw, "phase", path, cwhere)
        if phase not in PHASES:
            raise _fail(path, f"{cwhere}.phase: expected one of {', '.join(PHASES)}, found {phase!r}")
        case = Case(
            name=name,
            phase=phase,
            num_seqs=_int(raw, "num_seqs", path, cwhere),
            query_len=_int(raw, "query_len", path, cwhere),
            context_len=_int(raw, "context_len", path, cwhere),
            path=_str(raw, "path", path, cwhere),
        )
        if case.phase == "decode" and case.query_len != 1:
            raise _fail(path, f"{cwhere}: a decode case has query_len 1, found {case.query_len}")
        if case.context_len < case.query_len:
            raise _fail(path, f"{cwhere}: context_len {case.context_len} < query_len {case.query_len}")
        cases.append(case)
    settings = {
        k: v for k, v in entry.items() if isinstance(v, int) and not isinstance(v, bool)
    }
    return EngineCases(
        key=key,
        distribution=_str(entry, "distribution", path, where),
        versions=tuple(versions),
        driver=driver,
        triton_series=series,
        files=tuple(files),
        kernel_tiles=kernel_tiles,
        cases=tuple(cases),
        settings=settings,
    )
