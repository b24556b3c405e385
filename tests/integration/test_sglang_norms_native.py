"""SGLang 0005: below compute capability 8.0 the norms run SGLang's own torch path (issue 23.6b).

On a T4 every norm SGLang 0.5.21-0.5.23 builds for Gemma 4 (RMSNorm in the decoder, Gemma4RMSNorm for q/k/v
and the per-layer inputs; GemmaRMSNorm / Gemma3RMSNorm for other Gemma models) reaches sgl_kernel's rmsnorm /
fused_add_rmsnorm / gemma_rmsnorm / gemma_fused_add_rmsnorm from ``forward_cuda``: sglang-kernel 0.4.10 has no
sm_75 code, and the FlashInfer JIT it prefers is reported broken on sm_75 (flashinfer#3620). 0005 makes the
four ``forward_cuda`` return ``forward_native`` below 8.0.

Proven on the CPU, for every shipped SGLang set, from the installed (patched by t4patch) layernorm.py of the
real wheel: the module's own helper and classes are executed from that file's source (its module imports need
a CUDA stack, so the four class bodies and the helper run as written with ``nn.Module`` for their base class
and the kernel entry points as stand-ins that record the call and raise "no kernel image", as sm_80-only SASS
does on a T4). With the device reported as 7.5 no kernel is called and every result equals the kernels'
reference semantics (FlashInfer's documented norms: x / sqrt(mean(x^2) + eps) * w, Gemma: * (1 + w); the fused
form adds the residual first); with 8.0 the same calls reach the kernels, as stock. What this does not prove:
speed, or a run on a T4.
"""

from __future__ import annotations

import ast
import typing
from pathlib import Path
from typing import Any

import pytest

from t4patch.cli import main
from t4patch.patching.registry import all_patch_sets
from tests.helpers import extracted_wheel, site_from_extracted, wheel_path

pytestmark = pytest.mark.integration
torch = pytest.importorskip("torch")

RELEASES = [ps.version for ps in all_patch_sets() if ps.distribution == "sglang"]
CLASSES = ("RMSNorm", "GemmaRMSNorm", "Gemma3RMSNorm", "Gemma4RMSNorm")
KERNELS = ("rmsnorm", "fused_add_rmsnorm", "gemma_rmsnorm", "gemma_fused_add_rmsnorm")
LAYERNORM = "sglang/srt/layers/layernorm.py"


class NoKernelImage(RuntimeError):
    pass


def load(path: Path, calls: list[str]) -> dict[str, Any]:
    """The helper and the four classes of the installed layernorm.py, executed from its source."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    wanted = [n for n in tree.body
              if (isinstance(n, ast.ClassDef) and n.name in CLASSES)
              or (isinstance(n, ast.FunctionDef) and n.name == "_t4patch_below_sm80")
              or (isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == "_t4patch_norm_native")]

    def kernel(name: str):
        def run(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            raise NoKernelImage(f"{name}: CUDA error: no kernel image is available for execution on the device")
        return run

    ns: dict[str, Any] = {
        "torch": torch, "nn": torch.nn, "F": torch.nn.functional, "BaseFusedOp": torch.nn.Module,
        **{n: getattr(typing, n) for n in ("Optional", "Tuple", "Union")},  # the annotations of the file
        "_use_aiter": False, "_flashinfer_rmsnorm_quant_available": False, "_jit_rmsnorm_hf_available": False,
        "_is_cpu_amx_available": False, "is_batch_invariant_mode_enabled": lambda: False,
        **{name: kernel(name) for name in KERNELS},
    }
    exec(compile(ast.Module(body=wanted, type_ignores=[]), str(path), "exec"), ns)  # the file under test
    return ns


@pytest.fixture(scope="module", params=RELEASES)
def patched(request, tmp_path_factory) -> Path:
    ps = next(p for p in all_patch_sets() if p.distribution == "sglang" and p.version == request.param)
    tree = extracted_wheel(wheel_path("sglang", ps.version))
    site = site_from_extracted(tree, tmp_path_factory.mktemp(f"sglang-{ps.version}") / "site",
                               [t.path for t in ps.targets + ps.optional_targets])
    assert main(["apply", ps.spec, "--site-packages", str(site)]) == 0
    return site / LAYERNORM


def reference(x, w, eps, *, gemma: bool = False, residual=None):
    """The kernels' semantics: the residual added first (kept in the input dtype), then the norm in fp32."""
    if residual is not None:
        total = x.float() + residual.float()
        residual_out = total.to(x.dtype)
        x_float = total
    else:
        x_float = x.float()
    scale = (1.0 + w.float()) if gemma else w.float()
    out = (x_float * torch.rsqrt(x_float.pow(2).mean(-1, keepdim=True) + eps) * scale).to(x.dtype)
    return out if residual is None else (out, residual_out)


