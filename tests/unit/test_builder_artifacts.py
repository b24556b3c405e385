"""What `verify build` takes from a build: the record's rules, and a missing path's hint that follows what the
user gave and their --arch (issue 23.3), not a fixed ./t4patch-build/llama.cpp-sm75."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from t4patch import cli
from t4patch.builder.artifacts import missing_path_hint, record_rules
from t4patch.builder.record import BuildRecord


def write_record(out: Path, **kw: object) -> None:
    out.mkdir(parents=True, exist_ok=True)
    doc = BuildRecord(t4patch="0", command="t4patch build llama.cpp", recipe="llama.cpp", recipe_sha256=None, arch="75",
                      cuda=True, features=[], with_tests=False, ptx_only=False, jobs=1, out=str(out),
                      build_dir=str(out / "build"), log=str(out / "build.log"), requested={}, env={}, flags={}, tools={},
                      host={}, started="2026-12-01T20:00:00+00:00", status="ok").to_dict()
    doc.update(kw)
    (out / "build-record.json").write_text(json.dumps(doc))


def test_a_build_output_name_gets_the_build_that_makes_it_there(tmp_path):
    hint = missing_path_hint(tmp_path / "t4patch-build" / "mistral.rs-sm80", None)
    assert f"t4patch build mistral.rs --arch 80 --out {tmp_path / 't4patch-build' / 'mistral.rs-sm80'}" in hint
    virtual = missing_path_hint(Path("out/llama.cpp-sm75-virtual"), "75")
    assert "t4patch build llama.cpp --arch 75 --ptx-only --out out/llama.cpp-sm75-virtual" in virtual
    assert "t4patch verify build out/llama.cpp-sm75-virtual --arch 75" in virtual


def test_the_users_arch_wins_and_other_paths_get_the_outputs_that_exist(tmp_path):
    assert "--arch 86" in missing_path_hint(Path("llama.cpp-sm75"), "86")
    write_record(tmp_path / "t4patch-build" / "llama.cpp-sm75")
    hint = missing_path_hint(Path("typo"), "75", cwd=tmp_path)
    assert "(build outputs here: " + str(tmp_path / "t4patch-build" / "llama.cpp-sm75") + ")" in hint
    assert hint.endswith(f"t4patch verify build {shlex.quote(str(tmp_path / 't4patch-build' / 'llama.cpp-sm75'))} --arch 75")
    assert "llama.cpp-sm75" not in missing_path_hint(Path("typo"), None, cwd=tmp_path / "empty")


def test_the_cli_hint_names_the_given_path(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["verify", "build", "builds/mistral.rs-sm86", "--arch", "86"]) == 2
    err = capsys.readouterr().err
    assert "t4patch build mistral.rs --arch 86 --out builds/mistral.rs-sm86" in err
    assert "./t4patch-build/llama.cpp-sm75" not in err


def test_record_rules_come_from_the_record_and_its_recipe(tmp_path):
    out = tmp_path / "o"
    (out / "build" / "bin").mkdir(parents=True)
    (out / "build" / "bin" / "libggml-cuda.so").write_bytes(b"\x7fELF")
    write_record(out, ptx_only=True)
    rules = record_rules([out])
    assert (rules.arch, rules.recipe, rules.ptx_only) == ("75", "llama.cpp", True) and "sass" not in rules.require
    assert rules.cuda_files == ((out / "build" / "bin" / "libggml-cuda.so").resolve(),)
    assert record_rules([out, out]).recipe is None  # two paths: no record applies


@pytest.mark.parametrize("arch", [None, "80"])
def test_a_missing_extension_cache_path_gets_its_build(tmp_path, arch):
    hint = missing_path_hint(tmp_path / "vllm-marlin-sm75" / "0123456789abcdef", arch)
    assert hint.endswith(": t4patch build vllm-marlin-sm75")
