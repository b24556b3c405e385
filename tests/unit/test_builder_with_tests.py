"""`t4patch build llama.cpp --with-tests [--ptx-only]`: the recipe's [tests] data, the plan, the record keys, the
artifact rules (no GPU, no build: plans and synthetic build directories).

--with-tests adds llama.cpp's test-backend-ops (for `t4patch verify llama.cpp`); --ptx-only builds PTX for the
architecture only (CMake `75-virtual`), so a newer GPU runs the Turing code through JIT — the configuration
of docs/verification/llama-cpp-test-backend-ops-2026-12-01.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from t4patch.builder.pipeline import collect_artifacts
from t4patch.builder.plan import plan_build
from t4patch.builder.recipe import load_recipe, load_recipe_file
from t4patch.errors import BuildError, DataFileError, UsageError


def _steps(plan):
    return {s.name: list(s.argv) for s in plan.steps}


def test_with_tests_adds_the_suite_to_configure_and_build(tmp_path):
    plan = plan_build(load_recipe("llama.cpp"), arch="75", out=tmp_path / "o", source_dir=tmp_path, with_tests=True)
    steps = _steps(plan)
    configure = steps["configure"]
    # CMake takes the last -D of a variable: the recipe's OFF stays, the tests' ON comes after it
    assert configure.index("-DLLAMA_BUILD_TESTS=ON") > configure.index("-DLLAMA_BUILD_TESTS=OFF")
    assert steps["build"][-1] == "test-backend-ops" and "llama-server" in steps["build"]
    assert "-DCMAKE_CUDA_ARCHITECTURES=75" in configure
    assert plan.to_dict()["with_tests"] is True and plan.to_dict()["ptx_only"] is False


def test_without_the_flag_nothing_changes(tmp_path):
    plain = plan_build(load_recipe("llama.cpp"), arch="75", out=tmp_path / "o", source_dir=tmp_path)
    assert "-DLLAMA_BUILD_TESTS=ON" not in _steps(plain)["configure"]
    assert "test-backend-ops" not in _steps(plain)["build"]


def test_ptx_only_builds_virtual_and_keeps_its_own_directory(tmp_path):
    plan = plan_build(load_recipe("llama.cpp"), arch="75", source_dir=tmp_path, cwd=tmp_path, with_tests=True, ptx_only=True)
    assert "-DCMAKE_CUDA_ARCHITECTURES=75-virtual" in _steps(plan)["configure"]
    assert plan.out.name == "llama.cpp-sm75-virtual"  # never mixed with a SASS build's directory
    assert plan.arch_text == "75"  # the record's arch stays an architecture; ptx_only says how it was built
    assert "PTX only (75-virtual" in plan.render()


def test_refusals(tmp_path):
    with pytest.raises(UsageError, match="no test build"):
        plan_build(load_recipe("mistral.rs"), arch="75", source_dir=tmp_path, with_tests=True)
    with pytest.raises(UsageError, match="--ptx-only needs a GPU architecture"):
        plan_build(load_recipe("llama.cpp"), arch="cpu", source_dir=tmp_path, ptx_only=True)


def test_tests_table_must_name_existing_steps(tmp_path):
    text = (Path(load_recipe("llama.cpp").path).read_text()
            .replace('argv = { configure = ["-DLLAMA_BUILD_TESTS=ON"], build = ["test-backend-ops"] }',
                     'argv = { configur = ["-DLLAMA_BUILD_TESTS=ON"] }'))
    path = tmp_path / "llama.cpp.toml"
    path.write_text(text)
    with pytest.raises(DataFileError, match=r"\[tests\].argv.configur: no step of that name"):
        load_recipe_file(path)


def test_test_artifacts_are_collected_only_with_tests(tmp_path):
    recipe = load_recipe("llama.cpp")
    plan = plan_build(recipe, arch="cpu", out=tmp_path / "o", source_dir=tmp_path, with_tests=True)
    bin_dir = plan.build_dir / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("llama-server", "llama-cli", "llama-bench", "libllama.so"):
        (bin_dir / name).write_bytes(b"x")
    with pytest.raises(BuildError, match="bin/test-backend-ops"):
        collect_artifacts(plan)
    (bin_dir / "test-backend-ops").write_bytes(b"x")
    files, _ = collect_artifacts(plan)
    assert bin_dir / "test-backend-ops" in files
    plain = plan_build(recipe, arch="cpu", out=tmp_path / "o", source_dir=tmp_path)
    (bin_dir / "test-backend-ops").unlink()
    assert bin_dir / "test-backend-ops" not in collect_artifacts(plain)[0]


def test_verify_build_drops_the_sass_rule_for_a_ptx_only_record(tmp_path):
    from t4patch.builder.artifacts import record_rules
    from t4patch.builder.record import BuildRecord

    out = tmp_path / "out"
    (out / "build").mkdir(parents=True)
    record = BuildRecord(t4patch="0", command="t4patch build llama.cpp --ptx-only", recipe="llama.cpp",
                         recipe_sha256=None, arch="75", cuda=True, features=[], with_tests=False, ptx_only=True, jobs=1,
                         out=str(out), build_dir=str(out / "build"), log=str(out / "build.log"), requested={}, env={},
                         flags={}, tools={}, host={}, started="2026-12-01T00:00:00+00:00", status="ok")
    (out / "build-record.json").write_text(json.dumps(record.to_dict()))
    rules = record_rules([out])
    assert "sass" not in rules.require and rules.ptx_only  # and the check then wants PTX only, no SASS
    record.ptx_only = False
    (out / "build-record.json").write_text(json.dumps(record.to_dict()))
    assert "sass" in record_rules([out]).require


def test_the_command_line_is_recorded_with_the_flags():
    from t4patch.commands.build import _command_line

    args = argparse.Namespace(engine="llama.cpp", ref=None, source=None, repo=None, jobs=None, out=None, arch="75",
                              feature=[], with_tests=True, ptx_only=True, dry_run=False, json=False)
    assert _command_line(args) == "t4patch build llama.cpp --with-tests --ptx-only"
