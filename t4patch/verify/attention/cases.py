"""The data `verify attention` runs on: GPU architecture limits and the per-engine case table.

Both are shipped TOML (``hardware/gpu-archs.toml``, read by :mod:`t4patch.cuda.arch`, which owns the ``Arch``
type; ``cases/attention-cases.toml`` here) so a new architecture or a new engine version is a data change,
and both are validated on load: a typo in a limit would silently
turn a misfit into a pass, which is exactly what this command exists to prevent.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from t4patch.cuda.arch import Arch as Arch  # re-exported: the Arch type lives in t4patch.cuda.arch
from t4patch.cuda.arch import load_archs as load_archs
from t4patch.cuda.arch import parse_arch
from t4patch.data.locations import data_dir
from t4patch.data.reader import DataKind, Int, ListOf, MapOf, Str, Table, optional, read
from t4patch.errors import DataFileError, T4PatchError

SCHEMA_VERSION = 1
CASES_FILE = "attention-cases.toml"
PHASES = ("prefill", "decode")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
_DTYPES = ("float16", "bfloat16", "float32")


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
    kv_cache_dtype: str = "auto"  # the engine's --kv-cache-dtype; which values a driver takes: its module
    # A RuntimeError whose message starts with this is the (patched) engine refusing a launch that cannot fit,
    # clearly and before Triton would: reported as REFUSED, not as a failure. "" accepts no refusal.
    accepted_refusal: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "phase": self.phase,
            "num_seqs": self.num_seqs,
            "query_len": self.query_len,
            "context_len": self.context_len,
            "path": self.path,
            # only when set: reports of the default-dtype cases stay as they were
            **({"kv_cache_dtype": self.kv_cache_dtype} if self.kv_cache_dtype != "auto" else {}),
            **({"accepted_refusal": self.accepted_refusal} if self.accepted_refusal else {}),
        }


@dataclass(frozen=True)
class EngineCases:
    """How to drive one engine's attention launcher and which cases to feed it."""

    key: str  # table name, e.g. "vllm"
    distribution: str
    versions: tuple[str, ...]
    driver: str
    triton_series: str  # "3.8": the Triton the engine's pinned torch requires (see for_version)
    files: tuple[str, ...]  # launcher files (relative to site-packages) whose sha256 the report records
    kernel_tiles: dict[str, tuple[str, ...]]  # kernel name -> constexprs to report as its tiles
    cases: tuple[Case, ...]
    settings: dict[str, int]  # driver-specific integers (max_num_seqs, max_kv_splits)
    triton_by_version: dict[str, str] = field(default_factory=dict)  # releases whose torch pins another Triton
    # the driver's "module:Class" from the engine table the caller handed to load_cases (None: not given);
    # the worker imports it in the target's interpreter
    driver_class: str | None = None

    def for_version(self, version: str) -> EngineCases:
        """These cases for one installed release: ``triton_series`` becomes the series that release's torch pins."""
        return replace(self, triton_series=self.triton_by_version.get(version, self.triton_series))


@dataclass(frozen=True)
class Compiler:
    """The compiler every case is compiled with, and how its t4patch set is switched back to stock.

    ``stock_env``: environment variables under which a compiler with t4patch's set applied compiles exactly as
    the stock release does (the set's own off switch); verify attention compiles each launch a second time with
    them, so the report shows stock and patched side by side from one installed compiler.
    """

    distribution: str
    stock_env: dict[str, str]
    mma_archs: tuple[str, ...] = ()  # where the set puts fp16 dots on tensor cores ("sm_75")

    def to_json(self) -> dict[str, object]:
        return {"distribution": self.distribution, "stock_env": dict(self.stock_env), "mma_archs": list(self.mma_archs)}


@dataclass(frozen=True)
class CaseTable:
    model: Model
    engines: tuple[EngineCases, ...]
    compiler: Compiler | None = None

    def engine(self, key: str) -> EngineCases | None:
        for engine in self.engines:
            if engine.key == key:
                return engine
        return None


CASE_TABLE = DataKind(
    label="attention case table",
    error=DataFileError,
)