def close(a, b) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    torch.testing.assert_close(a.float(), b.float(), rtol=2e-3, atol=2e-3)


def cases(ns: dict[str, Any]):
    """(what, run) for each class and form, with inputs in fp16 as on a T4."""
    gen = torch.Generator().manual_seed(0)
    hidden = 256
    x = torch.randn(5, hidden, generator=gen).half()
    r = torch.randn(5, hidden, generator=gen).half()
    w = (torch.randn(hidden, generator=gen) * 0.1 + 1).half()
    eps = 1e-6

    def rms():
        m = ns["RMSNorm"](hidden, eps=eps)
        m.weight.data = w.clone()
        return m

    def gemma(name: str):
        m = ns[name](hidden, eps=eps)
        m.weight.data = (w - 1).clone()  # Gemma stores w - 1
        return m

    yield "RMSNorm", lambda: (rms().forward_cuda(x.clone()), reference(x, w, eps))
    yield "RMSNorm fused", lambda: (rms().forward_cuda(x.clone(), r.clone()), reference(x, w, eps, residual=r))
    yield "GemmaRMSNorm", lambda: (gemma("GemmaRMSNorm").forward_cuda(x.clone()),
                                   reference(x, w - 1, eps, gemma=True))
    yield "GemmaRMSNorm fused", lambda: (gemma("GemmaRMSNorm").forward_cuda(x.clone(), r.clone()),
                                         reference(x, w - 1, eps, gemma=True, residual=r))
    yield "Gemma3RMSNorm", lambda: (gemma("Gemma3RMSNorm").forward_cuda(x.clone()),
                                    reference(x, w - 1, eps, gemma=True))
    yield "Gemma3RMSNorm fused", lambda: (gemma("Gemma3RMSNorm").forward_cuda(x.clone(), r.clone()),
                                          reference(x, w - 1, eps, gemma=True, residual=r))
    for shift in (0.0, 1.0):
        def g4(shift=shift):
            m = ns["Gemma4RMSNorm"](hidden, eps=eps, scale_shift=shift)
            m.weight.data = (w.float() - shift).half()
            heads = x.reshape(5, 2, hidden // 2).repeat(1, 1, 2)  # 3D input, as the q/k/v norms get
            return m.forward_cuda(heads.clone()), reference(heads, w.float() - shift, eps, gemma=shift == 1.0)
        yield f"Gemma4RMSNorm scale_shift={shift}", g4


def _device(monkeypatch, capability: tuple[int, int]) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)


def test_below_sm80_every_norm_runs_its_torch_path_and_matches_the_kernels(patched, monkeypatch) -> None:
    _device(monkeypatch, (7, 5))
    calls: list[str] = []
    ns = load(patched, calls)
    seen = 0
    for what, run in cases(ns):
        got, want = run()
        if isinstance(want, tuple):
            assert isinstance(got, tuple), what
            close(got[0], want[0])
            close(got[1], want[1])
        else:
            close(got, want)
        seen += 1
    assert seen == 8 and calls == []  # no sgl_kernel / FlashInfer entry point was reached


def test_from_sm80_the_kernels_are_called_as_stock(patched, monkeypatch) -> None:
    _device(monkeypatch, (8, 0))
    calls: list[str] = []
    ns = load(patched, calls)
    for _what, run in cases(ns):
        with pytest.raises(NoKernelImage):
            run()
    assert set(calls) == set(KERNELS)


def test_stock_reaches_the_kernels_on_sm75(tmp_path, monkeypatch) -> None:
    """The failure 0005 removes: the released file calls the kernels on a 7.5 device too."""
    _device(monkeypatch, (7, 5))
    tree = extracted_wheel(wheel_path("sglang", RELEASES[-1]))
    calls: list[str] = []
    ns = load(tree / LAYERNORM, calls)
    assert "_t4patch_below_sm80" not in ns
    for _what, run in cases(ns):
        with pytest.raises(NoKernelImage):
            run()
    assert set(calls) == set(KERNELS)
