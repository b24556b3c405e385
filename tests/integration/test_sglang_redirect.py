"""Every shipped SGLang patch set (0.5.21, 0.5.22, 0.5.23), exercised on the CPU through the real patched files.

The released sglang wheel is installed into a temp dir and patched with t4patch. The patched modules are
then imported by path, with small stand-ins for what they import from the rest of SGLang (the real package
needs a GPU stack), a recording stand-in for ``vllm._custom_ops``, and ``torch.cuda`` queries answered as a
Tesla T4 would (capability 7.5, 40 SMs, 65,536 B of opt-in shared memory). What is proven here: the exact
SGLang -> vLLM Marlin argument mapping (checked against the real ``vllm/_custom_ops.py`` of the vLLM release
each set's ``[[requires]]`` names), the workspace size, act-order refused, the missing-vLLM message,
the SGLANG_MARLIN_VIA_VLLM switch, MoE Marlin refused, the atomic-add default and switch, and the attention
tiles chosen below and above sm_80. What is not: that vLLM's kernels compute the right numbers (that needs a
GPU; see docs/verification/).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import inspect
import logging
import sys
import types
from pathlib import Path

import pytest

from t4patch.cli import main as t4patch_main
from t4patch.patching.registry import all_patch_sets
from tests.helpers import companions_standin, extracted_wheel, site_from_extracted, wheel_path

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.integration

GEMM = "sglang/kernels/ops/gemm/gptq_marlin.py"
REPACK = "sglang/kernels/ops/quantization/gptq_marlin_repack.py"
AWQ_REPACK = "sglang/kernels/ops/quantization/awq_marlin_repack.py"
MOE = "sglang/kernels/ops/moe/moe_wna16_marlin.py"
MARLIN_UTILS = "sglang/srt/layers/quantization/marlin_utils.py"
DECODE = "sglang/kernels/ops/attention/decode_attention.py"
EXTEND = "sglang/kernels/ops/attention/extend_attention.py"

T4_SMS = 40
T4_SMEM_OPTIN = 65536
SGLANG_SETS = [ps for ps in all_patch_sets() if ps.distribution == "sglang"]


# --------------------------------------------------------------------------------------------------------
# The real wheel, patched by t4patch (once per module), and a pristine copy of the targets for contrast.
# --------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=SGLANG_SETS, ids=[ps.spec for ps in SGLANG_SETS])
def sites(request, tmp_path_factory):
    patch_set = request.param
    (vllm,) = [c for c in patch_set.requires if c.distribution == "vllm"]
    root = tmp_path_factory.mktemp("sglang")
    tree = extracted_wheel(wheel_path("sglang", patch_set.version))
    site = site_from_extracted(tree, root / "site", [t.path for t in patch_set.targets])
    pristine = root / "pristine"
    for target in patch_set.targets:
        (pristine / target.path).parent.mkdir(parents=True, exist_ok=True)
        (pristine / target.path).write_bytes((site / target.path).read_bytes())
    assert t4patch_main(["apply", patch_set.spec, "--site-packages", str(site)]) == 0
    companions_standin(site, patch_set)  # status --check requires the set's companions
    assert t4patch_main(["status", "sglang", "--check", "--site-packages", str(site)]) == 0
    for target in patch_set.targets:
        assert hashlib.sha256((site / target.path).read_bytes()).hexdigest() == target.patched_sha256
    return types.SimpleNamespace(patched=site, pristine=pristine, patch_set=patch_set, vllm_version=vllm.version,
                                 install_hint=f"pip install --no-deps vllm=={vllm.version}")


# --------------------------------------------------------------------------------------------------------
# Stand-ins: SGLang's packages and helpers, vLLM's _custom_ops, and a T4 behind torch.cuda.
# --------------------------------------------------------------------------------------------------------


class StockJitReached(Exception):
    """SGLang's own JIT Marlin path was taken (below sm_80 it would run an empty kernel)."""


class FakeScalarType:
    def __init__(self, name: str, type_id: int) -> None:
        self.name, self.id = name, type_id

    def __repr__(self) -> str:
        return self.name


SCALAR_TYPES = types.SimpleNamespace(
    uint4b8=FakeScalarType("uint4b8", 1125899907892224),
    uint8b128=FakeScalarType("uint8b128", 1125899923621888),
    uint4=FakeScalarType("uint4", 1125899906843648),
    uint8=FakeScalarType("uint8", 1125899906844672),
    float8_e4m3fn=FakeScalarType("float8_e4m3fn", 2814749767172868),
    float4_e2m1f=FakeScalarType("float4_e2m1f", 562949953487106),
)


