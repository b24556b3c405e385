"""vLLM 0003: the INT4 per-token-head KV cache is refused while the attention layers are built (before weights
load) below compute capability 8.0 when its kernel cannot fit the GPU at any KV tile (issue 23.6a).

0002 makes the INT4 launcher (``_launch_packed_attn``) fit or refuse, but only at its first launch: with CUDA
graphs that is the graph warm-up after weights and KV cache are allocated, with ``--enforce-eager`` the first
request. 0003 puts the same verdict where vLLM already refuses fp8 KV below SM89 and bf16 KV below SM80
(``TritonAttentionImpl.__init__``, vllm/v1/attention/backends/triton_attn.py): it compiles ``_attn_packed`` at
the smallest tile the launcher tries (16) for this device with the launcher's constexprs (2D and 3D), and
raises ValueError when even that exceeds ``shared_memory_per_block_optin``.

Proven on the real wheels (0.31.0, 0.32.0, 0.33.0, each with its shipped set applied by t4patch), CPU only:
the real ``vllm`` ops package is imported from the patched tree with vLLM's own Platform class as a CUDA
stand-in of the architecture, torch.cuda device queries answering its opt-in shared memory
(t4patch.verify.attention.device) and Triton's driver compiling for it (t4patch.verify.attention.triton_target).
The backend module itself imports vLLM's heavy dependencies (psutil, pydantic, ...), so its patched
``__init__`` runs from the installed file's own source (parsed, its statements through the capability checks
executed as written, with the module's own AttentionType from vllm/v1/attention/backend.py). The numbers are
the ones ``verify attention`` measures through the launcher itself (tests/integration/test_attention_fit.py,
test_vllm_tile_clamp_error.py): 98,304 B at head 512 with 8 query heads per KV head, 131,072 B with 32.
What this does not prove: a run on a T4 (sm_75 compile on the CPU only).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from t4patch.cli import main
from t4patch.patching.registry import find_patch_set
from tests.helpers import extracted_wheel, site_from_extracted, wheel_path

pytestmark = pytest.mark.integration

pytest.importorskip("torch", reason="compiling vLLM's Triton kernel needs torch (CPU build is enough)")
triton = pytest.importorskip("triton", reason="compiling vLLM's Triton kernel needs triton 3.8")
if ".".join(triton.__version__.split(".")[:2]) != "3.8":
    pytest.skip(f"triton {triton.__version__} here; vLLM 0.31-0.33 pin 3.8.x", allow_module_level=True)
pytest.importorskip("regex", reason="importing vLLM's ops package needs regex")

REPO = Path(__file__).resolve().parents[2]
RELEASES = ("0.31.0", "0.32.0", "0.33.0")

CHILD = r'''
import ast, json, sys
from enum import Enum
from pathlib import Path

site, arch_name, cases = Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
from t4patch.verify.attention.cases import load_archs
from t4patch.verify.attention.device import install_device
from t4patch.verify.attention import triton_target

arch = load_archs()[arch_name].to_json()
major, minor = arch["capability"]
props = install_device(arch)
triton_target.install(major * 10 + minor)
import importlib
platforms = importlib.import_module("vllm.platforms")
interface = importlib.import_module("vllm.platforms.interface")

class ArchPlatform(interface.Platform):
    _enum = interface.PlatformEnum.CUDA
    device_name = "cuda"
    device_type = "cuda"
    dispatch_key = "CUDA"

    @classmethod
    def get_device_capability(cls, device_id=0):
        return interface.DeviceCapability(major, minor)

    @classmethod
    def get_device_name(cls, device_id=0):
        return props.name

standin = ArchPlatform()
platforms.current_platform = standin
platforms._current_platform = standin
import torch
ops = importlib.import_module("vllm.v1.attention.ops.int4_per_token_head")
assert Path(ops.__file__).resolve().is_relative_to(site.resolve()), ops.__file__

def module_parts(path, names):
    tree = ast.parse(path.read_text())
    return [n for n in tree.body if getattr(n, "name", None) in names
            or (isinstance(n, (ast.Assign, ast.AnnAssign)) and any(
                getattr(t, "id", None) in names for t in (n.targets if isinstance(n, ast.Assign) else [n.target])))]

backend = site / "vllm/v1/attention/backends/triton_attn.py"
ns = {"torch": torch, "current_platform": standin, "Enum": Enum}
attention_type = module_parts(site / "vllm/v1/attention/backend.py", {"AttentionType"})
exec(compile(ast.Module(body=attention_type, type_ignores=[]), "backend.py", "exec"), ns)
helpers = module_parts(backend, {"NUM_PAR_SOFTMAX_SEGMENTS", "_T4PATCH_INT4_NEED", "_t4patch_int4_smallest_tile_shared"})
exec(compile(ast.Module(body=helpers, type_ignores=[]), str(backend), "exec"), ns)
impl = next(n for n in ast.parse(backend.read_text()).body if getattr(n, "name", "") == "TritonAttentionImpl")
init = next(n for n in impl.body if getattr(n, "name", "") == "__init__")
# the constructor's statements as written, through the block of capability checks (if current_platform.is_cuda())
end = next(i for i, s in enumerate(init.body) if isinstance(s, ast.If) and "is_cuda" in ast.unparse(s.test))
init.body = init.body[:end + 1]
init.returns = None
init.args.args = [a for a in init.args.args]
for a in init.args.args + init.args.kwonlyargs:
    a.annotation = None
exec(compile(ast.Module(body=[init], type_ignores=[]), str(backend), "exec"), ns)

class Impl:
    pass

out = []
for num_heads, num_kv_heads, head_size in cases:
    torch.set_default_dtype(torch.float16)  # vLLM builds the layers under the model's dtype
    try:
        ns["__init__"](Impl(), num_heads, head_size, head_size ** -0.5, num_kv_heads, None, None,
                       "int4_per_token_head")
        out.append({"case": [num_heads, num_kv_heads, head_size], "refused": None})
    except ValueError as exc:
        out.append({"case": [num_heads, num_kv_heads, head_size], "refused": str(exc)})
    finally:
        torch.set_default_dtype(torch.float32)
out.append({"compiled": {repr(k): v for k, v in ns.get("_T4PATCH_INT4_NEED", {}).items()}})
print(json.dumps(out))
'''

CASES = [(8, 1, 512), (8, 1, 256), (32, 1, 512), (32, 1, 256)]


@pytest.fixture(scope="module", params=RELEASES)
def sites(request, tmp_path_factory) -> tuple[str, dict[str, Path]]:
    version = request.param
    ps = find_patch_set("vllm", version)
    tree = extracted_wheel(wheel_path("vllm", version))
    base = tmp_path_factory.mktemp(f"vllm-{version}")
    stock = site_from_extracted(tree, base / "stock")
    patched = site_from_extracted(tree, base / "patched", [t.path for t in ps.targets])
    os.environ.pop("T4PATCH_PATCHES", None)
    assert main(["apply", ps.spec, "--site-packages", str(patched)]) == 0
    return version, {"stock": stock, "patched": patched}


def _run(site: Path, arch: str) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(REPO)]), CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-c", CHILD, str(site), arch, json.dumps(CASES)], env=env,
                          capture_output=True, text=True, check=False, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_vllm_set_ships_the_startup_refusal() -> None:
    for version in RELEASES:
        files = [p.file for p in find_patch_set("vllm", version).patches]
        assert "0003-int4-kv-refused-at-startup-below-sm80.diff" in files, (version, files)


def test_int4_kv_is_refused_when_the_layer_is_built_on_sm75(sites) -> None:
    version, site = sites
    results = {tuple(r["case"]): r["refused"] for r in _run(site["patched"], "sm_75") if "case" in r}
    for case in ((8, 1, 512), (32, 1, 512)):
        message = results[case]
        assert message is not None, (version, case)
        assert "INT4 per-token-head KV cache is not supported" in message and "head size 512" in message
        assert "this GPU allows 65536 B" in message and "--kv-cache-dtype auto" in message
    # the numbers verify attention measures through the launcher itself at TILE 16
    assert "needs 98304 B" in results[(8, 1, 512)]
    assert "needs 131072 B" in results[(32, 1, 512)]
    assert results[(8, 1, 256)] is None and results[(32, 1, 256)] is None  # head 256 fits at a smaller tile


def test_int4_kv_is_not_refused_from_sm80_up_nor_by_stock(sites) -> None:
    version, site = sites
    for r in _run(site["patched"], "sm_80"):
        if "case" in r:
            assert r["refused"] is None, (version, r)
        else:
            assert r["compiled"] == {}, "nothing is compiled at construction on cc >= 8.0"
    stock = [r for r in _run(site["stock"], "sm_75") if "case" in r]
    assert all(r["refused"] is None for r in stock)  # stock vLLM builds the layer and fails at the first launch
