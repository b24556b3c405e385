"""A torch-extension recipe through the builder, on the CPU: the recipe checks, the pinned archive, the exact source
change, the generator and registration steps, the PTX-only commands, a whole build through the same pipeline
(preflight, log, typed record) and the cache rule. No real nvcc: a script stands in for it (it writes its -o
file), and the fatbin reader is handed the code the library would carry. The real vLLM recipe is
tests/unit/test_marlin_sm75_recipe.py; a real nvcc build is tests/integration/test_builder_extension_nvcc.py.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from t4patch.builder import extension as ext
from t4patch.builder import sdist as sd
from t4patch.builder.extension_build import cached_build, ensure_built, toolchain_for
from t4patch.builder.plan import plan_build
from t4patch.builder.recipe import load_recipe_file, parse_recipe
from t4patch.cuda.fatbin import FatbinEntry, FatbinSummary
from t4patch.data.tomlcompat import tomllib
from t4patch.errors import BuildError, DataFileError, ForeignFileError, ToolMissingError, UsageError, VerificationError

NAME = "demo-ext"
MARLIN = "csrc/k/marlin.cu"
GEN = "csrc/k/generate_kernels.py"
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
    'ops.def("other(Tensor x) -> Tensor");\n'
)
DIFF = (
    f"--- a/{MARLIN}\n+++ b/{MARLIN}\n@@ -2,2 +2,5 @@\n"
    "   cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_index);\n"
    "+#ifdef T4PATCH_EMULATED_SMS\n+  sms = T4PATCH_EMULATED_SMS;\n+#endif\n"
    " int b;\n"
)
PATCHED = MARLIN_TEXT.replace("int b;\n", "#ifdef T4PATCH_EMULATED_SMS\n  sms = T4PATCH_EMULATED_SMS;\n#endif\nint b;\n")
FILES = {MARLIN: MARLIN_TEXT, GEN: GEN_TEXT, BINDINGS: BINDINGS_TEXT}
FAKE_NVCC = """#!/bin/sh
case "$1" in
  --version) echo "Cuda compilation tools, release 13.0, V13.0.88"; exit 0;;
  --list-gpu-code) echo sm_75; echo sm_80; exit 0;;
esac
out=""
prev=""
for a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done
echo "fake nvcc $*"
[ -n "$FAKE_NVCC_FAIL" ] && case "$*" in *"$FAKE_NVCC_FAIL"*) echo "error: planted" ; exit 2;; esac
printf '\\177ELF fake' > "$out"
"""


def sha(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def recipe_text(sdist_sha: str, files=FILES, gencode="arch=compute_75,code=compute_75", patched=None, extra="",
                bindings=BINDINGS) -> str:
    pins = ",\n".join(f'  ["{p}", "{sha(t)}"]' for p, t in files.items())
    return f"""schema = 1
name = "{NAME}"
kind = "torch-extension"
summary = "a test extension"
min_free_gib = 0
{extra}
[cuda]
tools = {{ nvcc = "12.8" }}