class FakeVllmOps(types.ModuleType):
    """``vllm._custom_ops`` recording every call; returns a fresh sentinel tensor."""

    def __init__(self) -> None:
        super().__init__("vllm._custom_ops")
        self.calls: list[tuple[str, tuple, dict]] = []

    def _record(self, name, args, kwargs):
        self.calls.append((name, args, kwargs))
        return torch.full((1,), float(len(self.calls)))

    def marlin_gemm(self, *args, **kwargs):
        return self._record("marlin_gemm", args, kwargs)

    def gptq_marlin_repack(self, *args, **kwargs):
        return self._record("gptq_marlin_repack", args, kwargs)

    def awq_marlin_repack(self, *args, **kwargs):
        return self._record("awq_marlin_repack", args, kwargs)


class Harness:
    """Loads patched (or pristine) SGLang modules by path into a sandboxed sys.modules."""

    def __init__(self, monkeypatch, site: Path, vllm_version: str) -> None:
        self.mp = monkeypatch
        self.site = site
        self.capability = (7, 5)
        self.smem_optin = T4_SMEM_OPTIN
        self.jit_loads: list[tuple] = []
        self.vllm_ops = FakeVllmOps()
        self.compiled_ops = {"marlin_gemm", "gptq_marlin_repack", "awq_marlin_repack"}
        self.vllm_version = vllm_version  # the release the set's [[requires]] names
        monkeypatch.setattr(torch.cuda, "get_device_capability", self._capability)
        monkeypatch.setattr(torch.cuda, "get_device_properties", self._properties)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.ops, "_C", types.SimpleNamespace(), raising=False)
        monkeypatch.delenv("SGLANG_MARLIN_VIA_VLLM", raising=False)
        monkeypatch.delenv("SGLANG_MARLIN_USE_ATOMIC_ADD", raising=False)
        self._install_stubs()
        self.install_vllm()

    # torch.cuda as a T4 (or whatever capability a test sets)
    def _capability(self, device=None):
        return self.capability

    def _properties(self, device=None):
        return types.SimpleNamespace(
            multi_processor_count=T4_SMS, shared_memory_per_block_optin=self.smem_optin
        )

    def tensors_on_gpu0(self) -> None:
        """Make every tensor report CUDA device 0, so the capability gates see 'a GPU'."""
        self.mp.setattr(torch.Tensor, "get_device", lambda self: 0)
        self.mp.setattr(torch.Tensor, "is_cuda", property(lambda self: True))

    def install_vllm(self) -> None:
        vllm = types.ModuleType("vllm")
        vllm.__path__ = []
        vllm.__version__ = self.vllm_version
        vllm._custom_ops = self.vllm_ops
        self.mp.setitem(sys.modules, "vllm", vllm)
        self.mp.setitem(sys.modules, "vllm._custom_ops", self.vllm_ops)
        self.mp.setattr(
            torch.ops, "_C", types.SimpleNamespace(**{name: object() for name in self.compiled_ops})
        )

    def remove_vllm(self) -> None:
        self.mp.setitem(sys.modules, "vllm", None)  # `import vllm` now raises ImportError
        self.mp.setitem(sys.modules, "vllm._custom_ops", None)

    def _package(self, name: str) -> None:
        module = types.ModuleType(name)
        module.__path__ = []
        self.mp.setitem(sys.modules, name, module)

    def _module(self, name: str, **attrs) -> None:
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        self.mp.setitem(sys.modules, name, module)

    def _install_stubs(self) -> None:
        for name in (
            "sglang", "sglang.kernels", "sglang.kernels.ops", "sglang.kernels.ops.gemm",
            "sglang.kernels.ops.quantization", "sglang.kernels.ops.moe", "sglang.kernels.ops.attention",
            "sglang.kernels.jit", "sglang.srt", "sglang.srt.layers", "sglang.srt.layers.quantization",
            "sglang.srt.utils", "sglang.srt.model_executor", "sglang.srt.model_executor.runner_backend_utils",
        ):
            self._package(name)

        def load_jit(*args, **kwargs):
            self.jit_loads.append((args, kwargs))
            raise StockJitReached(args[0] if args else "?")

        self._module(
            "sglang.kernels.jit.utils",
            cache_once=lambda fn: fn,
            load_jit=load_jit,
            make_cpp_args=lambda *args: args,
        )
        self._module("sglang.kernels.kernel_api_logging", debug_kernel_api=lambda fn: fn)
        sglang_utils = sys.modules["sglang.srt.utils"]
        sglang_utils.__dict__.update(
            get_device_capability=lambda device_id=0: self.capability,
            is_cuda=lambda: True,
            is_hip=lambda: False,
            is_gfx95_supported=lambda: False,
            is_gfx1250_supported=lambda: False,
            get_device_core_count=lambda device_id=0: T4_SMS,
        )
        self._module(
            "sglang.srt.layers.quantization.utils",
            get_scalar_types=lambda: (FakeScalarType, SCALAR_TYPES),
            pack_cols=None,
            unpack_cols=None,
        )
        self._module("sglang.srt.utils.custom_op", register_custom_op=lambda **kw: (lambda fn: fn))
        self._module(
            "sglang.srt.model_executor.runner_backend_utils.tc_piecewise_cuda_graph",
            get_tc_piecewise_forward_context=lambda: None,
        )
        self._module("sglang.kernels.ops.attention.score_mod", unpack_aux_tensors=lambda *a: (None, 0, 0, 0))
        # SGLang 0.5.21 / 0.5.22's extend_attention.py also imports the prefill kernel (0.5.23 does not)
        self._module("sglang.kernels.ops.attention.prefill_attention", context_attention_fwd=lambda *a, **k: None)
        self._module("sglang.srt.environ", envs=types.SimpleNamespace())

    def load(self, rel: str, site: Path | None = None) -> types.ModuleType:
        name = rel[: -len(".py")].replace("/", ".")
        spec = importlib.util.spec_from_file_location(name, (site or self.site) / rel)
        module = importlib.util.module_from_spec(spec)
        self.mp.setitem(sys.modules, name, module)
        spec.loader.exec_module(module)
        return module