# The case table, stated once; the strict reader refuses unknown keys, wrong types and missing keys.
CASES_SCHEMA = Table(
    {
        "schema": Int(),
        # the compiler (Triton) and the environment that switches its t4patch set off (see Compiler)
        "compiler": optional(
            Table(
                {
                    "distribution": Str(),
                    "stock_env": MapOf(Str(), nonempty=True),
                    "mma_archs": ListOf(Str(), nonempty=True),
                }
            )
        ),
        "model": Table(
            {"name": Str(), "num_query_heads": Int(), "num_kv_heads": Int(), "dtype": Str(), "kv_block_size": Int()}
        ),
        "layer": ListOf(Table({"name": Str(), "head_size": Int(), "sliding_window": Int()}), nonempty=True),
        "engine": MapOf(
            Table(
                {
                    "distribution": Str(),
                    "versions": ListOf(Str(), nonempty=True),
                    "driver": Str(),
                    "triton": Str(),
                    # release -> Triton series, for releases whose pinned torch requires another one
                    "triton_by_version": optional(MapOf(Str())),
                    "files": ListOf(Str(), nonempty=True),
                    # driver settings (integers); which driver reads which: t4patch/engines/<engine>/attention.py
                    "max_num_seqs": optional(Int()),
                    "max_kv_splits": optional(Int()),
                    "kernel": MapOf(Table({"tiles": ListOf(Str(), nonempty=True)}), nonempty=True),
                    "case": ListOf(
                        Table(
                            {
                                "name": Str(),
                                "phase": Str(),
                                "num_seqs": Int(),
                                "query_len": Int(),
                                "context_len": Int(),
                                "path": Str(),
                                # --kv-cache-dtype of the launch (default "auto"); the driver refuses others
                                "kv_cache_dtype": optional(Str()),
                                # start of the clear RuntimeError a patched launcher raises instead of a misfit
                                "accepted_refusal": optional(Str()),
                            }
                        ),
                        nonempty=True,
                    ),
                }
            ),
            nonempty=True,
        ),
    }
)
_SETTINGS = ("max_num_seqs", "max_kv_splits")


def _fail(path: Path, problem: str) -> T4PatchError:
    return CASE_TABLE.fail(path, problem)


def _int(table: dict[str, Any], key: str, path: Path, where: str, minimum: int = 1) -> int:
    value: int = table[key]  # an integer: the schema checked it
    if value < minimum:
        raise _fail(path, f"{where}.{key}: expected an integer >= {minimum}, found {value!r}")
    return value


def resolve_arch(text: str, archs: dict[str, Arch] | None = None) -> Arch:
    """``--arch`` value -> Arch (:func:`t4patch.cuda.arch.parse_arch`)."""
    return parse_arch(text, archs=archs)


def load_cases(path: Path | None = None, drivers: Mapping[str, str] | None = None) -> CaseTable:
    """The case table of ``attention-cases.toml``, validated.

    ``drivers``: the engines' drivers (name -> "module:Class", ``EngineTable.attention_drivers()``, handed in
    by the command); each engine entry must name one of them, and carries its class for the worker. Without
    it the names are checked for form only, and the table can be read but not run.
    """
    path = path or data_dir("cases") / CASES_FILE
    data = read(path, CASES_SCHEMA, CASE_TABLE, version=SCHEMA_VERSION)
    model = _load_model(data, path)
    engines = tuple(_load_engine(key, entry, model, path, drivers) for key, entry in data["engine"].items())
    return CaseTable(model=model, engines=engines, compiler=_load_compiler(data, path))


def _load_compiler(data: dict[str, Any], path: Path) -> Compiler | None:
    table = data.get("compiler")
    if table is None:
        return None
    for name in table["stock_env"]:
        if not re.match(r"^[A-Z][A-Z0-9_]*$", name):
            raise _fail(path, f"compiler.stock_env: expected environment variable names like T4PATCH_X, found {name!r}")
    for arch in table["mma_archs"]:
        if not re.match(r"^sm_\d+$", arch):
            raise _fail(path, f"compiler.mma_archs: expected architecture names like \"sm_75\", found {arch!r}")
    return Compiler(distribution=table["distribution"], stock_env=dict(table["stock_env"]),
                    mma_archs=tuple(table["mma_archs"]))


