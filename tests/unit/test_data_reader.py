"""The one strict data reader: every shipped TOML file kind refuses unknown keys, wrong types, missing keys.

Each kind is tested through its real loader on a copy of the shipped file, broken in tmp: the loader must
raise DataFileError (exit 16, not the patch-set class 7), name the file and the key path, and list the keys
allowed there. Patch-set manifests (exit 7) are tested through `t4patch validate` in test_manifest_validation.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from t4patch.builder.recipe import load_recipe_file
from t4patch.cuda.arch import load_archs
from t4patch.data import reader
from t4patch.data.locations import data_dir
from t4patch.data.reader import DataKind, Int, ListOf, MapOf, Number, Str, Table, optional
from t4patch.engines.vllm.marlin import known_files
from t4patch.errors import EXIT_CODES, DataFileError, PatchSetError, T4PatchError
from t4patch.verify.attention.cases import load_cases
from t4patch.verify.marlin.config import load_bandwidth_table, load_tolerances
from t4patch.verify.marlin.shapes import load_shape_file

KIND = DataKind("test data", DataFileError, "fix it")
SCHEMA = Table(
    {
        "schema": Int(),
        "name": Str(),
        "ratio": optional(Number()),
        "item": optional(ListOf(Table({"id": Int(), "tags": optional(ListOf(Str()))}))),
        "by_name": optional(MapOf(Table({"size": Int()}))),
    }
)


def _refusal(doc: dict[str, Any]) -> str:
    with pytest.raises(DataFileError) as info:
        reader.check(doc, SCHEMA, KIND, Path("x.toml"), version=1)
    assert info.value.exit_code == 16
    return str(info.value)


def test_valid_document_passes_and_is_returned():
    doc = {"schema": 1, "name": "n", "ratio": 2, "item": [{"id": 1, "tags": ["a"]}], "by_name": {"a": {"size": 3}}}
    assert reader.check(doc, SCHEMA, KIND, Path("x.toml"), version=1) == doc


@pytest.mark.parametrize(
    "doc, message",
    [
        ({"schema": 1, "name": "n", "nmae": "x"}, "nmae: unknown key 'nmae' (allowed in top level: schema, name, ratio,"),
        (
            {"schema": 1, "name": "n", "item": [{"id": 1}, {"id": 2, "tagz": []}]},
            "item[2].tagz: unknown key 'tagz' (allowed in item[2]: id, tags)",
        ),
        ({"schema": 1, "name": "n", "by_name": {"sm_75": {"size": 1, "x": 2}}}, "by_name.sm_75.x: unknown key 'x'"),
        ({"schema": 1, "name": 5}, "name: expected a non-empty string, found an integer (5)"),
        ({"schema": 1, "name": "  "}, "name: expected a non-empty string, found an empty string"),
        ({"schema": 1, "name": "n", "ratio": True}, "ratio: expected a number, found a boolean (true)"),
        ({"schema": 1, "name": "n", "item": {"id": 1}}, "item: expected an array of tables, found a table"),
        ({"schema": 1, "name": "n", "item": [{"id": "1"}]}, "item[1].id: expected an integer, found a string ('1')"),
        ({"schema": 1, "name": "n", "item": [{"id": 1, "tags": [1]}]}, "item[1].tags[1]: expected a non-empty string"),
        ({"schema": 1}, "name: missing required key 'name' (expected a non-empty string)"),
        ({"schema": 1, "name": "n", "item": [{}]}, "item[1].id: missing required key 'id' (expected an integer)"),
        ({"schema": 2, "name": "n", "new_key": 1}, "expected schema = 1, found 2 (a newer t4patch may be needed)"),
    ],
)
def test_reader_refusals_name_the_key(doc, message):
    text = _refusal(doc)
    assert text.startswith("invalid test data x.toml: ")
    assert message in text


def test_read_refuses_missing_and_broken_files(tmp_path):
    with pytest.raises(DataFileError, match="expected a TOML file, found nothing there"):
        reader.read(tmp_path / "none.toml", SCHEMA, KIND)
    (tmp_path / "bad.toml").write_text("schema = 1\nname = \n")
    with pytest.raises(DataFileError, match="expected valid TOML, found a syntax error"):
        reader.read(tmp_path / "bad.toml", SCHEMA, KIND)


def test_exit_code_16_is_documented_and_distinct():
    assert EXIT_CODES["DataFileError"] == 16 and EXIT_CODES["PatchSetError"] == 7
    assert not issubclass(DataFileError, PatchSetError) and issubclass(DataFileError, T4PatchError)
    assert sorted(EXIT_CODES.values()) == sorted(set(EXIT_CODES.values()))


# ----------------------------------------------------------------- every other shipped data file, broken in tmp

Edit = tuple[str, str, str]  # (text in the shipped file, replacement, what the refusal must say)
KINDS: dict[str, tuple[str, Callable[[Path], object], list[Edit]]] = {
    "build recipe": (
        "recipes/llama.cpp.toml",
        load_recipe_file,
        [
            ("schema = 1\n", 'schema = 1\ncolour = "red"\n', "colour: unknown key 'colour' (allowed in top level: schema, name,"),
            ('name = "build"\n', 'name = "build"\nargs = []\n', "step[2].args: unknown key 'args' (allowed in step[2]: name, argv,"),
            ("min_free_gib = 4", 'min_free_gib = "4"', "min_free_gib: expected a number, found a string ('4')"),
            ('default_ref = "', 'default_rev = "', "unknown key 'default_rev'"),
            ("[artifacts]\n", "[artifacts]\nextra = 1\n", "artifacts.extra: unknown key 'extra' (allowed in artifacts: files, cuda, require)"),
        ],
    ),
    "attention case table": (
        "cases/attention-cases.toml",
        load_cases,
        [
            ("kv_block_size = 16", "kv_block_size = 16\nblock = 1", "model.block: unknown key 'block' (allowed in model: name,"),
            ("max_num_seqs = 256", "max_num_seq = 256", "engine.vllm.max_num_seq: unknown key 'max_num_seq'"),
            ("head_size = 512", 'head_size = "512"', "layer[2].head_size: expected an integer, found a string ('512')"),
            ('name = "decode-small"\nphase = "decode"\n', 'name = "decode-small"\n', "engine.vllm.case[2].phase: missing required key 'phase'"),
        ],
    ),
    "GPU architecture table": (
        "hardware/gpu-archs.toml",
        load_archs,
        [
            ("warp_size = 32\nshared_memory_per_block_optin = 65536", "warp_size = 32\nshared_mem = 65536", "arch.sm_75.shared_mem: unknown key 'shared_mem'"),
            ("capability = [7, 5]", 'capability = "7.5"', "arch.sm_75.capability: expected"),
            ('gpus = "Tesla T4, GeForce RTX 20xx, Quadro RTX"\n', "", "arch.sm_75.gpus: missing required key 'gpus'"),
        ],
    ),
    "Marlin tolerances": (
        "cases/marlin-tolerances.toml",
        load_tolerances,
        [
            ("fail_above = 0.04", "fail_abov = 0.04", "accuracy.fail_abov: unknown key 'fail_abov' (allowed in accuracy: metric,"),
            ("runs = 5", 'runs = "5"', "determinism.runs: expected an integer, found a string ('5')"),
            ("std = 0.02", "", "weights.std: missing required key 'std' (expected a number)"),
        ],
    ),
    "GPU bandwidth table": (
        "hardware/gpu-memory-bandwidth.toml",
        load_bandwidth_table,
        [
            ("gb_per_s = 320", "gb_per_s = 320\nvendor = \"NVIDIA\"", "gpu[1].vendor: unknown key 'vendor' (allowed in gpu[1]: match, gb_per_s, source)"),
            ("gb_per_s = 4800", 'gb_per_s = "4.8 TB/s"', "gpu[2].gb_per_s: expected a number, found a string"),
            ('match = "Tesla T4"\n', "", "gpu[1].match: missing required key 'match'"),
        ],
    ),
    "shape table": (
        "cases/shapes/gemma4-e2b.toml",
        load_shape_file,
        [
            ("group_size = 32", "group_size = 32\ngroup = 32", "group: unknown key 'group' (allowed in top level: schema, name, model,"),
            ("n = 2560", "n = 2560.0", "linear[1].n: expected an integer, found a float (2560.0)"),
            ("layers = 7\n", "", "linear[2].layers: missing required key 'layers' (expected an integer)"),
        ],
    ),
    "vLLM Marlin library table": (
        "engine-data/vllm/marlin-libraries.toml",
        known_files,
        [
            ('version = "0.33.0"\n', 'version = "0.33.0"\nsha = "x"\n', "library[1].sha: unknown key 'sha' (allowed in library[1]: file, sha256,"),
            ('version = "0.33.0"\n', "version = 0.33\n", "library[1].version: expected a non-empty string, found a float (0.33)"),
            ('wheel = "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"\n', "", "library[1].wheel: missing required key 'wheel'"),
        ],
    ),
}


def _copy(tmp_path: Path, shipped: str) -> Path:
    kind, _, rest = shipped.partition("/")
    target = tmp_path / Path(rest).name
    shutil.copyfile(data_dir(kind) / rest, target)
    return target


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_shipped_file_loads_from_a_copy(tmp_path, kind):
    shipped, loader, _ = KINDS[kind]
    assert loader(_copy(tmp_path, shipped))


CASES = [(kind, i) for kind in sorted(KINDS) for i in range(len(KINDS[kind][2]))]


@pytest.mark.parametrize("kind, index", CASES, ids=[f"{k}-{i}" for k, i in CASES])
def test_broken_copy_is_refused_with_exit_16_naming_the_key(tmp_path, kind, index):
    shipped, loader, edits = KINDS[kind]
    old, new, message = edits[index]
    path = _copy(tmp_path, shipped)
    text = path.read_text()
    assert text.count(old) >= 1, f"{shipped} no longer contains {old!r}: update this test"
    path.write_text(text.replace(old, new, 1))
    before = path.read_bytes()
    with pytest.raises(DataFileError) as info:
        loader(path)
    assert info.value.exit_code == 16
    assert str(path) in str(info.value) and message in str(info.value)
    assert "\n" not in str(info.value)
    assert path.read_bytes() == before