@pytest.fixture
def harness(sites, monkeypatch):
    return Harness(monkeypatch, sites.patched, sites.vllm_version)


def gemm_args(**overrides):
    """Arguments as SGLang's apply_gptq_marlin_linear passes them: sym GPTQ, desc_act=False."""
    args = dict(
        a=torch.zeros(1, 2048, dtype=torch.float16),
        c=None,
        b_q_weight=torch.zeros(128, 384, dtype=torch.int32),
        b_scales=torch.zeros(64, 1536, dtype=torch.float16),
        global_scale=None,
        b_zeros=torch.empty(0, dtype=torch.int32),
        g_idx=torch.empty(0, dtype=torch.int32),
        perm=torch.empty(0, dtype=torch.int32),
        workspace=torch.zeros(T4_SMS, dtype=torch.int32),  # SGLang's marlin_make_workspace: sms * 1
        b_q_type=SCALAR_TYPES.uint4b8,
        size_m=1,
        size_n=1536,
        size_k=2048,
    )
    args.update(overrides)
    return args


# --------------------------------------------------------------------------------------------------------
# 0002: the GEMM and repack redirect
# --------------------------------------------------------------------------------------------------------


def test_gemm_on_cc75_calls_vllm_marlin_gemm_with_the_exact_mapping(harness):
    harness.tensors_on_gpu0()
    mod = harness.load(GEMM)
    args = gemm_args(c=torch.empty(1, 1536, dtype=torch.float16), global_scale=torch.ones(1))

    out = mod.gptq_marlin_gemm(
        **args, is_k_full=True, use_atomic_add=True, use_fp32_reduce=False, is_zp_float=True
    )

    assert harness.jit_loads == [], "SGLang's (empty below sm_80) JIT kernel must not be built"
    [(name, call_args, call_kwargs)] = harness.vllm_ops.calls
    assert name == "marlin_gemm"
    expected = (
        args["a"], args["c"], args["b_q_weight"], None, args["b_scales"], None, args["global_scale"],
        args["b_zeros"], "<workspace>", args["b_q_type"], 1, 1536, 2048,
    )
    assert len(call_args) == len(expected) == 13
    for position, (got, want) in enumerate(zip(call_args, expected)):
        if position == 8:
            continue  # the workspace: checked on its own below
        assert got is want, f"argument {position} of vllm marlin_gemm: got {got!r}, want {want!r}"
    assert call_kwargs == {"use_atomic_add": True, "use_fp32_reduce": False, "is_zp_float": True}
    assert out is not None and float(out) == 1.0, "the result of vLLM's op is returned as is"


def _real_signatures(vllm_version: str) -> dict[str, inspect.Signature]:
    """The signatures of marlin_gemm / gptq_marlin_repack / awq_marlin_repack in the real vllm/_custom_ops.py of
    ``vllm_version`` (read from its wheel with ast; nothing of vLLM is imported)."""
    source = (extracted_wheel(wheel_path("vllm", vllm_version)) / "vllm" / "_custom_ops.py").read_text()
    found = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name in ("marlin_gemm", "gptq_marlin_repack", "awq_marlin_repack"):
            stub = ast.FunctionDef(name=node.name, args=node.args, body=[ast.Pass()], decorator_list=[], returns=None,
                                   type_params=[])
            for arg in (*stub.args.posonlyargs, *stub.args.args, *stub.args.kwonlyargs):
                arg.annotation = None
            namespace: dict = {}
            exec(compile(ast.fix_missing_locations(ast.Module([stub], type_ignores=[])), "<sig>", "exec"), namespace)
            found[node.name] = inspect.signature(namespace[node.name])
    assert set(found) == {"marlin_gemm", "gptq_marlin_repack", "awq_marlin_repack"}, sorted(found)
    return found


