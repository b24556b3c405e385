"""Thresholds and GPU facts of `verify marlin`, read from ``cases/marlin-tolerances.toml`` and
``hardware/gpu-memory-bandwidth.toml``.

They are data because every number in a verdict must be inspectable with its source; the loaders validate
types and ranges so a typo in shipped data fails loudly instead of loosening a check.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from t4patch.data.locations import data_dir
from t4patch.data.reader import DataKind, Int, ListOf, Number, Str, Table, check, read
from t4patch.errors import DataFileError, T4PatchError

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Tolerances:
    fail_above: float
    flag_above: float
    fail_source: str
    flag_source: str
    determinism_runs: int
    redirect_overhead_goal: float
    redirect_overhead_m: int
    rotate_bytes_over_l2: float
    max_rotating_copies: int
    graph_replays: int
    graph_replays_quick: int
    eager_calls: int
    eager_rounds: int
    overflow_body_std: float
    overflow_outlier_abs: float
    overflow_outlier_fraction: float
    overflow_source: str
    weight_std: float

    def to_json(self) -> dict[str, object]:
        return {
            "accuracy": {
                "metric": "mean(|out - ref|) / mean(|ref|)",
                "fail_above": self.fail_above,
                "flag_above": self.flag_above,
                "fail_source": self.fail_source,
                "flag_source": self.flag_source,
            },
            "determinism_runs": self.determinism_runs,
            "redirect_overhead_goal": self.redirect_overhead_goal,
            "redirect_overhead_m": self.redirect_overhead_m,
            "overflow": {
                "body_std": self.overflow_body_std,
                "outlier_abs": self.overflow_outlier_abs,
                "outlier_fraction": self.overflow_outlier_fraction,
                "source": self.overflow_source,
            },
            "weight_std": self.weight_std,
        }


MARLIN_DATA = DataKind(
    label="verification data",
    error=DataFileError,
)
TOLERANCES_FILE = "marlin-tolerances.toml"
BANDWIDTH_FILE = "gpu-memory-bandwidth.toml"
ACCURACY_METRIC = "mean(|out - ref|) / mean(|ref|)"  # what t4patch.verify.marlin.checks computes

# Both files, stated once; the strict reader refuses unknown keys, wrong types and missing keys.
TOLERANCES_SCHEMA = Table(
    {
        "schema": Int(),
        "accuracy": Table(
            {
                "metric": Str(),
                "fail_above": Number(),
                "fail_source": Str(),
                "flag_above": Number(),
                "flag_source": Str(),
            }
        ),
        "determinism": Table({"runs": Int(), "source": Str()}),
        "speed": Table(
            {
                "redirect_overhead_goal": Number(),
                "redirect_overhead_m": Int(),
                "rotate_bytes_over_l2": Number(),
                "max_rotating_copies": Int(),
                "graph_replays": Int(),
                "graph_replays_quick": Int(),
                "eager_calls": Int(),
                "eager_rounds": Int(),
            }
        ),
        "overflow": Table({"body_std": Number(), "outlier_abs": Number(), "outlier_fraction": Number(), "source": Str()}),
        "weights": Table({"std": Number()}),
    }
)
BANDWIDTH_SCHEMA = Table(
    {
        "schema": Int(),
        "gpu": ListOf(Table({"match": Str(), "gb_per_s": Number(), "source": Str()}), nonempty=True),
    }
)


def _bad(path: Path, problem: str) -> T4PatchError:
    return MARLIN_DATA.fail(path, problem)


def _number(table: dict[str, Any], key: str, path: Path, *, low: float, high: float) -> float:
    value = float(table[key])  # a number: the schema checked it
    if not (low <= value <= high):
        raise _bad(path, f"{key}: expected a number in [{low}, {high}], found {table[key]!r}")
    return value


def _integer(table: dict[str, Any], key: str, path: Path, *, low: int, high: int) -> int:
    value: int = table[key]  # an integer: the schema checked it
    if not (low <= value <= high):
        raise _bad(path, f"{key}: expected an integer in [{low}, {high}], found {value!r}")
    return value


def parse_tolerances(doc: dict[str, Any], path: Path) -> Tolerances:
    """Validate a parsed tolerances document (schema first, then ranges and the facts the code relies on)."""
    doc = check(doc, TOLERANCES_SCHEMA, MARLIN_DATA, path, version=SCHEMA_VERSION)
    acc, det, speed, over, weights = (doc[k] for k in ("accuracy", "determinism", "speed", "overflow", "weights"))
    if acc["metric"] != ACCURACY_METRIC:
        raise _bad(path, f"accuracy.metric: expected {ACCURACY_METRIC!r} (what verify marlin computes), "
                         f"found {acc['metric']!r}")
    fail_above = _number(acc, "fail_above", path, low=1e-6, high=1.0)
    flag_above = _number(acc, "flag_above", path, low=1e-7, high=1.0)
    if flag_above > fail_above:
        raise _bad(path, f"flag_above {flag_above} must not exceed fail_above {fail_above}")
    return Tolerances(
        fail_above=fail_above,
        flag_above=flag_above,
        fail_source=acc["fail_source"].strip(),
        flag_source=acc["flag_source"].strip(),
        # fewer than 2 runs would make "bitwise repeatable" vacuous
        determinism_runs=_integer(det, "runs", path, low=2, high=100),
        redirect_overhead_goal=_number(speed, "redirect_overhead_goal", path, low=0.0, high=10.0),
        redirect_overhead_m=_integer(speed, "redirect_overhead_m", path, low=1, high=1 << 20),
        rotate_bytes_over_l2=_number(speed, "rotate_bytes_over_l2", path, low=0.0, high=100.0),
        max_rotating_copies=_integer(speed, "max_rotating_copies", path, low=1, high=1 << 16),
        graph_replays=_integer(speed, "graph_replays", path, low=1, high=1000),
        graph_replays_quick=_integer(speed, "graph_replays_quick", path, low=1, high=1000),
        eager_calls=_integer(speed, "eager_calls", path, low=1, high=1 << 20),
        eager_rounds=_integer(speed, "eager_rounds", path, low=1, high=1000),
        overflow_body_std=_number(over, "body_std", path, low=1e-6, high=65504.0),
        overflow_outlier_abs=_number(over, "outlier_abs", path, low=0.0, high=65504.0),
        overflow_outlier_fraction=_number(over, "outlier_fraction", path, low=0.0, high=1.0),
        overflow_source=over["source"].strip(),
        weight_std=_number(weights, "std", path, low=1e-6, high=10.0),
    )


def load_tolerances(path: Path | None = None) -> Tolerances:
    """The tolerances file (default: the shipped ``cases/marlin-tolerances.toml``), validated."""
    path = path or data_dir("cases") / TOLERANCES_FILE
    return parse_tolerances(read(path, TOLERANCES_SCHEMA, MARLIN_DATA, version=SCHEMA_VERSION), path)


@dataclass(frozen=True)
class Bandwidth:
    gb_per_s: float
    match: str
    source: str


def _token_pattern(match: str) -> re.Pattern[str]:
    # whole token: "A10" must not match "A100", "L4" not "L40S"
    return re.compile(r"(?<![A-Za-z0-9])" + re.escape(match) + r"(?![A-Za-z0-9])", re.IGNORECASE)


def parse_bandwidth_table(doc: dict[str, Any], path: Path) -> tuple[Bandwidth, ...]:
    doc = check(doc, BANDWIDTH_SCHEMA, MARLIN_DATA, path, version=SCHEMA_VERSION)
    return tuple(
        Bandwidth(
            gb_per_s=_number(entry, "gb_per_s", path, low=1.0, high=1e6),
            match=entry["match"].strip(),
            source=entry["source"].strip(),
        )
        for entry in doc["gpu"]
    )


def load_bandwidth_table(path: Path | None = None) -> tuple[Bandwidth, ...]:
    """The bandwidth table (default: the shipped ``hardware/gpu-memory-bandwidth.toml``), validated."""
    path = path or data_dir("hardware") / BANDWIDTH_FILE
    return parse_bandwidth_table(read(path, BANDWIDTH_SCHEMA, MARLIN_DATA, version=SCHEMA_VERSION), path)


def peak_bandwidth(device_name: str, table: tuple[Bandwidth, ...] | None = None) -> Bandwidth | None:
    """The datasheet bandwidth of ``device_name`` (longest whole-token match), or None when not listed."""
    if table is None:
        table = load_bandwidth_table()
    hits = [entry for entry in table if _token_pattern(entry.match).search(device_name)]
    if not hits:
        return None
    return max(hits, key=lambda entry: len(entry.match))