def _load_model(data: dict[str, Any], path: Path) -> Model:
    table = data["model"]
    dtype = table["dtype"]
    if dtype not in _DTYPES:
        raise _fail(path, f"model.dtype: expected one of {', '.join(_DTYPES)}, found {dtype!r}")
    layers: list[Layer] = []
    for i, entry in enumerate(data["layer"], start=1):
        where = f"layer[{i}]"
        name = entry["name"]
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
        name=table["name"],
        num_query_heads=heads,
        num_kv_heads=kv_heads,
        dtype=dtype,
        kv_block_size=block,
        layers=tuple(layers),
    )


def _load_engine(
    key: str, entry: dict[str, Any], model: Model, path: Path, drivers: Mapping[str, str] | None
) -> EngineCases:
    where = f"engine.{key}"
    driver = entry["driver"]
    if drivers is not None and driver not in drivers:
        raise _fail(path, f"{where}.driver: expected one of {', '.join(drivers)}, found {driver!r}")
    if not _NAME.match(driver):
        raise _fail(path, f"{where}.driver: expected a lowercase driver name, found {driver!r}")
    series = entry["triton"]
    if not re.match(r"^\d+\.\d+$", series):
        raise _fail(path, f"{where}.triton: expected a major.minor series like \"3.8\", found {series!r}")
    by_version = dict(entry.get("triton_by_version", {}))
    for version, other in by_version.items():
        if version not in entry["versions"] or not re.match(r"^\d+\.\d+$", other):
            raise _fail(path, f"{where}.triton_by_version.{version}: expected a listed version and a series like "
                              f"\"3.7\", found {version!r} = {other!r}")
    files = entry["files"]
    for f in files:
        if not f.endswith(".py"):
            raise _fail(path, f"{where}.files: expected a list of .py paths, found {f!r}")
        if f.startswith("/") or ".." in Path(f).parts:
            raise _fail(path, f"{where}.files: expected paths relative to site-packages, found {f!r}")
    kernel_tiles = {name: tuple(table["tiles"]) for name, table in entry["kernel"].items()}
    cases: list[Case] = []
    for i, raw in enumerate(entry["case"], start=1):
        cwhere = f"{where}.case[{i}]"
        name = raw["name"]
        if not _NAME.match(name) or any(c.name == name for c in cases):
            raise _fail(path, f"{cwhere}.name: expected a unique lowercase name, found {name!r}")
        phase = raw["phase"]
        if phase not in PHASES:
            raise _fail(path, f"{cwhere}.phase: expected one of {', '.join(PHASES)}, found {phase!r}")
        case = Case(
            name=name,
            phase=phase,
            num_seqs=_int(raw, "num_seqs", path, cwhere),
            query_len=_int(raw, "query_len", path, cwhere),
            context_len=_int(raw, "context_len", path, cwhere),
            path=raw["path"],
            kv_cache_dtype=raw.get("kv_cache_dtype", "auto"),
            accepted_refusal=raw.get("accepted_refusal", ""),
        )
        if case.phase == "decode" and case.query_len != 1:
            raise _fail(path, f"{cwhere}: a decode case has query_len 1, found {case.query_len}")
        if not _NAME.match(case.kv_cache_dtype):
            raise _fail(path, f"{cwhere}.kv_cache_dtype: expected a --kv-cache-dtype value like \"auto\", "
                              f"found {case.kv_cache_dtype!r}")
        if case.accepted_refusal and not case.accepted_refusal.startswith("t4patch: "):
            raise _fail(path, f"{cwhere}.accepted_refusal: expected the start of a t4patch error (\"t4patch: ...\"), "
                              f"found {case.accepted_refusal!r}")
        if case.context_len < case.query_len:
            raise _fail(path, f"{cwhere}: context_len {case.context_len} < query_len {case.query_len}")
        cases.append(case)
    settings = {k: _int(entry, k, path, where) for k in _SETTINGS if k in entry}
    return EngineCases(
        key=key,
        distribution=entry["distribution"],
        versions=tuple(entry["versions"]),
        driver=driver,
        driver_class=drivers[driver] if drivers is not None else None,
        triton_series=series,
        files=tuple(files),
        kernel_tiles=kernel_tiles,
        cases=tuple(cases),
        settings=settings,
        triton_by_version=by_version,
    )
