"""Thresholds and GPU facts of `verify marlin`, read from ``verify/marlin-tolerances.toml`` and
``verify/gpu-memory-bandwidth.toml``.

They are data because every number in a verdict must be inspectable with its source; the loaders validate
types and ranges so a typo in shipped data fails loudly instead of loosening a check.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from t4patch.data.locations import data_dir
from t4patch.data.tomlcompat import tomllib
from t4patch.errors import PatchSetError

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


def _bad(path: Path, problem: str) -> PatchSetError:
    return PatchSetError(f"invalid verification data {path}: {problem}", hint="reinstall t4patch")


def _load(path: Path) -> dict[str, object]:
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise _bad(path, "file is missing") from exc
    except tomllib.TOMLDecodeError as exc:
        raise _bad(path, f"not valid TOML ({exc})") from exc
    if doc.get("schema") != SCHEMA_VERSION:
        raise _bad(path, f"expected schema = {SCHEMA_VERSION}, found {doc.get('schema')!r}")
    return doc


def _section(doc: dict[str, object], name: str, path: Path) -> dict[str, object]:
    value = doc.get(name)
    if not isinstance(value, dict):
        raise _bad(path, f"expected a [{name}] table")
    return value


def _number(table: dict[str, object], key: str, path: Path, *, low: float, high: float) -> float:
    value = table.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (low <= float(value) <= high):
        raise _bad(path, f"{key}: expected a number in [{low}, {high}], found {value!r}")
    return float(value)


def _integer(table: dict[str, object], key: str, path: Path, *, low: int, high: int) -> int:
    value = table.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not (low <= value <= high):
        raise _bad(path, f"{key}: expected an integer in [{low}, {high}], found {value!r}")
    return value


def _text(table: dict[str, object], key: str, path: Path) -> str:
    value = table.get(key)
    if not isinstance(value, str) or not value.strip():
        raise _bad(path, f"{key}: expected a non-empty string")
    return value.strip()


def parse_tolerances(doc: dict[str, object], path: Path) -> Tolerances:
    acc = _section(doc, "accuracy", path)
    det = _section(doc, "determinism", path)
    speed = _section(doc, "speed", path)
    over = _section(doc, "overflow", path)
    weights = _section(doc, "weights", path)
    fail_above = _number(acc, "fail_above", path, low=1e-6, high=1.0)
    flag_above = _number(acc, "flag_above", path, low=1e-7, high=1.0)
    if flag_above > fail_above:
        raise _bad(path, f"flag_above {flag_above} must not exceed fail_above {fail_above}")
    return Tolerances(
        fail_above=fail_above,
        flag_above=flag_above,
        fail_source=_text(acc, "fail_source", path),
        flag_source=_text(acc, "flag_source", path),
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
        overflow_source=_text(over, "source", path),
        weight_std=_number(weights, "std", path, low=1e-6, high=10.0),
    )


def load_tolerances() -> Tolerances:
    path = data_dir("verify") / "marlin-tolerances.toml"
    return parse_tolerances(_load(path), path)


@dataclass(frozen=True)
class Bandwidth:
    gb_per_s: float
    match: str
    source: str


def _token_pattern(match: str) -> re.Pattern[str]:
    # whole token: "A10" must not match "A100", "L4" not "L40S"
    return re.compile(r"(?<![A-Za-z0-9])" + re.escape(match) + r"(?![A-Za-z0-9])", re.IGNORECASE)


def parse_bandwidth_table(doc: dict[str, object], path: Path) -> tuple[Bandwidth, ...]:
    entries = doc.get("gpu")
    if not isinstance(entries, list) or not entries:
        raise _bad(path, "expected at least one [[gpu]] table")
    result = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise _bad(path, f"[[gpu]] #{index + 1}: expected a table")
        result.append(
            Bandwidth(
                gb_per_s=_number(entry, "gb_per_s", path, low=1.0, high=1e6),
                match=_text(entry, "match", path),
                source=_text(entry, "source", path),
            )
        )
    return tuple(result)


def peak_bandwidth(device_name: str, table: tuple[Bandwidth, ...] | None = None) -> Bandwidth | None:
    """The datasheet bandwidth of ``device_name`` (longest whole-token match), or None when not listed."""
    if table is None:
        path = data_dir("verify") / "gpu-memory-bandwidth.toml"
        table = parse_bandwidth_table(_load(path), path)
    hits = [entry for entry in table if _token_pattern(entry.match).search(device_name)]
    if not hits:
        return None
    return max(hits, key=lambda entry: len(entry.match))
