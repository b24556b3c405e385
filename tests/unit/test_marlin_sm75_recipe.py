"""The vllm-marlin-sm75 build recipe on the CPU: the shipped data, the pins and the source hash, the exact
source change, the generator and schema steps, the PTX-only check and the build cache. No nvcc, no sdist:
a synthetic sdist with its own recipe stands in (the real one is tests/integration/test_marlin_sm75_sdist.py).
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from t4patch.engines.vllm import marlin_sm75 as m
from t4patch.errors import BuildError, DataFileError, ForeignFileError, MissingDependencyError, VerificationError

MARLIN = "csrc/quantization/marlin/marlin.cu"
GEN = "csrc/quantization/marlin/generate_kernels.py"
BINDINGS = "csrc/torch_bindings.cpp"
MARLIN_TEXT = "int a;\n  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_index);\nint b;\n"
GEN_TEXT = (
    "import os, sys\n"
    "out = sys.argv[2]\n"
    "for name in ('sm75_kernel_x.cu', 'kernel_selector.h'):\n"
    "    open(os.path.join(out, name), 'w').write('// ' + sys.argv[1])\n"
)
BINDINGS_TEXT = (
    'ops.def(\n      "marlin_gemm(Tensor a, "\n      "int b_type_id) -> Tensor");\n'
    'ops.def("gptq_marlin_repack(Tensor b_q_weight, SymInt size_k) -> Tensor");\n'
    'ops.def("awq_marlin_repack(Tensor b_q_weight) -> Tensor");\n'
    'ops.def("other(Tensor x) -> Tensor");\n'
)
DIFF = (
    f"--- a/{MARLIN}\n+++ b/{MARLIN}\n@@ -2,2 +2,5 @@\n"
    "   cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_index);\n"
    "+#ifdef T4PATCH_EMULATED_SMS\n+  sms = T4PATCH_EMULATED_SMS;\n+#endif\n"
    " int b;\n"
)
PATCHED = MARLIN_TEXT.replace("int b;\n", "#ifdef T4PATCH_EMULATED_SMS\n  sms = T4PATCH_EMULATED_SMS;\n#endif\nint b;\n")


def sha(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


FILES = {MARLIN: MARLIN_TEXT, GEN: GEN_TEXT, BINDINGS: BINDINGS_TEXT}


def recipe_text(sdist_sha: str, files=FILES, gencode="arch=compute_75,code=compute_75", patched=None, extra="") -> str:
    pins = ",\n".join(f'  ["{p}", "{sha(t)}"]' for p, t in files.items())
    return f"""schema = 1
name = "vllm-marlin-sm75"
{extra}
[source]
distribution = "vllm"
version = "0.33.0"
sdist = "vllm-0.33.0.tar.gz"
sdist_sha256 = "{sdist_sha}"
root = "vllm-0.33.0"
license = "Apache-2.0"
files = [
{pins}
]

[change]
diff = "0001.diff"
patched_sha256 = "{patched or sha(PATCHED)}"

[emulate]
capability = [7, 5]
max_shared_memory_per_block_optin = 65536
multiprocessors = 40
source = "test"

[generate]
script = "{GEN}"
args = ["7.5"]
outputs = ["sm75_kernel_x.cu", "kernel_selector.h"]

