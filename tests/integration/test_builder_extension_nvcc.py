"""A torch-extension recipe built for real: nvcc, this interpreter's torch headers, the builder's pipeline.

A small synthetic sdist (one kernel source, a generator that writes a second one, a bindings file with ``ops.def``
calls, a one-hunk change) goes through ``ensure_built`` exactly as vLLM's Marlin does: preflight, the pinned
archive, the exact diff, the generator, the registration, the parallel nvcc compiles with the recipe's flags
(``-static-global-template-stub=false``, ``-Xcompiler -fPIC``, the emulation defines), the ``-nodlink`` link, the
fatbin read back by t4patch's own reader (PTX compute_75 only, no SASS), the typed record, and the library loaded
into torch with its op registered under the recipe's namespace. Needs nvcc on PATH and torch's stable-ABI headers
(a few seconds); without them it is skipped. A cuBLAS header is not needed by these sources: an empty one stands in.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import pytest

from t4patch.builder.extension_build import ensure_built, toolchain_for
from t4patch.builder.recipe import load_recipe_file
from t4patch.cuda.fatbin import cuda_architectures
from tests.helpers import needs_nvcc

torch = pytest.importorskip("torch")

KERNEL = "csrc/demo/kernel.cu"
GEN = "csrc/demo/gen.py"
BINDINGS = "csrc/bindings.cpp"
KERNEL_TEXT = (
    "__global__ void demo_scale(float* x, int n) {\n"
    "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  int sms = 80;\n"
    "  if (i < n) x[i] *= (float)sms;\n"
    "}\n"
    "void demo_launch(float* x, int n) { demo_scale<<<(n + 31) / 32, 32>>>(x, n); }\n"
)
DIFF = (
    f"--- a/{KERNEL}\n+++ b/{KERNEL}\n@@ -2,3 +2,6 @@\n"
    "   int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "   int sms = 80;\n"
    "+#ifdef T4PATCH_EMULATED_SMS\n+  sms = T4PATCH_EMULATED_SMS;\n+#endif\n"
    "   if (i < n) x[i] *= (float)sms;\n"
)
GEN_TEXT = (
    "import os, sys\n"
    "open(os.path.join(sys.argv[2], 'sm75_kernel_demo.cu'), 'w').write(\n"
    "    '__global__ void demo_generated(float* x) { x[threadIdx.x] += 1.0f; }\\n')\n"
)
BINDINGS_TEXT = 'ops.def("demo_add(Tensor a, Tensor b) -> Tensor");\nops.def("unused(Tensor a) -> Tensor");\n'
FILES = {KERNEL: KERNEL_TEXT, GEN: GEN_TEXT, BINDINGS: BINDINGS_TEXT}


def sha(data: str | bytes) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def patched() -> str:
    return KERNEL_TEXT.replace("  int sms = 80;\n", "  int sms = 80;\n#ifdef T4PATCH_EMULATED_SMS\n  sms = T4PATCH_EMULATED_SMS;\n#endif\n")


@pytest.fixture
def demo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    archive = tmp_path / "demo-1.0.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for rel, text in FILES.items():
            info = tarfile.TarInfo(f"demo-1.0/{rel}")
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    rdir = tmp_path / "recipes" / "demo-ext"
    rdir.mkdir(parents=True)
    (rdir / "0001.diff").write_text(DIFF)
    pins = ",\n".join(f'  ["{p}", "{sha(t)}"]' for p, t in FILES.items())
    (rdir / "recipe.toml").write_text(f"""schema = 1
name = "demo-ext"
kind = "torch-extension"
summary = "a demo torch extension, compute_75 PTX only"
min_free_gib = 0

[cuda]
tools = {{ nvcc = "12.8" }}

[source]
distribution = "demo"
version = "1.0"
sdist = "demo-1.0.tar.gz"
sdist_sha256 = "{sha(archive.read_bytes())}"
root = "demo-1.0"
env = "T4PATCH_DEMO_SDIST"
files = [
{pins}
]

[change]
diff = "0001.diff"
patched_sha256 = "{sha(patched())}"

[emulate]
capability = [7, 5]
max_shared_memory_per_block_optin = 65536
multiprocessors = 40
source = "a Tesla T4"

[generate]
script = "{GEN}"
args = ["7.5"]
outputs = ["sm75_kernel_demo.cu"]

[compile]
gencode = "arch=compute_75,code=compute_75"
sources = ["{KERNEL}", "csrc/demo/sm75_kernel_demo.cu"]
flags = ["-std=c++17", "-O3", "-Xcompiler", "-fPIC", "-static-global-template-stub=false", "-DUSE_CUDA"]
include_dirs = ["csrc"]
bindings = "{BINDINGS}"
namespace = "_t4patch_demo_ext"
ops = ["demo_add"]
library = "libt4patch_demo_ext.so"
""")
    (tmp_path / "cublas").mkdir()
    (tmp_path / "cublas" / "cublas_v2.h").write_text("")
    monkeypatch.setenv("T4PATCH_CUBLAS_INCLUDE", str(tmp_path / "cublas"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    recipe = load_recipe_file(rdir / "recipe.toml")
    tc = toolchain_for(recipe)
    if tc.torch_include is None:
        pytest.skip("this interpreter's torch has no stable-ABI headers")
    return recipe, archive


@needs_nvcc
def test_a_real_build_is_ptx_only_loads_into_torch_and_is_reused(demo):
    recipe, archive = demo
    err = io.StringIO()
    built = ensure_built(recipe, source=archive, jobs=2, stream=err)
    assert built.record.ok and not built.cached, err.getvalue()
    summary = cuda_architectures(built.library)  # t4patch's own reader, on what nvcc really wrote
    assert summary.ptx == {"compute_75"} and not summary.sass
    facts = built.record.extension
    assert facts["fatbin"]["ptx"] == ["compute_75"] and facts["fatbin"]["sass"] == []
    assert facts["library"]["sha256"] == sha(built.library.read_bytes())
    assert facts["schemas"] == {"demo_add": "demo_add(Tensor a, Tensor b) -> Tensor"}
    assert (built.record_path.parent / "src" / KERNEL).read_text() == patched()
    assert "[3/3]" in err.getvalue()  # kernel, generated kernel, registration: progress per file
    torch.ops.load_library(str(built.library))
    assert hasattr(torch.ops._t4patch_demo_ext, "demo_add")  # the schema from the archive, registered
    assert ensure_built(recipe, source=archive, stream=io.StringIO()).cached
