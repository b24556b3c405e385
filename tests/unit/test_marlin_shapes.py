"""Shape tables, tolerances and the bandwidth table: shipped data loads, bad data is refused with a reason."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from t4patch.errors import DataFileError, UsageError
from t4patch.verify.marlin import config, shapes

E2B = {
    "qkv_proj.sliding": (2560, 1536, 28),
    "qkv_proj.full": (5120, 1536, 7),
    "o_proj.sliding": (1536, 2048, 28),
    "o_proj.full": (1536, 4096, 7),
    "gate_up_proj.0-14": (12288, 1536, 15),
    "down_proj.0-14": (1536, 6144, 15),
    "gate_up_proj.15-34": (24576, 1536, 20),
    "down_proj.15-34": (1536, 12288, 20),
    "per_layer_input_gate": (256, 1536, 35),
    "per_layer_projection": (1536, 256, 35),
    "per_layer_model_projection": (8960, 1536, 1),
}


def test_shipped_e2b_table():
    table = shapes.load_shape_table("gemma4-e2b")
    assert table.group_size == 32 and table.weight_type == "uint4b8"
    assert {s.name: (s.n, s.k, s.layers) for s in table.linears} == E2B
    # 35 layers: 28 sliding + 7 full; 15 + 20 MLP layers
    assert sum(s.layers for s in table.linears if s.name.startswith("qkv_proj")) == 35
    assert sum(s.layers for s in table.linears if s.name.startswith("down_proj")) == 35
    assert all(s.source for s in table.linears)
    assert "gemma4-e2b" in shapes.available_tables()


def _doc() -> dict:
    return {
        "schema": 1,
        "name": "t",
        "model": "test",
        "group_size": 32,
        "weight_type": "uint4b8",
        "linear": [{"name": "a", "n": 128, "k": 256, "layers": 1, "source": "here"}],
    }


def test_minimal_table_parses():
    table = shapes.parse_shape_table(_doc(), Path("t.toml"))
    assert table.linears[0].n == 128


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (lambda d: d["linear"][0].update(n=96), "not a multiple of 64"),
        (lambda d: d["linear"][0].update(k=192), "not a multiple of 128"),
        (lambda d: d.update(group_size=256), "group_size"),
        (lambda d: d["linear"][0].update(k=0), "positive integer"),
        (lambda d: d["linear"][0].update(n=True), r"linear\[1\]\.n: expected an integer, found a boolean \(true\)"),
        (lambda d: d["linear"][0].update(layers=1.5), r"linear\[1\]\.layers: expected an integer, found a float"),
        (lambda d: d["linear"].append(dict(d["linear"][0])), "duplicate"),
        (lambda d: d["linear"][0].update(extra=1), r"linear\[1\]\.extra: unknown key 'extra' \(allowed in linear\[1\]: name, n, k, layers, source\)"),
        (lambda d: d["linear"][0].pop("source"), r"linear\[1\]\.source: missing required key 'source'"),
        (lambda d: d.update(modle="typo"), "modle: unknown key"),
        (lambda d: d.update(schema=2), "schema"),
        (lambda d: d.update(weight_type="uint8b128"), "weight_type"),
        (lambda d: d.update(linear=[]), "at least one"),
        (lambda d: d.update(name="Bad Name"), "name"),
    ],
)
def test_invalid_tables_are_refused(mutate, fragment):
    doc = copy.deepcopy(_doc())
    mutate(doc)
    with pytest.raises(DataFileError, match=fragment):
        shapes.parse_shape_table(doc, Path("t.toml"))


def test_k_must_divide_by_group():
    # Every supported group size (32, 64, 128) divides 128, so a K that breaks the group rule also breaks
    # K % 128; the loader checks the group first, so the refusal names the table's group. K = 192 with group
    # 128 (one and a half groups) must be refused by that rule, and K = 384 (three groups) accepted.
    doc = _doc()
    doc["group_size"] = 128
    doc["linear"][0]["k"] = 384
    assert shapes.parse_shape_table(doc, Path("t.toml")).linears[0].k == 384
    doc["linear"][0]["k"] = 192
    with pytest.raises(DataFileError, match=r"a: K = 192 is not a multiple of the group size 128"):
        shapes.parse_shape_table(doc, Path("t.toml"))
    doc["group_size"] = 64
    doc["linear"][0]["k"] = 96
    with pytest.raises(DataFileError, match=r"a: K = 96 is not a multiple of the group size 64"):
        shapes.parse_shape_table(doc, Path("t.toml"))


def test_unknown_table_is_a_usage_error():
    with pytest.raises(UsageError, match="gemma4-e2b"):
        shapes.load_shape_table("no-such-model")
    with pytest.raises(UsageError):
        shapes.load_shape_table("../etc/passwd")


def test_shipped_tolerances():
    tol = config.load_tolerances()
    assert tol.fail_above == 0.04 and tol.flag_above == 5e-3
    assert tol.determinism_runs == 5
    assert tol.redirect_overhead_goal == 0.03 and tol.redirect_overhead_m == 1
    assert tol.overflow_outlier_abs == 2080.0


def test_tolerances_refuse_flag_above_fail(tmp_path):
    from t4patch.data.tomlcompat import tomllib

    path = config.data_dir("cases") / "marlin-tolerances.toml"
    doc = tomllib.loads(path.read_text())
    doc["accuracy"]["flag_above"] = 0.5
    with pytest.raises(DataFileError, match="flag_above"):
        config.parse_tolerances(doc, path)
    doc = tomllib.loads(path.read_text())
    doc["determinism"]["runs"] = 1
    with pytest.raises(DataFileError, match="runs"):
        config.parse_tolerances(doc, path)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("Tesla T4", 320),
        ("NVIDIA H200", 4800),
        ("NVIDIA H100 80GB HBM3", 3350),
        ("NVIDIA A10", 600),
        ("NVIDIA A100-PCIE-40GB", None),  # "A10" must not match "A100"
        ("NVIDIA L40S", None),  # "L4" must not match "L40S"
        ("NVIDIA L4", 300),
        ("Some Future GPU", None),
    ],
)
def test_peak_bandwidth_lookup(name, expected):
    peak = config.peak_bandwidth(name)
    assert (peak.gb_per_s if peak else None) == expected
