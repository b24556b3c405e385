"""Command planning per architecture: the exact argv and environment each recipe produces."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from t4patch.builder.plan import RESOLVE_STEP, StepOutput, commands, plan_build
from t4patch.builder.recipe import load_recipe
from t4patch.errors import ToolMissingError, UsageError


@pytest.fixture()
def src(tmp_path: Path) -> Path:
    d = tmp_path / "src"
    d.mkdir()
    return d


def test_llama_cpp_sm75(src: Path, tmp_path: Path) -> None:
    plan = plan_build(load_recipe("llama.cpp"), arch="75", jobs=16, out=tmp_path / "out", source_dir=src,
                      nvcc="/opt/cuda/bin/nvcc")
    assert [s.name for s in plan.steps] == ["configure", "build"]
    configure, build = plan.steps
    assert configure.argv[:7] == ("cmake", "-S", str(src), "-B", str(tmp_path / "out" / "build"), "-G", "Ninja")
    for flag in ("-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=75", "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=OFF",
                 "-DCMAKE_CUDA_COMPILER=/opt/cuda/bin/nvcc"):
        assert flag in configure.argv
    assert not any("virtual" in a for a in configure.argv)  # real SASS, never llama.cpp's 75-virtual default
    assert build.argv[:6] == ("cmake", "--build", str(tmp_path / "out" / "build"), "--config", "Release", "-j")
    assert build.argv[6] == "16" and build.progress == "ninja"
    assert plan.env == {} and plan.cuda and plan.arch is not None and plan.arch.name == "sm_75"
    assert plan.flags["configure"] == list(configure.argv[1:])


@pytest.mark.parametrize("arch,expected", [("86", "86"), ("sm_89", "89"), ("9.0", "90"), ("compute_70", "70")])
def test_llama_cpp_other_archs(src: Path, arch: str, expected: str) -> None:
    plan = plan_build(load_recipe("llama.cpp"), arch=arch, source_dir=src)
    assert f"-DCMAKE_CUDA_ARCHITECTURES={expected}" in plan.steps[0].argv


def test_llama_cpp_cpu(src: Path) -> None:
    plan = plan_build(load_recipe("llama.cpp"), arch="cpu", source_dir=src)
    configure = plan.steps[0].argv
    assert "-DGGML_CUDA=OFF" in configure
    assert not any("CUDA_ARCHITECTURES" in a or "CUDA_COMPILER" in a for a in configure)
    assert not plan.cuda and plan.out.name == "llama.cpp-cpu"


def test_mistral_rs_sm75(src: Path, tmp_path: Path) -> None:
    plan = plan_build(load_recipe("mistral.rs"), arch="75", jobs=4, out=tmp_path / "o", source_dir=src,
                      nvcc="/usr/local/cuda/bin/nvcc")
    (step,) = plan.steps
    assert step.argv == ("cargo", "build", "--release", "--locked", "-p", "mistralrs-cli", "-j", "4",
                         "--target-dir", str(tmp_path / "o" / "target"), "--features", "cuda")
    assert step.cwd == src
    assert step.env["CUDA_COMPUTE_CAP"] == "75"
    assert "PATH" not in step.env  # bindgen_cuda runs `nvcc` from the inherited PATH (the preflight checks it)
    assert step.env["CARGO_TERM_PROGRESS_WHEN"] == "always"
    assert "flash-attn" not in " ".join(step.argv)
    shell = step.shell()
    assert "CUDA_COMPUTE_CAP=75" in shell and "--features cuda" in shell


def test_mistral_rs_cudnn_and_flash_attn_gate(src: Path) -> None:
    plan = plan_build(load_recipe("mistral.rs"), arch="75", source_dir=src, features=("cudnn",))
    assert plan.steps[0].argv[-2:] == ("--features", "cuda cudnn")
    with pytest.raises(UsageError, match="needs compute capability 8.0"):
        plan_build(load_recipe("mistral.rs"), arch="75", source_dir=src, features=("flash-attn",))
    for arch in ("80", "86"):  # offered from 8.0 on, as docs/build.md says
        plan = plan_build(load_recipe("mistral.rs"), arch=arch, source_dir=src, features=("flash-attn",))
        assert plan.steps[0].argv[-2:] == ("--features", "cuda flash-attn")
    with pytest.raises(UsageError, match="not offered"):
        plan_build(load_recipe("mistral.rs"), arch="90", source_dir=src, features=("flash-attn-v3",))
    with pytest.raises(UsageError, match="needs compute capability 9.0"):
        plan_build(load_recipe("mistral.rs"), arch="86", source_dir=src, features=("flash-attn-v3",))
    with pytest.raises(UsageError, match="no CPU-only build"):
        plan_build(load_recipe("mistral.rs"), arch="cpu", source_dir=src)


def test_clone_plan_uses_ref_and_repository(tmp_path: Path) -> None:
    plan = plan_build(load_recipe("llama.cpp"), out=tmp_path / "o", ref="b1234", repository="file:///mirror/llama.cpp")
    clone, resolve, checkout = plan.steps[:3]
    src = str(tmp_path / "o" / "src")
    assert clone.argv == ("git", "clone", "--progress", "--no-checkout", "--", "file:///mirror/llama.cpp", src)
    # Resolving the ref is a step of its own: tag, then origin branch (then, for a hex-looking ref, a hash).
    assert resolve.name == RESOLVE_STEP and [c[-1] for c in resolve.lookup] == [
        "refs/tags/b1234^{commit}", "refs/remotes/origin/b1234^{commit}"]
    assert all(c[:4] == ("git", "-C", src, "rev-parse") for c in resolve.lookup)
    # The checkout takes the lookup's output: nothing in the plan is rewritten while it runs.
    assert checkout.argv[-1] == StepOutput(RESOLVE_STEP) and "--detach" in checkout.argv
    assert checkout.inputs() == (RESOLVE_STEP,) and checkout.bind({RESOLVE_STEP: "c0ffee"})[-1] == "c0ffee"
    assert "<output of resolve-ref>" in checkout.shell() and " || " in resolve.shell()
    assert clone.env == resolve.env == {"GIT_TERMINAL_PROMPT": "0"}
    assert commands(plan)[:4] == [clone.argv, *resolve.lookup, checkout.argv]
    default = plan_build(load_recipe("llama.cpp"), out=tmp_path / "p")
    assert [c[-1] for c in default.steps[1].lookup] == [
        "refs/tags/7182ef71e^{commit}", "refs/remotes/origin/7182ef71e^{commit}", "7182ef71e^{commit}"]
    assert default.source.repository == "https://github.com/ggml-org/llama.cpp"


def test_option_errors(src: Path) -> None:
    recipe = load_recipe("llama.cpp")
    with pytest.raises(UsageError, match="exclude each other"):
        plan_build(recipe, ref="x", source_dir=src)
    with pytest.raises(UsageError, match="--jobs 0"):
        plan_build(recipe, jobs=0, source_dir=src)
    for bad in ("7", "sm75x", "turing", "7.5.1", "120", "sm_61"):
        with pytest.raises(UsageError, match="expected one of sm_70, sm_75, .* or cpu") as info:
            plan_build(recipe, arch=bad, source_dir=src)
        assert "\n" not in str(info.value)
    assert plan_build(recipe, arch="CPU", source_dir=src).arch is None
    assert plan_build(recipe, arch="sm75", source_dir=src).arch_text == "75"


def test_dry_run_prints_commands_and_env(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The command's --dry-run output carries the exact argv and env; a failing preflight still fails it."""
    from t4patch.commands import build

    parser = argparse.ArgumentParser()
    build.configure_parser(parser.add_subparsers(dest="command"))
    src = tmp_path / "mistral"
    (src / "mistralrs-cli").mkdir(parents=True)
    (src / "mistralrs-quant").mkdir()
    for marker in ("Cargo.toml", "mistralrs-cli/Cargo.toml", "mistralrs-quant/build.rs"):
        (src / marker).write_text("")
    args = parser.parse_args(["build", "mistral.rs", "--source", str(src), "--out", str(tmp_path / "o"), "--dry-run",
                              "--json", "--jobs", "3"])
    try:
        rc = args.func(args)
    except ToolMissingError:
        rc = 14  # this machine lacks a CUDA library: the dry run still printed its plan first
    doc = json.loads(capsys.readouterr().out)
    assert doc["command"] == "build" and doc["dry_run"] is True
    step = doc["plan"]["steps"][0]
    assert step["env"]["CUDA_COMPUTE_CAP"] == "75"
    assert step["argv"][:8] == ["cargo", "build", "--release", "--locked", "-p", "mistralrs-cli", "-j", "3"]
    assert "CUDA_COMPUTE_CAP=75" in step["shell"]
    assert rc == (0 if doc["preflight_ok"] else 14)