[compile]
gencode = "{gencode}"
sources = ["{MARLIN}", "csrc/quantization/marlin/sm75_kernel_x.cu"]
flags = ["-O3", "-static-global-template-stub=false"]
include_dirs = ["csrc"]
namespace = "_t4patch_marlin_sm75"
ops = ["marlin_gemm", "gptq_marlin_repack", "awq_marlin_repack"]
library = "libt4patch_marlin_sm75.so"
"""


def make_sdist(tmp: Path, files=FILES) -> Path:
    path = tmp / "vllm-0.33.0.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        for rel, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"vllm-0.33.0/{rel}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture
def synthetic(tmp_path):
    sdist = make_sdist(tmp_path)
    rdir = tmp_path / "recipe"
    rdir.mkdir()
    (rdir / "0001.diff").write_text(DIFF)
    (rdir / "recipe.toml").write_text(recipe_text(sha(sdist.read_bytes())))
    return m.load_recipe(rdir / "recipe.toml"), sdist


def test_shipped_recipe_pins_the_sdist_ptx_only_and_the_t4():
    recipe = m.load_recipe()
    assert recipe.sdist_sha256 == "f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112"
    assert recipe.gencode == "arch=compute_75,code=compute_75"
    assert "-static-global-template-stub=false" in recipe.flags
    assert (recipe.emulation.capability, recipe.emulation.max_shared_memory_per_block_optin, recipe.emulation.multiprocessors) == ((7, 5), 65536, 40)
    assert recipe.patched_path == MARLIN and MARLIN in dict(recipe.files)
    assert set(recipe.ops) == {"marlin_gemm", "gptq_marlin_repack", "awq_marlin_repack"}
    assert len([s for s in recipe.sources if "sm75_kernel_" in s]) == 7
    assert m.source_hash(recipe) == m.source_hash(m.load_recipe())  # deterministic


def test_shipped_diff_only_adds_guarded_overrides():
    recipe = m.load_recipe()
    added = [ln[1:] for ln in recipe.diff_path.read_text().splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    removed = [ln for ln in recipe.diff_path.read_text().splitlines() if ln.startswith("-") and not ln.startswith("---")]
    assert removed == []
    assert [ln for ln in added if ln.startswith("#ifdef")] == [
        "#ifdef T4PATCH_EMULATED_MAX_SHARED_MEM  // t4patch: choose as a T4 does (65536)",
        "#ifdef T4PATCH_EMULATED_CAPABILITY_MAJOR  // t4patch: a T4 is 7.5 (stages = 2)",
        "#ifdef T4PATCH_EMULATED_SMS  // t4patch: a T4's 40 SMs set the partitioning",
    ]
    assert sorted(recipe.emulation.defines()) == sorted([
        "-DT4PATCH_EMULATED_CAPABILITY_MAJOR=7", "-DT4PATCH_EMULATED_CAPABILITY_MINOR=5",
        "-DT4PATCH_EMULATED_MAX_SHARED_MEM=65536", "-DT4PATCH_EMULATED_SMS=40"])


def test_archive_sources_are_read_and_checked(synthetic):
    recipe, sdist = synthetic
    sources, origin = m.read_sources(recipe, sdist)
    assert sources[MARLIN] == MARLIN_TEXT.encode() and origin["sdist_sha256"] == sha(sdist.read_bytes())


def test_a_different_archive_is_refused(synthetic, tmp_path):
    recipe, _ = synthetic
    (tmp_path / "other").mkdir()
    other = make_sdist(tmp_path / "other", {**FILES, MARLIN: MARLIN_TEXT + "//\n"})
    with pytest.raises(ForeignFileError, match="hashes to"):
        m.read_sources(recipe, other)


def test_an_edited_tree_file_is_refused_by_name(synthetic, tmp_path):
    recipe, _ = synthetic
    root = tmp_path / "tree" / "vllm-0.33.0"
    for rel, text in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    assert m.read_sources(recipe, tmp_path / "tree")[1]["kind"] == "directory"
    (root / GEN).write_text(GEN_TEXT + "# edited\n")
    with pytest.raises(ForeignFileError, match="generate_kernels.py hashes to"):
        m.read_sources(recipe, tmp_path / "tree")
    (root / GEN).unlink()
    with pytest.raises(ForeignFileError, match="missing"):
        m.read_sources(recipe, tmp_path / "tree")


def test_source_hash_follows_every_input(synthetic, tmp_path):
    recipe, sdist = synthetic
    base = m.source_hash(recipe)
    rdir = recipe.path.parent
    (rdir / "recipe.toml").write_text(recipe_text(sha(sdist.read_bytes()), files={**FILES, GEN: GEN_TEXT + "#\n"}))
    assert m.source_hash(m.load_recipe(rdir / "recipe.toml")) != base
    (rdir / "recipe.toml").write_text(recipe_text(sha(sdist.read_bytes())))
    assert m.source_hash(m.load_recipe(rdir / "recipe.toml")) == base
    (rdir / "0001.diff").write_text(DIFF.replace("T4PATCH_EMULATED_SMS;", "T4PATCH_EMULATED_SMS; "))
    assert m.source_hash(m.load_recipe(rdir / "recipe.toml")) != base


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"gencode": "arch=compute_75,code=sm_75"}, "PTX only"),
        ({"extra": "surprise = 1"}, "unknown key 'surprise'"),
        ({"files": {GEN: GEN_TEXT, BINDINGS: BINDINGS_TEXT}}, "must change exactly one file listed"),
    ],
)
def test_bad_recipes_are_refused(synthetic, change, message):
    recipe, sdist = synthetic
    text = recipe_text(sha(sdist.read_bytes()), **change)
    with pytest.raises(DataFileError, match=message):
        m.parse_recipe(text.encode(), recipe.path)


def test_unpinned_source_is_refused(synthetic):
    recipe, sdist = synthetic
    text = recipe_text(sha(sdist.read_bytes())).replace('"csrc/quantization/marlin/sm75_kernel_x.cu"]', '"csrc/other.cu"]')
    with pytest.raises(DataFileError, match="neither pinned nor a generator output"):
        m.parse_recipe(text.encode(), recipe.path)


def test_prepare_tree_applies_the_change_generates_and_registers(synthetic, tmp_path):
    import sys

    recipe, sdist = synthetic
    sources, _ = m.read_sources(recipe, sdist)
    done = m.prepare_tree(recipe, sources, tmp_path / "src", sys.executable, lambda text: None)
    assert (tmp_path / "src" / MARLIN).read_text() == PATCHED
    assert set(done["generated"]) == {"sm75_kernel_x.cu", "kernel_selector.h"}
    reg = (tmp_path / "src" / "t4patch_registration.cpp").read_text()
    assert 'ops.def("marlin_gemm(Tensor a, int b_type_id) -> Tensor");' in reg and "other(" not in reg


def test_patched_hash_mismatch_is_a_build_error(synthetic, tmp_path):
    import sys

    recipe, sdist = synthetic
    bad = m.parse_recipe(recipe_text(sha(sdist.read_bytes()), patched="0" * 64).encode(), recipe.path)
    sources, _ = m.read_sources(bad, sdist)
    with pytest.raises(BuildError, match="hashes to"):
        m.prepare_tree(bad, sources, tmp_path / "src", sys.executable, lambda text: None)


def test_generator_writing_other_files_is_a_build_error(synthetic, tmp_path):
    import sys

    recipe, sdist = synthetic
    sources, _ = m.read_sources(recipe, sdist)
    sources = {**sources, GEN: GEN_TEXT.replace("sm75_kernel_x.cu", "sm80_kernel_y.cu").encode()}
    with pytest.raises(BuildError, match="wrote"):
        m.prepare_tree(recipe, sources, tmp_path / "src", sys.executable, lambda text: None)


def test_op_schemas_need_exactly_one_definition_each():
    assert m.op_schemas(BINDINGS_TEXT, ("marlin_gemm",)) == {"marlin_gemm": "marlin_gemm(Tensor a, int b_type_id) -> Tensor"}
    with pytest.raises(BuildError, match="found 0"):
        m.op_schemas(BINDINGS_TEXT, ("missing_op",))
    with pytest.raises(BuildError, match="found 2"):
        m.op_schemas(BINDINGS_TEXT + 'ops.def("awq_marlin_repack(Tensor x) -> Tensor");', ("awq_marlin_repack",))


def fake_toolchain(tmp: Path) -> m.Toolchain:
    return m.Toolchain(nvcc=tmp / "nvcc", nvcc_version="release 13.0, V13.0.88", torch_version="2.11.0",
                       torch_include=tmp / "inc", torch_libraries=(tmp / "lib" / "libtorch_cpu.so",),
                       cublas_include=tmp / "cublas", python="python3", python_abi="cpython-312")


def test_compile_and_link_commands_are_ptx_only_with_the_emulation(synthetic, tmp_path):
    recipe, _ = synthetic
    tc = fake_toolchain(tmp_path)
    commands = m.compile_commands(recipe, tc, tmp_path / "src", tmp_path / "obj")
    assert [label for label, _ in commands][-1] == "t4patch_registration.cpp"
    for _, argv in commands:
        assert argv[argv.index("-gencode") + 1] == "arch=compute_75,code=compute_75"
        assert "-D_C=_t4patch_marlin_sm75" in argv and "-DT4PATCH_EMULATED_SMS=40" in argv
    link = m.link_command(recipe, tc, [tmp_path / "a.o"], tmp_path / "x.so")
    assert "-nodlink" in link and "-ltorch_cpu" in link


def test_library_with_sass_is_refused(monkeypatch, synthetic, tmp_path):
    from types import SimpleNamespace

    import t4patch.cuda.fatbin as fatbin

    recipe, _ = synthetic
    summary = SimpleNamespace(sass=frozenset({"sm_75"}), ptx=frozenset({"compute_75"}), to_dict=lambda: {})
    monkeypatch.setattr(fatbin, "cuda_architectures", lambda path: summary)
    with pytest.raises(VerificationError, match="PTX for compute_75 only"):
        m.check_library(recipe, tmp_path / "lib.so")
    monkeypatch.setattr(fatbin, "cuda_architectures", lambda path: SimpleNamespace(sass=frozenset(), ptx=frozenset({"compute_75"}), to_dict=lambda: {"ok": 1}))
    assert m.check_library(recipe, tmp_path / "lib.so") == {"ok": 1}


def test_build_is_cached_by_key_and_rebuilt_when_the_key_changes(monkeypatch, synthetic, tmp_path):
    recipe, _ = synthetic
    tc = fake_toolchain(tmp_path)
    monkeypatch.setattr(m, "detect_toolchain", lambda: tc)
    monkeypatch.setenv(m.SDIST_ENV, str(tmp_path / "no-such-sdist"))
    key = m.cache_key(recipe, tc)
    cache = tmp_path / "cache"
    directory = cache / key[:16]
    directory.mkdir(parents=True)
    (directory / recipe.library).write_bytes(b"\x7fELF fake")
    record = {"cache_key": key, "source_hash": m.source_hash(recipe), "library": {"sha256": sha(b"\x7fELF fake")}}
    (directory / m.BUILD_RECORD).write_text(json.dumps(record))
    seen: list[str] = []
    built = m.build(recipe, cache=cache, progress=seen.append)
    assert built.cached and built.library == directory / recipe.library and "cached build" in seen[0]
    # the library changed under the record: not trusted, a rebuild is attempted (and needs the sdist)
    (directory / recipe.library).write_bytes(b"\x7fELF other")
    with pytest.raises(MissingDependencyError, match="sdist"):
        m.build(recipe, cache=cache, progress=seen.append)
    # another toolchain (torch) is another key
    other = m.Toolchain(**{**tc.__dict__, "torch_version": "2.13.0"})
    assert m.cache_key(recipe, other) != key
