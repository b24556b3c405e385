"""Shape tables: which (N, K) Marlin GEMMs a model runs, read from ``verify/shapes/<name>.toml``.

The shapes are data so a reviewer can check each number against its stated source, and they are validated on
load against Marlin's own constraints (N % 64, K % 128, K % group size): a shape the engine would reject or pad
must never be "verified" silently.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from t4patch.data.locations import data_dir
from t4patch.data.tomlcompat import tomllib
from t4patch.errors import PatchSetError, UsageError

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


def _bad(path: Path, problem: str) -> PatchSetError:
    # Shipped data that fails validation is a defect of t4patch's data (the same class data.py raises for
    # missing data), not a failed kernel check: say which file and what.
    return PatchSetError(
        f"invalid shape table {path}: {problem}",
        hint="fix the table (N % 64 == 0, K % 128 == 0, K % group_size == 0), or reinstall t4patch",
    )


def _positive_int(value: object, what: str, path: Path) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise _bad(path, f"{what}: expected a positive integer, found {value!r}")
    return value


def parse_shape_table(doc: dict[str, object], path: Path) -> ShapeTable:
    """Validate one parsed TOML document; raise PatchSetError naming the first problem."""
    if doc.get("schema") != SCHEMA_VERSION:
        raise _bad(path, f"expected schema = {SCHEMA_VERSION}, found {doc.get('schema')!r}")
    name = doc.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise _bad(path, f"name: expected a lower-case identifier, found {name!r}")
    model = doc.get("model")
    if not isinstance(model, str) or not model.strip():
        raise _bad(path, "model: expected a description of the model")
    group = _positive_int(doc.get("group_size"), "group_size", path)
    if group not in SUPPORTED_GROUP_SIZES:
        raise _bad(path, f"group_size: expected one of {SUPPORTED_GROUP_SIZES}, found {group}")
    weight_type = doc.get("weight_type")
    if weight_type not in SUPPORTED_WEIGHT_TYPES:
        raise _bad(path, f"weight_type: expected one of {SUPPORTED_WEIGHT_TYPES}, found {weight_type!r}")
    entries = doc.get("linear")
    if not isinstance(entries, list) or not entries:
        raise _bad(path, "expected at least one [[linear]] table")
    linears: list[LinearShape] = []
    seen: set[str] = set()
    for index, entry in enumerate(entries):
        where = f"[[linear]] #{index + 1}"
        if not isinstance(entry, dict):
            raise _bad(path, f"{where}: expected a table")
        unknown = set(entry) - {"name", "n", "k", "layers", "source"}
        if unknown:
            raise _bad(path, f"{where}: unknown keys {sorted(unknown)}")
        lname = entry.get("name")
        if not isinstance(lname, str) or not _NAME.match(lname):
            raise _bad(path, f"{where}: name: expected a lower-case identifier, found {lname!r}")
        if lname in seen:
            raise _bad(path, f"{where}: duplicate name {lname!r}")
        seen.add(lname)
        n = _positive_int(entry.get("n"), f"{lname}.n", path)
        k = _positive_int(entry.get("k"), f"{lname}.k", path)
        layers = _positive_int(entry.get("layers"), f"{lname}.layers", path)
        source = entry.get("source")
        if not isinstance(source, str) or not source.strip():
            raise _bad(path, f"{lname}: source: expected where N, K and layers come from")
        if n % MIN_THREAD_N:
            raise _bad(path, f"{lname}: N = {n} is not a multiple of {MIN_THREAD_N}")
        if k % MIN_THREAD_K:
            raise _bad(path, f"{lname}: K = {k} is not a multiple of {MIN_THREAD_K}")
        if k % group:
            raise _bad(path, f"{lname}: K = {k} is not a multiple of the group size {group}")
        linears.append(LinearShape(lname, n, k, layers, source.strip()))
    return ShapeTable(name, model.strip(), group, weight_type, tuple(linears), path)


def available_tables() -> list[str]:
    return sorted(p.stem for p in (data_dir("verify") / "shapes").glob("*.toml"))


def load_shape_table(name: str) -> ShapeTable:
    """The shipped table ``verify/shapes/<name>.toml``, validated."""
    path = data_dir("verify") / "shapes" / f"{name}.toml"
    if not _NAME.match(name) or not path.is_file():
        raise UsageError(
            f"--shapes {name}: expected one of {', '.join(available_tables()) or 'nothing'}, found no such table",
            hint="t4patch verify marlin --shapes gemma4-e2b",
        )
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise _bad(path, f"not valid TOML ({exc})") from exc
    table = parse_shape_table(doc, path)
    if table.name != name:
        raise _bad(path, f"name {table.name!r} does not match the file name {name!r}")
    return table
