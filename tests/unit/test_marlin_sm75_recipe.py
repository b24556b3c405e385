"""The shipped vllm-marlin-sm75 recipe on the CPU: a torch-extension recipe of the builder that pins vLLM 0.33.0's
sdist, builds PTX for compute_75 only with a T4's host values, and registers vLLM's three Marlin ops under their
own namespace. No nvcc, no sdist: the builder's own steps on a synthetic archive are
tests/unit/test_builder_extension.py; the real sdist is tests/integration/test_marlin_sm75_sdist.py.
"""

from __future__ import annotations

import pytest

from t4patch.builder.plan import plan_build
from t4patch.builder.recipe import load_recipe, recipe_names
from t4patch.engines.vllm import marlin_sm75 as m

MARLIN = "csrc/quantization/marlin/marlin.cu"


def shipped():
    recipe = load_recipe(m.RECIPE_NAME)
    assert recipe.extension is not None
    return recipe, recipe.extension


def test_it_is_a_build_target_of_the_builder():
    assert m.RECIPE_NAME in recipe_names()
    recipe, _ = shipped()
    assert recipe.kind == "torch-extension" and recipe.path.parent.name == m.RECIPE_NAME


def test_shipped_recipe_pins_the_sdist_ptx_only_and_the_t4():
    _, spec = shipped()
    assert spec.sdist_sha256 == "f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112"
    assert (spec.distribution, spec.version, spec.sdist_env) == ("vllm", "0.33.0", "T4PATCH_VLLM_SDIST")
    assert spec.gencode == "arch=compute_75,code=compute_75"
    assert "-static-global-template-stub=false" in spec.flags
    emu = spec.emulation
    assert (emu.capability, emu.max_shared_memory_per_block_optin, emu.multiprocessors) == ((7, 5), 65536, 40)
    assert spec.patched_path == MARLIN and MARLIN in dict(spec.files)
    assert spec.namespace == "_t4patch_marlin_sm75" and spec.bindings == "csrc/torch_bindings.cpp"
    assert set(spec.ops) == {"marlin_gemm", "gptq_marlin_repack", "awq_marlin_repack"}
    assert len([s for s in spec.sources if "sm75_kernel_" in s]) == 7
    assert spec.generate_imports == ("jinja2",)
    assert spec.source_hash() == shipped()[1].source_hash()  # deterministic


def test_shipped_diff_only_adds_guarded_overrides():
    _, spec = shipped()
    lines = spec.diff_path.read_text().splitlines()
    added = [ln[1:] for ln in lines if ln.startswith("+") and not ln.startswith("+++")]
    removed = [ln for ln in lines if ln.startswith("-") and not ln.startswith("---")]
    assert removed == []
    assert [ln for ln in added if ln.startswith("#ifdef")] == [
        "#ifdef T4PATCH_EMULATED_MAX_SHARED_MEM  // t4patch: choose as a T4 does (65536)",
        "#ifdef T4PATCH_EMULATED_CAPABILITY_MAJOR  // t4patch: a T4 is 7.5 (stages = 2)",
        "#ifdef T4PATCH_EMULATED_SMS  // t4patch: a T4's 40 SMs set the partitioning",
    ]
    assert sorted(spec.emulation.defines()) == sorted([
        "-DT4PATCH_EMULATED_CAPABILITY_MAJOR=7", "-DT4PATCH_EMULATED_CAPABILITY_MINOR=5",
        "-DT4PATCH_EMULATED_MAX_SHARED_MEM=65536", "-DT4PATCH_EMULATED_SMS=40"])


def test_the_plan_builds_every_source_as_compute_75_ptx_into_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    recipe, spec = shipped()
    plan = plan_build(recipe, nvcc="/opt/cuda/bin/nvcc")
    assert plan.out.parent == tmp_path / "t4patch" / "extensions" / m.RECIPE_NAME and plan.ptx_only
    compile_step = next(s for s in plan.steps if s.name == "compile")
    assert len(compile_step.batch) == len(spec.sources) + 1  # + the registration file
    for argv in compile_step.batch:
        assert argv[0] == "/opt/cuda/bin/nvcc" and argv[argv.index("-gencode") + 1] == spec.gencode
        assert "-D_C=_t4patch_marlin_sm75" in argv and "-DT4PATCH_EMULATED_MAX_SHARED_MEM=65536" in argv
    link = next(s for s in plan.steps if s.name == "link")
    assert "-nodlink" in link.argv and link.argv[link.argv.index("-o") + 1].endswith("libt4patch_marlin_sm75.so")


def test_the_loader_refuses_a_library_without_the_ops(tmp_path):
    pytest.importorskip("torch")
    from t4patch.errors import BuildError

    lib = m.MarlinLibrary(tmp_path / "missing.so", False, "0.33.0", "arch=compute_75,code=compute_75",
                          "_t4patch_marlin_sm75", ("marlin_gemm",), {}, None, 1, tmp_path / "build-record.json")
    with pytest.raises(BuildError, match="does not load into torch") as info:
        m.load_ops(lib)
    assert info.value.hint.endswith("t4patch build vllm-marlin-sm75")


def test_build_dry_run_shows_the_plan_and_refuses_without_the_sdist(tmp_path, monkeypatch, capsys):
    import json

    from t4patch import cli

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("T4PATCH_VLLM_SDIST", raising=False)
    assert cli.main(["build", m.RECIPE_NAME, "--dry-run", "--json"]) == 14  # the preflight: no sdist here
    doc = json.loads(capsys.readouterr().out)
    assert [s["name"] for s in doc["plan"]["steps"]] == ["unpack", "generate", "register", "compile", "link"]
    assert doc["plan"]["ptx_only"] and doc["plan"]["out"].startswith(str(tmp_path / "t4patch" / "extensions"))
    checks = {c["name"]: c for c in doc["preflight"]}
    assert {"nvcc", "torch", "cublas header", "generator", "source archive", "disk"} <= set(checks)
    assert not checks["source archive"]["ok"] and "T4PATCH_VLLM_SDIST=PATH" in checks["source archive"]["fix"]
    assert not any(p.is_file() for p in tmp_path.rglob("*"))  # a dry run writes nothing