def test_the_redirect_binds_to_the_required_vllm_releases_real_signatures(harness, sites):
    """Each recorded call binds to the real function's parameters of the vLLM release the set requires: GEMM
    argument 4 is vLLM's b_bias (None), 6 a_scales (None), 9 the workspace; repacks take (w, size_k, size_n,
    num_bits) with is_a_8bit left at its default."""
    signatures = _real_signatures(sites.vllm_version)
    harness.tensors_on_gpu0()
    gemm = harness.load(GEMM)
    args = gemm_args(c=torch.empty(1, 1536, dtype=torch.float16), global_scale=torch.ones(1))
    gemm.gptq_marlin_gemm(**args, is_k_full=True, use_atomic_add=True, use_fp32_reduce=True, is_zp_float=False)
    harness.load(REPACK).gptq_marlin_repack(
        torch.zeros(256, 1536, dtype=torch.int32), perm=torch.empty(0, dtype=torch.int32), size_k=2048, size_n=1536,
        num_bits=4)
    harness.load(AWQ_REPACK).awq_marlin_repack(torch.zeros(256, 1536, dtype=torch.int32), size_k=2048, size_n=1536,
                                               num_bits=4)
    bound = {name: signatures[name].bind(*call_args, **call_kwargs).arguments
             for name, call_args, call_kwargs in harness.vllm_ops.calls}
    g = bound["marlin_gemm"]
    assert list(g)[:13] == ["a", "c", "b_q_weight", "b_bias", "b_scales", "a_scales", "global_scale", "b_zeros",
                            "workspace", "b_q_type", "size_m", "size_n", "size_k"]
    assert g["a"] is args["a"] and g["b_q_weight"] is args["b_q_weight"] and g["b_scales"] is args["b_scales"]
    assert g["b_bias"] is None and g["a_scales"] is None and g["global_scale"] is args["global_scale"]
    assert g["b_zeros"] is args["b_zeros"] and g["b_q_type"] is args["b_q_type"]
    assert (g["size_m"], g["size_n"], g["size_k"]) == (1, 1536, 2048)
    assert (g["use_atomic_add"], g["use_fp32_reduce"], g["is_zp_float"]) == (True, True, False)
    for name in ("gptq_marlin_repack", "awq_marlin_repack"):
        r = bound[name]
        assert (r["size_k"], r["size_n"], r["num_bits"]) == (2048, 1536, 4) and "is_a_8bit" not in r


def test_gemm_workspace_is_at_least_sms_times_4_zeroed_and_cached(harness):
    harness.tensors_on_gpu0()
    mod = harness.load(GEMM)
    sglang_ws = torch.zeros(T4_SMS, dtype=torch.int32)
    other_ws = torch.zeros(T4_SMS, dtype=torch.int32)
    big_ws = torch.zeros(T4_SMS * 4, dtype=torch.int32)

    for ws in (sglang_ws, sglang_ws, other_ws, big_ws):
        mod.gptq_marlin_gemm(**gemm_args(workspace=ws))
    given = [call[1][8] for call in harness.vllm_ops.calls]

    assert given[0].dtype == torch.int32 and given[0].numel() == T4_SMS * 4
    assert int(given[0].abs().sum()) == 0, "vLLM's locks must start at zero"
    assert given[1] is given[0], "one buffer per SGLang workspace, reused call after call"
    assert given[2] is not given[0] and given[2].numel() == T4_SMS * 4, "another layer, another buffer"
    assert given[3] is big_ws, "a workspace that is already large enough is passed through"


def test_gemm_refuses_act_order_naming_desc_act(harness):
    harness.tensors_on_gpu0()
    mod = harness.load(GEMM)
    act_order = dict(g_idx=torch.arange(2048, dtype=torch.int32), perm=torch.arange(2048, dtype=torch.int32))
    for overrides in (act_order, {"g_idx": act_order["g_idx"]}, {"perm": act_order["perm"]}):
        with pytest.raises(NotImplementedError, match="desc_act=False"):
            mod.gptq_marlin_gemm(**gemm_args(**overrides))
    assert harness.vllm_ops.calls == [] and harness.jit_loads == []


def test_gemm_zero_rows_returns_without_a_kernel(harness):
    harness.tensors_on_gpu0()
    mod = harness.load(GEMM)
    out = mod.gptq_marlin_gemm(**gemm_args(a=torch.zeros(0, 2048, dtype=torch.float16), size_m=0))
    assert tuple(out.shape) == (0, 1536) and out.dtype == torch.float16
    assert harness.vllm_ops.calls == [] and harness.jit_loads == []


