"""Recipe validation: the shipped recipes load, and every kind of mistake in a recipe is refused by name."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from t4patch.builder.recipe import load_recipe, parse_recipe, recipe_names
from t4patch.data.locations import data_dir
from t4patch.data.tomlcompat import tomllib
from t4patch.errors import DataFileError, UsageError


def _doc(name: str = "llama.cpp") -> dict:
    return tomllib.loads((data_dir("recipes") / f"{name}.toml").read_text())


def test_shipped_recipes_load() -> None:
    assert {"llama.cpp", "mistral.rs"} <= set(recipe_names())
    llama = load_recipe("llama.cpp")
    assert llama.default_ref == "7182ef71e" and llama.repository.endswith("ggml-org/llama.cpp")
    assert llama.require == ("sass",) and llama.cpu_variant
    configure = llama.steps[0]
    assert "-DCMAKE_CUDA_ARCHITECTURES={arch}" in configure.cuda_argv
    assert "-DGGML_NATIVE=OFF" in configure.argv and "-DCMAKE_BUILD_TYPE=Release" in configure.argv
    mistral = load_recipe("mistral.rs")
    assert mistral.default_ref == "v0.9.5"
    assert mistral.cuda_env["CUDA_COMPUTE_CAP"] == "{arch}"
    assert mistral.feature_min_arch == {"flash-attn": 80, "flash-attn-v3": 90}
    assert mistral.optional_features == ("cudnn", "flash-attn") and "flash-attn-v3" not in mistral.optional_features
    assert llama.tools["cc"] == "9" and mistral.tools["c++"] == "9"
    assert mistral.require == ("ptx-text",)


def test_unknown_recipe_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="no build recipe named 'vllm'"):
        load_recipe("vllm")


def _mutations():
    def set_(path, value):
        def f(doc):
            target = doc
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = value
        return f

    def delete(*path):
        def f(doc):
            target = doc
            for key in path[:-1]:
                target = target[key]
            del target[path[-1]]
        return f

    return {
        "schema 2": (set_(["schema"], 2), "schema 2 is not supported"),
        "unknown top key": (set_(["colour"], "red"), "unknown key"),
        "missing repository": (delete("repository"), "repository: missing required key 'repository'"),
        "bad ref": (set_(["default_ref"], "main; rm -rf /"), "not a plain tag"),
        "bad repo url": (set_(["repository"], "ftp://x"), "not a git URL"),
        "escaping build dir": (set_(["build_dir"], "../x"), "relative path inside"),
        "unknown placeholder": (set_(["step", 0, "argv"], ["cmake", "-S", "{src}"]), "unknown placeholder {src}"),
        "typo step key": (set_(["step", 0, "cuda_args"], ["-DX=1"]), "unknown key"),
        "bad progress": (set_(["step", 0, "progress"], "percent"), "progress 'percent'"),
        "reserved step name": (set_(["step", 0, "name"], "clone"), "duplicated or reserved"),
        "no steps": (set_(["step"], []), "at least one"),
        "bad require": (set_(["artifacts", "require"], ["cubin"]), "require 'cubin'"),
        "absolute artifact": (set_(["artifacts", "files"], ["/usr/bin/x"]), "relative to the build directory"),
        "unknown tool": (set_(["tools", "bazel"], "1.0"), "unknown tool 'bazel'"),
        "bad version": (set_(["tools", "cmake"], "new"), "not like '3.18'"),
        "unknown library": (set_(["cuda", "libraries"], ["cufft"]), "unknown library 'cufft'"),
        "bad env name": (set_(["cuda_env"], {"CUDA CAP": "75"}), "not an environment variable name"),
        "bad regex": (set_(["known_failure", 0, "pattern"], "(unclosed"), "not a valid regular expression"),
        "bool as number": (set_(["min_free_gib"], True), "min_free_gib: expected a number, found a boolean"),
    }


@pytest.mark.parametrize("case", sorted(_mutations()))
def test_invalid_recipes_are_refused(case: str) -> None:
    mutate, message = _mutations()[case]
    doc = copy.deepcopy(_doc())
    mutate(doc)
    with pytest.raises(DataFileError, match=message) as info:
        parse_recipe(doc, data_dir("recipes") / "llama.cpp.toml")
    assert "\n" not in str(info.value)


def test_name_must_match_file(tmp_path: Path) -> None:
    with pytest.raises(DataFileError, match="does not match the file name"):
        parse_recipe(_doc(), tmp_path / "other.toml")


def test_features_without_placeholder_are_refused() -> None:
    doc = _doc("mistral.rs")
    doc["step"][0]["cuda_argv"] = []
    with pytest.raises(DataFileError, match="no step passes {features}"):
        parse_recipe(doc, data_dir("recipes") / "mistral.rs.toml")
