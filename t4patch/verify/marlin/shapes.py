"""Shape tables: which (N, K) Marlin GEMMs a model runs, read from ``cases/shapes/<name>.toml``.

The shapes are data so a reviewer can check each number against its stated source, and they are validated on
load against Marlin's own constraints (N % 64, K % 128, K % group size): a shape the engine would reject or pad
must never be "verified" silently.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from t4patch.data.locations import data_dir
from t4patch.data.reader import DataKind, Int, ListOf, Str, Table, check, read
from t4patch.errors import DataFileError, T4PatchError, UsageError

SCHEMA_VERSION = 1
# Marlin's tile constraints for uint4b8 with fp16 activations (SGLang marlin_utils.py:161-210, vLLM
# GPTQ_MARLIN_MIN_THREAD_N / MIN_THREAD_K).
MIN_THREAD_N = 64
MIN_THREAD_K = 128
SUPPORTED_GROUP_SIZES = (32, 64, 128)
SUPPORTED_WEIGHT_TYPES = ("uint4b8",)
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


@dataclass(frozen=True)
class LinearShape:
    """One quantized linear layer: out features N, in features K, and how many run per forward."""

    name: str
    n: int
    k: int
    layers: int
    source: str


@dataclass(frozen=True)
class ShapeTable:
    name: str
    model: str
    group_size: int
    weight_type: str
    linears: tuple[LinearShape, ...]
    path: Path

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "model": self.model,
            "group_size": self.group_size,
            "weight_type": self.weight_type,
            "file": str(self.path),
            "linears": [
                {"name": s.name, "n": s.n, "k": s.k, "layers": s.layers, "source": s.source}
                for s in self.linears
            ],
        }


SHAPE_TABLE = DataKind(
    label="shape table",
    error=DataFileError,
    hint="fix the table (N % 64 == 0, K % 128 == 0, K % group_size == 0), or reinstall t4patch",
)

# The file, stated once; the strict reader refuses unknown keys, wrong types and missing keys.
SHAPES_SCHEMA = Table(
    {
        "schema": Int(),
        "name": Str(),
        "model": Str(),
        "group_size": Int(),
        "weight_type": Str(),
        "linear": ListOf(
            Table({"name": Str(), "n": Int(), "k": Int(), "layers": Int(), "source": Str()}),
            nonempty=True,
        ),
    }
)


def _bad(path: Path, problem: str) -> T4PatchError:
    # Shipped data that fails validation is a defect of t4patch's data, not a failed kernel check: say which
    # file and what.
    return SHAPE_TABLE.fail(path, problem)


def _positive(value: int, what: str, path: Path) -> int:
    if value <= 0:
        raise _bad(path, f"{what}: expected a positive integer, found {value!r}")
    return value


def parse_shape_table(doc: dict[str, Any], path: Path) -> ShapeTable:
    """Validate one parsed TOML document (schema first, then Marlin's constraints); raise naming the problem."""
    doc = check(doc, SHAPES_SCHEMA, SHAPE_TABLE, path, version=SCHEMA_VERSION)
    name = doc["name"]
    if not _NAME.match(name):
        raise _bad(path, f"name: expected a lower-case identifier, found {name!r}")
    group = _positive(doc["group_size"], "group_size", path)
    if group not in SUPPORTED_GROUP_SIZES:
        raise _bad(path, f"group_size: expected one of {SUPPORTED_GROUP_SIZES}, found {group}")
    weight_type = doc["weight_type"]
    if weight_type not in SUPPORTED_WEIGHT_TYPES:
        raise _bad(path, f"weight_type: expected one of {SUPPORTED_WEIGHT_TYPES}, found {weight_type!r}")
    linears: list[LinearShape] = []
    seen: set[str] = set()
    for index, entry in enumerate(doc["linear"], start=1):
        where = f"linear[{index}]"
        lname = entry["name"]
        if not _NAME.match(lname):
            raise _bad(path, f"{where}.name: expected a lower-case identifier, found {lname!r}")
        if lname in seen:
            raise _bad(path, f"{where}: duplicate name {lname!r}")
        seen.add(lname)
        n = _positive(entry["n"], f"{where}.n ({lname})", path)
        k = _positive(entry["k"], f"{where}.k ({lname})", path)
        layers = _positive(entry["layers"], f"{where}.layers ({lname})", path)
        if n % MIN_THREAD_N:
            raise _bad(path, f"{lname}: N = {n} is not a multiple of {MIN_THREAD_N}")
        # the group rule first: every supported group divides MIN_THREAD_K, so a K it refuses would otherwise
        # always be reported as a K % 128 problem and the table's own group never named
        if k % group:
            raise _bad(path, f"{lname}: K = {k} is not a multiple of the group size {group}")
        if k % MIN_THREAD_K:
            raise _bad(path, f"{lname}: K = {k} is not a multiple of {MIN_THREAD_K}")
        linears.append(LinearShape(lname, n, k, layers, entry["source"].strip()))
    return ShapeTable(name, doc["model"].strip(), group, weight_type, tuple(linears), path)


def available_tables() -> list[str]:
    return sorted(p.stem for p in (data_dir("cases") / "shapes").glob("*.toml"))


def load_shape_table(name: str) -> ShapeTable:
    """The shipped table ``cases/shapes/<name>.toml``, validated."""
    path = data_dir("cases") / "shapes" / f"{name}.toml"
    if not _NAME.match(name) or not path.is_file():
        raise UsageError(
            f"--shapes {name}: expected one of {', '.join(available_tables()) or 'nothing'}, found no such table",
            hint="t4patch verify marlin --shapes gemma4-e2b",
        )
    return load_shape_file(path)


def load_shape_file(path: Path) -> ShapeTable:
    """The shape table in ``path`` (a shipped one or a copy), validated; its ``name`` must be the file's stem."""
    table = parse_shape_table(read(path, SHAPES_SCHEMA, SHAPE_TABLE, version=SCHEMA_VERSION), path)
    if table.name != path.stem:
        raise _bad(path, f"name {table.name!r} does not match the file name {path.name!r}")
    return table