def test_repacks_on_cc75_call_vllm_with_the_exact_mapping(harness):
    harness.tensors_on_gpu0()
    harness.load(GEMM)
    repack = harness.load(REPACK)
    awq = harness.load(AWQ_REPACK)
    qweight = torch.zeros(256, 1536, dtype=torch.int32)

    repack.gptq_marlin_repack(qweight, perm=torch.empty(0, dtype=torch.int32), size_k=2048, size_n=1536, num_bits=4)
    awq.awq_marlin_repack(qweight, size_k=2048, size_n=1536, num_bits=4)

    assert harness.jit_loads == []
    [(name1, args1, kwargs1), (name2, args2, kwargs2)] = harness.vllm_ops.calls
    assert (name1, kwargs1, name2, kwargs2) == ("gptq_marlin_repack", {}, "awq_marlin_repack", {})
    assert args1[0] is qweight and args1[1:] == (2048, 1536, 4), "vLLM's repack: (w, size_k, size_n, num_bits)"
    assert args2[0] is qweight and args2[1:] == (2048, 1536, 4)

    with pytest.raises(NotImplementedError, match="desc_act"):
        repack.gptq_marlin_repack(
            qweight, perm=torch.arange(2048, dtype=torch.int32), size_k=2048, size_n=1536, num_bits=4
        )
    assert len(harness.vllm_ops.calls) == 2


def test_cc80_keeps_sglang_kernels_and_never_imports_vllm(harness):
    harness.capability = (8, 0)
    harness.tensors_on_gpu0()
    harness.remove_vllm()
    mod = harness.load(GEMM)
    repack = harness.load(REPACK)
    with pytest.raises(StockJitReached, match="gptq_marlin"):
        mod.gptq_marlin_gemm(**gemm_args())
    with pytest.raises(StockJitReached, match="gptq_marlin_repack"):
        repack.gptq_marlin_repack(
            torch.zeros(256, 1536, dtype=torch.int32), torch.empty(0, dtype=torch.int32), 2048, 1536, 4
        )
    assert harness.vllm_ops.calls == []


def test_pristine_sglang_on_cc75_would_run_its_empty_kernel(harness, sites):
    """The contrast that makes 0002 necessary: stock SGLang takes its JIT path on a T4."""
    harness.tensors_on_gpu0()
    stock = harness.load(GEMM, site=sites.pristine)
    with pytest.raises(StockJitReached):
        stock.gptq_marlin_gemm(**gemm_args())
    assert harness.vllm_ops.calls == []


def test_env_switch_forces_vllm_on_any_gpu_and_never_disables_it_below_sm80(harness, monkeypatch):
    harness.capability = (9, 0)
    monkeypatch.setenv("SGLANG_MARLIN_VIA_VLLM", "1")
    mod = harness.load(GEMM)  # CPU tensors (device -1): only the switch can route them
    mod.gptq_marlin_gemm(**gemm_args())
    assert [c[0] for c in harness.vllm_ops.calls] == ["marlin_gemm"] and harness.jit_loads == []

    harness.capability = (7, 5)
    harness.tensors_on_gpu0()
    monkeypatch.setenv("SGLANG_MARLIN_VIA_VLLM", "0")
    mod = harness.load(GEMM)
    mod.gptq_marlin_gemm(**gemm_args())
    assert len(harness.vllm_ops.calls) == 2, "=0 must not send a T4 back to the empty kernels"

    monkeypatch.setenv("SGLANG_MARLIN_VIA_VLLM", "maybe")
    mod = harness.load(GEMM)
    with pytest.raises(ValueError, match='SGLANG_MARLIN_VIA_VLLM="maybe"'):
        mod.gptq_marlin_gemm(**gemm_args())


def test_missing_vllm_fails_with_the_install_command(harness, sites):
    hint = sites.install_hint
    harness.tensors_on_gpu0()
    harness.remove_vllm()
    mod = harness.load(GEMM)
    with pytest.raises(ImportError, match=hint.replace(".", r"\.")) as missing:
        mod.gptq_marlin_gemm(**gemm_args())
    assert "t4patch" in str(missing.value) and "compute capability 8.0" in str(missing.value)
    assert harness.jit_loads == [], "no fallback to the empty kernel"

    harness.vllm_version = "0.32.1"
    harness.install_vllm()
    mod = harness.load(GEMM)
    with pytest.raises(ImportError, match=r"found vLLM 0\.32\.1.*" + hint.replace(".", r"\.")):
        mod.gptq_marlin_gemm(**gemm_args())

    harness.vllm_version = sites.vllm_version
    harness.compiled_ops = {"awq_marlin_repack"}
    harness.install_vllm()
    mod = harness.load(GEMM)
    with pytest.raises(ImportError, match=r"no \['marlin_gemm', 'gptq_marlin_repack'\].*--force-reinstall"):
        mod.gptq_marlin_gemm(**gemm_args())
    assert harness.vllm_ops.calls == []