[source]
distribution = "vllm"
version = "0.33.0"
sdist = "vllm-0.33.0.tar.gz"
sdist_sha256 = "{sdist_sha}"
root = "vllm-0.33.0"
env = "T4PATCH_TEST_SDIST"
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
sources = ["{MARLIN}", "csrc/k/sm75_kernel_x.cu"]
flags = ["-O3", "-static-global-template-stub=false"]
include_dirs = ["csrc"]
bindings = "{bindings}"
namespace = "_t4patch_demo"
ops = ["marlin_gemm", "gptq_marlin_repack"]
library = "libt4patch_demo.so"
"""


def make_sdist(tmp: Path, files=FILES) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
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
    sdist = make_sdist(tmp_path / "dl")
    rdir = tmp_path / "recipes" / NAME
    rdir.mkdir(parents=True)
    (rdir / "0001.diff").write_text(DIFF)
    (rdir / "recipe.toml").write_text(recipe_text(sha(sdist.read_bytes())))
    return load_recipe_file(rdir / "recipe.toml"), sdist


def reparse(recipe, text: str):
    return parse_recipe(tomllib.loads(text), recipe.path, text.encode())


def test_the_recipe_is_one_recipe_of_kind_torch_extension(synthetic):
    recipe, _ = synthetic
    assert recipe.kind == "torch-extension" and recipe.extension is not None
    assert recipe.artifact_files == recipe.cuda_artifacts == ("libt4patch_demo.so",)
    assert recipe.cuda_tools == {"nvcc": "12.8"} and recipe.extension.arch_digits == "75"


def test_archive_sources_are_read_and_checked(synthetic):
    recipe, sdist = synthetic
    sources, origin = sd.read_sources(recipe.extension, sdist)
    assert sources[MARLIN] == MARLIN_TEXT.encode() and origin["sdist_sha256"] == sha(sdist.read_bytes())


def test_a_different_archive_is_refused(synthetic, tmp_path):
    recipe, _ = synthetic
    other = make_sdist(tmp_path / "other", {**FILES, MARLIN: MARLIN_TEXT + "//\n"})
    with pytest.raises(ForeignFileError, match="hashes to"):
        sd.read_sources(recipe.extension, other)


def test_an_edited_tree_file_is_refused_by_name(synthetic, tmp_path):
    recipe, _ = synthetic
    root = tmp_path / "tree" / "vllm-0.33.0"
    for rel, text in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    assert sd.read_sources(recipe.extension, tmp_path / "tree")[1]["kind"] == "directory"
    (root / GEN).write_text(GEN_TEXT + "# edited\n")
    with pytest.raises(ForeignFileError, match="generate_kernels.py hashes to"):
        sd.read_sources(recipe.extension, tmp_path / "tree")
    (root / GEN).unlink()
    with pytest.raises(ForeignFileError, match="missing"):
        sd.read_sources(recipe.extension, tmp_path / "tree")


def test_the_sdist_is_looked_for_in_the_cache_rule_folder(synthetic, tmp_path, monkeypatch):
    recipe, _ = synthetic
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("T4PATCH_TEST_SDIST", raising=False)
    assert sd.sdist_path(recipe.extension) == tmp_path / "xdg" / "t4patch" / "sdists" / "vllm-0.33.0.tar.gz"
    monkeypatch.setenv("T4PATCH_TEST_SDIST", str(tmp_path / "given.tar.gz"))
    assert sd.sdist_path(recipe.extension) == tmp_path / "given.tar.gz"


def test_source_hash_follows_every_input(synthetic):
    recipe, sdist = synthetic
    base = recipe.extension.source_hash()
    rdir = recipe.path.parent
    (rdir / "recipe.toml").write_text(recipe_text(sha(sdist.read_bytes()), files={**FILES, GEN: GEN_TEXT + "#\n"}))
    assert load_recipe_file(rdir / "recipe.toml").extension.source_hash() != base
    (rdir / "recipe.toml").write_text(recipe_text(sha(sdist.read_bytes())))
    assert load_recipe_file(rdir / "recipe.toml").extension.source_hash() == base
    (rdir / "0001.diff").write_text(DIFF.replace("T4PATCH_EMULATED_SMS;", "T4PATCH_EMULATED_SMS; "))
    assert load_recipe_file(rdir / "recipe.toml").extension.source_hash() != base


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"gencode": "arch=compute_75,code=sm_75"}, "PTX only"),
        ({"extra": "surprise = 1"}, "unknown key 'surprise'"),
        ({"files": {GEN: GEN_TEXT, BINDINGS: BINDINGS_TEXT}}, "must change exactly one file listed"),
        ({"bindings": "csrc/other.cpp"}, "compile.bindings csrc/other.cpp is not pinned"),
        ({"extra": 'kind2 = "x"'}, "unknown key 'kind2'"),
    ],
)
def test_bad_recipes_are_refused(synthetic, change, message):
    recipe, sdist = synthetic
    with pytest.raises(DataFileError, match=message):
        reparse(recipe, recipe_text(sha(sdist.read_bytes()), **change))


def test_an_unknown_kind_and_an_unpinned_source_are_refused(synthetic):
    recipe, sdist = synthetic
    text = recipe_text(sha(sdist.read_bytes()))
    with pytest.raises(DataFileError, match="kind 'cmake-extension' is not one"):
        reparse(recipe, text.replace('kind = "torch-extension"', 'kind = "cmake-extension"'))
    with pytest.raises(DataFileError, match="neither pinned nor a generator output"):
        reparse(recipe, text.replace('"csrc/k/sm75_kernel_x.cu"]', '"csrc/other.cu"]'))


def test_the_tree_gets_the_exact_change(synthetic, tmp_path):
    recipe, sdist = synthetic
    sources, _ = sd.read_sources(recipe.extension, sdist)
    ext.write_tree(recipe.extension, sources, tmp_path / "src")
    assert (tmp_path / "src" / MARLIN).read_text() == PATCHED
    assert (tmp_path / "src" / GEN).read_text() == GEN_TEXT


def test_patched_hash_mismatch_is_a_build_error(synthetic, tmp_path):
    recipe, sdist = synthetic
    bad = reparse(recipe, recipe_text(sha(sdist.read_bytes()), patched="0" * 64))
    sources, _ = sd.read_sources(bad.extension, sdist)
    with pytest.raises(BuildError, match="hashes to"):
        ext.write_tree(bad.extension, sources, tmp_path / "src")


def test_op_schemas_need_exactly_one_definition_each():
    assert ext.op_schemas(BINDINGS_TEXT, ("marlin_gemm",)) == {"marlin_gemm": "marlin_gemm(Tensor a, int b_type_id) -> Tensor"}
    with pytest.raises(BuildError, match="found 0"):
        ext.op_schemas(BINDINGS_TEXT, ("missing_op",))
    with pytest.raises(BuildError, match="found 2"):
        ext.op_schemas(BINDINGS_TEXT + 'ops.def("other(Tensor y) -> Tensor");', ("other",))


def fake_toolchain(tmp: Path) -> ext.Toolchain:
    return ext.Toolchain(nvcc=str(tmp / "nvcc"), nvcc_version="13.0.88", torch_version="2.11.0",
                         torch_include=tmp / "inc", torch_libraries=(tmp / "lib" / "libtorch_cpu.so",),
                         cublas_include=tmp / "cublas", python="python3", python_abi="cpython-312")


def test_compile_and_link_commands_are_ptx_only_with_the_emulation(synthetic, tmp_path):
    recipe, _ = synthetic
    tc = fake_toolchain(tmp_path)
    commands = ext.compile_commands(recipe.extension, tc, tmp_path / "src", tmp_path / "obj")
    assert [label for label, _ in commands][-1] == ext.REGISTRATION
    for _, argv in commands:
        assert argv[argv.index("-gencode") + 1] == "arch=compute_75,code=compute_75"
        assert "-D_C=_t4patch_demo" in argv and "-DT4PATCH_EMULATED_SMS=40" in argv
    link = ext.link_command(recipe.extension, tc, [tmp_path / "a.o"], tmp_path / "x.so")
    assert "-nodlink" in link and "-ltorch_cpu" in link


def test_the_plan_is_named_by_the_cache_key_and_refuses_what_does_not_apply(synthetic, tmp_path, monkeypatch):
    recipe, _ = synthetic
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    tc = fake_toolchain(tmp_path)
    plan = plan_build(recipe, toolchain=tc)
    key = ext.cache_key(recipe.extension, tc)
    assert plan.out == tmp_path / "xdg" / "t4patch" / "extensions" / NAME / key[:16] and plan.ptx_only
    assert [s.name for s in plan.steps] == ["unpack", "generate", "register", "compile", "link"]
    assert len(plan.steps[3].batch) == 3 and plan.steps[0].commands() == ()
    assert ext.cache_key(recipe.extension, ext.Toolchain(**{**tc.__dict__, "torch_version": "2.13.0"})) != key
    with pytest.raises(UsageError, match="compute_75 only"):
        plan_build(recipe, arch="80", toolchain=tc)
    with pytest.raises(UsageError, match="--ref"):
        plan_build(recipe, ref="v1", toolchain=tc)


@pytest.fixture
def host(synthetic, tmp_path, monkeypatch):
    """A machine with the stand-in nvcc, a cuBLAS header, torch (the venv's) and a cache under tmp_path."""
    import t4patch.verify.artifacts.check as check

    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "nvcc").write_text(FAKE_NVCC)
    (bindir / "nvcc").chmod(0o755)
    (tmp_path / "cublas").mkdir()
    (tmp_path / "cublas" / "cublas_v2.h").write_text("")
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    monkeypatch.setenv("T4PATCH_CUBLAS_INCLUDE", str(tmp_path / "cublas"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(check, "find_cuobjdump", lambda: None)
    code = {"entries": (FatbinEntry("ptx", 75, 0, "none", 10, True),)}
    monkeypatch.setattr(check, "cuda_architectures", lambda path: FatbinSummary(
        Path(path), "elf", (".nv_fatbin",), 1, code["entries"]) if Path(path).name.endswith(".so") else
        FatbinSummary(Path(path), "other", (), 0, ()))
    recipe, sdist = synthetic
    if toolchain_for(recipe).torch_include is None:
        pytest.skip("this interpreter's torch has no stable-ABI headers")
    return recipe, sdist, code


def test_a_whole_build_runs_through_the_builder_and_is_cached(host):
    recipe, sdist, _ = host
    err = io.StringIO()
    built = ensure_built(recipe, source=sdist, stream=err)
    assert not built.cached and built.library.is_file() and built.record.ok
    steps = [s["name"] for s in built.record.steps]
    assert steps == ["unpack", "generate", "register", "compile", "compile", "compile", "link"]
    # what ran is what the dry run shows, command for command (the two t4patch steps run no command)
    dry = json.loads(json.dumps(plan_build(recipe, source_dir=sdist, toolchain=toolchain_for(recipe)).to_dict()))
    shown = [argv for s in dry["steps"] if "action" not in s for argv in s.get("batch", [s["argv"]])]
    assert [s["argv"] for s in built.record.steps if s["argv"]] == shown
    facts = built.record.extension
    assert facts["fatbin"]["ptx"] == ["compute_75"] and facts["fatbin"]["sass"] == []
    assert facts["schemas"] == {"marlin_gemm": "marlin_gemm(Tensor a, int b_type_id) -> Tensor",
                                "gptq_marlin_repack": "gptq_marlin_repack(Tensor b_q_weight, SymInt size_k) -> Tensor"}
    assert facts["emulation"]["capability"] == "7.5" and "-DT4PATCH_EMULATED_SMS=40" in facts["compile_flags"]
    assert built.record.source == {"kind": "sdist", "path": str(sdist), "archive_sha256": sha(sdist.read_bytes()),
                                   "pinned_files": 3}
    tree = built.record_path.parent / "src"
    assert (tree / MARLIN).read_text() == PATCHED and 'ops.def("marlin_gemm(' in (tree / ext.REGISTRATION).read_text()
    log = (built.record_path.parent / "build.log").read_text()
    assert "fake nvcc -c" in log and "### t4patch step unpack: 3 pinned files" in log
    assert "[3/3]" in err.getvalue()  # progress of the parallel compiles
    # the second call finds it; a changed library is not trusted (and then needs the archive again)
    again = ensure_built(recipe, stream=io.StringIO(), source=sdist)
    assert again.cached and again.library == built.library
    built.library.write_bytes(b"\x7fELF other")
    plan = plan_build(recipe, source_dir=sdist, toolchain=toolchain_for(recipe))
    assert cached_build(plan)[0] is None and "changed" in cached_build(plan)[1]
    (built.record_path).write_text("[1, 2]")
    assert cached_build(plan)[0] is None and "JSON object" in cached_build(plan)[1]


def test_sass_in_the_library_fails_the_build_and_the_record_says_so(host):
    recipe, sdist, code = host
    code["entries"] = (FatbinEntry("ptx", 75, 0, "none", 10, True), FatbinEntry("sass", 75, 0, "none", 10, True))
    with pytest.raises(VerificationError, match="PTX-only build carries SASS for sm_75"):
        ensure_built(recipe, source=sdist, stream=io.StringIO())
    plan = plan_build(recipe, source_dir=sdist, toolchain=toolchain_for(recipe))
    doc = json.loads(plan.record_path.read_text())
    assert doc["status"] == "failed" and "SASS" in doc["error"] and cached_build(plan)[0] is None


def test_a_failed_compile_names_the_log_and_keeps_the_record(host, monkeypatch):
    recipe, sdist, _ = host
    monkeypatch.setenv("FAKE_NVCC_FAIL", "sm75_kernel_x.cu")
    err = io.StringIO()
    with pytest.raises(BuildError, match="step 'compile' failed .* log: .*build.log"):
        ensure_built(recipe, source=sdist, stream=err)
    assert "error: planted" in err.getvalue()  # the failed command's own output, shown
    plan = plan_build(recipe, source_dir=sdist, toolchain=toolchain_for(recipe))
    assert json.loads(plan.record_path.read_text())["status"] == "failed"


def test_the_preflight_names_every_missing_piece_before_anything_runs(host, tmp_path, monkeypatch):
    recipe, _, _ = host
    monkeypatch.delenv("T4PATCH_CUBLAS_INCLUDE")
    monkeypatch.setattr(ext, "cublas_candidates", lambda nvcc, roots=(): [tmp_path / "nowhere"])
    with pytest.raises(ToolMissingError, match="preflight failed .*cublas header, source archive"):
        ensure_built(recipe, source=tmp_path / "no-such.tar.gz", stream=io.StringIO())
    assert not list((tmp_path / "xdg").rglob("build.log"))  # nothing ran


def test_a_second_build_into_the_same_directory_is_refused(host):
    from t4patch.builder.pipeline import output_lock
    from t4patch.errors import LockBusyError

    recipe, sdist, _ = host
    plan = plan_build(recipe, source_dir=sdist, toolchain=toolchain_for(recipe))
    plan.out.mkdir(parents=True)
    with output_lock(plan.out, "t4patch build demo-ext"), pytest.raises(LockBusyError, match="another build is writing"):
        ensure_built(recipe, source=sdist, stream=io.StringIO())
    assert ensure_built(recipe, source=sdist, stream=io.StringIO()).record.ok  # free again: it builds