def test_missing_vllm_fails_when_marlin_layers_are_built(harness, sites):
    """verify_marlin_supported runs while GPTQ/AWQ Marlin layers are constructed, before weights load."""
    hint = sites.install_hint
    harness.remove_vllm()
    harness.load(GEMM)
    utils = harness.load(MARLIN_UTILS)
    with pytest.raises(ImportError, match=hint.replace(".", r"\.")):
        utils.verify_marlin_supported(SCALAR_TYPES.uint4b8, group_size=32)

    harness.install_vllm()
    harness.load(GEMM)
    utils = harness.load(MARLIN_UTILS)
    utils.verify_marlin_supported(SCALAR_TYPES.uint4b8, group_size=32)  # 0001: supported at 7.5 now


def test_marlin_gate_is_75(harness):
    harness.load(GEMM)
    utils = harness.load(MARLIN_UTILS)
    assert SCALAR_TYPES.uint4b8 in utils.query_marlin_supported_quant_types(False, True, 75)
    assert SCALAR_TYPES.uint4 in utils.query_marlin_supported_quant_types(True, True, 75)
    assert utils.query_marlin_supported_quant_types(None, True, 70) == []
    harness.capability = (7, 0)
    with pytest.raises(ValueError, match="Marlin does not support"):
        utils.verify_marlin_supported(SCALAR_TYPES.uint4b8, group_size=32)


def test_moe_marlin_is_refused_below_sm80_and_untouched_above(harness):
    harness.tensors_on_gpu0()
    harness.load(GEMM)
    moe = harness.load(MOE)
    t = torch.zeros(4, dtype=torch.int32)
    args = dict(
        a=torch.zeros(1, 2048, dtype=torch.float16), c_or_none=None, b_q_weight=t, b_bias_or_none=None,
        b_scales=torch.zeros(2, 16, 256, dtype=torch.float16), global_scale_or_none=None, b_zeros_or_none=None,
        g_idx_or_none=None, perm_or_none=None, workspace=t, sorted_token_ids=t, expert_ids=t,
        num_tokens_post_padded=t, topk_weights=torch.zeros(1, 2), moe_block_size=16, top_k=2,
        mul_topk_weights=False, is_ep=False, b_q_type=SCALAR_TYPES.uint4b8, size_m=1, size_n=256, size_k=2048,
    )
    with pytest.raises(NotImplementedError, match="moe_wna16_marlin_gemm.*compute capability 8.0"):
        moe.moe_wna16_marlin_gemm(**args)
    assert harness.jit_loads == []

    harness.capability = (8, 0)
    harness.load(GEMM)
    moe = harness.load(MOE)
    with pytest.raises(StockJitReached, match="moe_wna16_marlin"):
        moe.moe_wna16_marlin_gemm(**args)

    # with the switch, MoE weights were repacked by vLLM for SGLang's own MoE kernel: refused as well
    harness.mp.setenv("SGLANG_MARLIN_VIA_VLLM", "1")
    harness.load(GEMM)
    moe = harness.load(MOE)
    with pytest.raises(NotImplementedError, match="unset SGLANG_MARLIN_VIA_VLLM"):
        moe.moe_wna16_marlin_gemm(**args)


# --------------------------------------------------------------------------------------------------------
# 0003: atomic-add reduce
# --------------------------------------------------------------------------------------------------------


@pytest.fixture
def info_once(monkeypatch):
    """SGLang gets Logger.info_once from transformers; record it here instead."""
    seen: list[str] = []
    monkeypatch.setattr(logging.Logger, "info_once", lambda self, msg, *a: seen.append(msg), raising=False)
    return seen


@pytest.mark.parametrize(
    ("capability", "env", "expected"),
    [
        ((7, 5), None, False),  # the fix: off by default on a T4
        ((7, 5), "1", True),
        ((7, 5), "true", True),
        ((7, 5), "0", False),
        ((8, 0), None, True),  # stock SGLang on sm_80+
        ((8, 9), None, True),
        ((8, 0), "0", False),
        ((9, 0), "1", True),
    ],
)
def test_atomic_add_default_and_switch(harness, monkeypatch, info_once, capability, env, expected):
    harness.capability = capability
    if env is not None:
        monkeypatch.setenv("SGLANG_MARLIN_USE_ATOMIC_ADD", env)
    harness.load(GEMM)
    utils = harness.load(MARLIN_UTILS)
    device = torch.device("cuda", 0)
    # o_proj of Gemma 4 E2B: n = 1536 < 2048, k = 2048 >= 2048, fp16 as SGLang runs it on a T4
    assert utils.should_use_atomic_add_reduce(1, 1536, 2048, device, torch.float16) is expected
    # outside the atomic-add shapes nothing changes, whatever the switch says
    assert utils.should_use_atomic_add_reduce(1, 2560, 2048, device, torch.float16) is False
    assert utils.should_use_atomic_add_reduce(1, 1536, 1536, device, torch.float16) is False
    if capability == (7, 5) and env is None:
        assert len(info_once) == 1 and "SGLANG_MARLIN_USE_ATOMIC_ADD to 1" in info_once[0]
    else:
        assert info_once == []


def test_atomic_add_rejects_a_value_it_cannot_read(harness, monkeypatch):
    # checked when SGLang starts (the patched module's body parses the switch at import), not at the first GEMM
    monkeypatch.setenv("SGLANG_MARLIN_USE_ATOMIC_ADD", "on-please")
    harness.load(GEMM)
    with pytest.raises(ValueError, match='SGLANG_MARLIN_USE_ATOMIC_ADD="on-please" is not a valid boolean'):
        harness.load(MARLIN_UTILS)


# --------------------------------------------------------------------------------------------------------
# 0004: Triton attention tiles
# --------------------------------------------------------------------------------------------------------


def extend_tiles(harness, capability, smem_optin, site=None):
    harness.capability, harness.smem_optin = capability, smem_optin
    harness.load(DECODE, site=site)
    extend = harness.load(EXTEND, site=site)  # reads the capability at import, as SGLang does
    return {lq: extend._get_block_sizes_for_extend_attention(lq, lq)[3:5] for lq in (64, 128, 256, 512)}


def test_extend_tiles_fit_a_t4_and_leave_newer_gpus_alone(harness, sites):
    pytest.importorskip("triton")
    patched_t4 = extend_tiles(harness, (7, 5), T4_SMEM_OPTIN)
    assert patched_t4 == {64: (64, 64), 128: (64, 64), 256: (32, 32), 512: (16, 16)}
    for lq, (block_m, block_n) in patched_t4.items():
        assert 4 * lq * (block_m + block_n) <= T4_SMEM_OPTIN
    assert extend_tiles(harness, (7, 5), T4_SMEM_OPTIN, site=sites.pristine)[512] == (32, 32)
    assert extend_tiles(harness, (7, 0), 98304)[512] == (32, 16), "V100: the device's limit, not a constant"
    for capability, smem in (((8, 0), 166912), ((8, 6), 101376), ((9, 0), 232448), ((12, 0), 101376)):
        assert extend_tiles(harness, capability, smem) == extend_tiles(
            harness, capability, smem, site=sites.pristine
        ), f"sm_{capability[0]}{capability[1]} must keep SGLang's tiles"


def fma_shared_bytes(kwargs: dict) -> int:
    """Shared memory of grouped decode stage 1 on Triton's FMA path below sm_80: each tl.dot keeps both operands
    in shared memory as fp32, 4 * K * (rows + cols) bytes; the larger of QK^T ((BLOCK_H x D) @ (D x BLOCK_N))
    and PV ((BLOCK_H x BLOCK_N) @ (BLOCK_N x DV))."""
    d = kwargs["BLOCK_DMODEL"] + kwargs.get("BLOCK_DPE", 0)
    h, n, dv = kwargs["BLOCK_H"], kwargs["BLOCK_N"], kwargs["BLOCK_DV"]
    return max(4 * d * (h + n), 4 * n * (h + dv))


class LaunchRecorder:
    """Stands in for the Triton JITFunction _fwd_grouped_kernel_stage1: ``kernel[grid](...)`` records the launch's
    keyword arguments and ``kernel.warmup(..., grid=...)`` (what the patched launcher compiles first) returns a
    compiled kernel whose ``metadata.shared`` is what the FMA path needs for those tiles."""

    def __init__(self) -> None:
        self.kwargs: dict = {}
        self.warmups: list[tuple[int, int]] = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.kwargs.update(kwargs)

    def warmup(self, *args, grid, **kwargs):
        shared = fma_shared_bytes(kwargs)
        self.warmups.append((kwargs["BLOCK_N"], shared))
        return types.SimpleNamespace(metadata=types.SimpleNamespace(shared=shared))


def decode_block_n(harness, capability, head_dim, site=None):
    harness.capability = capability
    decode = harness.load(DECODE, site=site)
    recorder = LaunchRecorder()
    harness.mp.setattr(decode, "_fwd_grouped_kernel_stage1", recorder)
    batch, q_heads, kv_heads, splits = 2, 8, 1, 4
    q = torch.zeros(batch, q_heads, head_dim, dtype=torch.float16)
    kv = torch.zeros(64, kv_heads, head_dim, dtype=torch.float16)
    att_out = torch.zeros(batch, q_heads, splits, head_dim)
    att_lse = torch.zeros(batch, q_heads, splits)
    indptr = torch.zeros(batch + 1, dtype=torch.int32)
    decode._decode_grouped_att_m_fwd(
        q, kv, kv, att_out, att_lse, indptr, indptr, torch.full((batch,), splits), splits, 0.1, 0.0
    )
    return recorder.kwargs["BLOCK_N"], recorder.kwargs["BLOCK_H"], recorder.warmups


def test_grouped_decode_block_fits_a_t4_and_leaves_newer_gpus_alone(harness, sites):
    pytest.importorskip("triton")
    harness.tensors_on_gpu0()
    # the patched launcher compiles first and halves BLOCK_N while the compile asks more than the T4's 65,536 B
    assert decode_block_n(harness, (7, 5), 512) == (16, 16, [(32, 98304), (16, 65536)])  # 4 * 512 * (16 + 16)
    assert decode_block_n(harness, (7, 5), 256) == (32, 16, [(32, 49152)])  # 4 * 256 * (16 + 32): fits at once
    assert decode_block_n(harness, (7, 5), 512, site=sites.pristine) == (32, 16, [])  # stock: 98,304 B, no check
    for capability in ((8, 0), (9, 0)):
        assert decode_block_n(harness, capability, 512) == (32, 16, []), "sm_80+ launches SGLang's tiles untouched"


# --------------------------------------------------------------------------------------------------------
# Optional diff `decode-sliding-window` (0005): decode's window for a 600-token sequence, stock and patched
# --------------------------------------------------------------------------------------------------------

BACKEND = "sglang/srt/layers/attention/triton_backend.py"
DECODE_WINDOW = "decode-sliding-window"


def _function(source: str, name: str, cls: str | None = None) -> ast.FunctionDef:
    tree = ast.parse(source)
    scope = tree.body
    if cls:
        scope = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    return next(n for n in scope if isinstance(n, ast.FunctionDef) and n.name == name)


def _decode_window_keys(source: str, seq_len: int) -> int:
    """Run TritonAttnBackend._update_decode_kv_buffers (the CUDA-graph decode path) from ``source`` with a
    stand-in backend. update_sliding_window_buffer is the real function cut after its first statement, the
    window length ``window_kv_lens = torch.minimum(seq_lens, torch.tensor(sliding_window_size))``, so the
    arguments bind to the release's own signature and the length is computed by the release's own code."""
    real = _function(source, "update_sliding_window_buffer")
    first = next(n for n in real.body if isinstance(n, ast.Assign))
    assert ast.unparse(first) == "window_kv_lens = torch.minimum(seq_lens, torch.tensor(sliding_window_size))"
    cut = ast.parse("WINDOWS.append(window_kv_lens)\nreturn (window_kv_indptr, None, window_kv_lens, None)").body
    real.body = [first, *cut]
    real.decorator_list = []
    method = _function(source, "_update_decode_kv_buffers", cls="TritonAttnBackend")
    nodes = [real, method]
    if "_t4patch_decode_window" in source:
        nodes.append(_function(source, "_t4patch_decode_window"))
    windows: list[torch.Tensor] = []
    namespace: dict = {"torch": torch, "WINDOWS": windows, "Optional": object, "SWAKVPool": object}
    exec(compile(ast.fix_missing_locations(ast.Module(nodes, type_ignores=[])), BACKEND, "exec"), namespace)
    backend = types.SimpleNamespace(
        dcp_size=1, sliding_window_size=511, window_kv_indptr=torch.zeros(2, dtype=torch.int32),
        kv_index_translator=None, token_to_kv_pool=None, cuda_graph_window_kv_indices=None,
        cuda_graph_kv_indices=None, _fill_kv_indptr_and_indices=lambda *a: torch.zeros(2, dtype=torch.int32),
    )
    params = [a.arg for a in method.args.args]
    kwargs = {"bs": 1, "seq_lens": torch.tensor([seq_len]), "req_pool_indices": torch.tensor([0])}
    if "plan" in params:
        kwargs["plan"] = None
    namespace["_update_decode_kv_buffers"](backend, **kwargs)
    (lens,) = windows
    return int(lens[0])


def test_optional_decode_window_is_512_keys_patched_and_511_stock(sites):
    ps = sites.patch_set
    if DECODE_WINDOW not in ps.option_names:
        pytest.skip(f"{ps.spec} has no optional {DECODE_WINDOW} diff")
    from t4patch.patching.plan import transform_bytes

    assert BACKEND not in {t.path for t in ps.targets}, "optional: a plain apply leaves the file alone"
    pristine = (sites.patched / BACKEND).read_bytes()
    assert hashlib.sha256(pristine).hexdigest() == next(t for t in ps.optional_targets if t.path == BACKEND).pristine_sha256
    patched = transform_bytes(ps.with_options([DECODE_WINDOW]), BACKEND, pristine, "apply").decode()
    # Gemma 4: sliding_window 512 stored as 511; a 600-token sequence (seq_lens counts the current token)
    assert _decode_window_keys(pristine.decode(), 600) == 511
    assert _decode_window_keys(patched, 600) == 512
    assert _decode_window_keys(patched, 300) == 300, "short sequences see every key, as before"
    # both decode window builds (eager and CUDA graph) and the CUDA-graph buffer use the wider window
    assert patched.count("_t4patch_decode_window(self.sliding_window_size)") == 3
