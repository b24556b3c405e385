"""The Triton patch sets on the real Triton 3.8.0 and 3.7.1 wheels: what they change in compiled sm_75 code.

Each wheel is downloaded once and extracted whole (libtriton and the bundled ptxas included) into the wheel
cache; each test gets a hard-linked copy as its site-packages, with the patched file as a private copy. Kernels
are compiled in fresh interpreters (``PYTHONPATH=<site>``, no GPU: ``GPUTarget("cuda", cc, 32)``), so what is
proven is the evidence class "compiled for sm_75 on the CPU":

- stock: an fp16 tl.dot compiled for sm_75 has no ``mma.sync`` (FMA path); after ``t4patch apply`` it uses
  ``mma.sync.aligned.m16n8k8...f16.f16`` and no ``fma.rn.f32``, with fp32 and with fp16 accumulation;
- sm_70 and sm_80 / 86 / 89 / 90 / 100 / 120 PTX, and bf16 / fp32 / rank-3 (batched) fp16 dots at sm_75, are
  byte-identical to stock;
- ``T4PATCH_TRITON_MMA=0`` gives back stock's sm_75 PTX; any other value than 0/1/empty fails loudly;
- one TRITON_CACHE_DIR for stock, patched and patched-with-the-switch-off: each compile gets its own kernel
  (the cache key differs), never the other's cached one;
- ``revert`` gives back every RECORD sha256.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from t4patch.environment.target import resolve_target
from t4patch.fileio.hashing import sha256_file
from t4patch.patching.registry import find_patch_set
from tests.helpers import extracted_wheel, progress, site_from_extracted, wheel_path

pytestmark = pytest.mark.integration

VERSIONS = ("3.8.0", "3.7.1")
COMPILER = "triton/backends/nvidia/compiler.py"

# Compiled in a fresh interpreter per state; prints one JSON object: variant -> PTX facts.
PROBE = textwrap.dedent('''
    import hashlib, json, re, sys
    import triton, triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    @triton.jit
    def gemm(a, b, c, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        om = tl.arange(0, BM)
        on = tl.arange(0, BN)
        ok = tl.arange(0, BK)
        acc = tl.zeros((BM, BN), c.dtype.element_ty)
        for k in range(0, K, BK):
            x = tl.load(a + om[:, None] * K + (k + ok)[None, :])
            y = tl.load(b + (k + ok)[:, None] * BN + on[None, :])
            acc += tl.dot(x, y, out_dtype=c.dtype.element_ty)
        tl.store(c + om[:, None] * BN + on[None, :], acc)

    @triton.jit
    def bdot(X, Y, Z, B: tl.constexpr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
        ob = tl.arange(0, B)[:, None, None]
        om = tl.arange(0, M)
        on = tl.arange(0, N)
        ok = tl.arange(0, K)
        x = tl.load(X + ob * M * K + om[None, :, None] * K + ok[None, None, :])
        y = tl.load(Y + ob * K * N + ok[None, :, None] * N + on[None, None, :])
        tl.store(Z + ob * M * N + om[None, :, None] * N + on[None, None, :], tl.dot(x, y))

    F16_MMA = re.compile(r"mma\\.sync\\.aligned\\.m16n8k8\\.row\\.col\\.(?:f32|f16)\\.f16\\.f16\\.(?:f32|f16)")
    out = {"triton": triton.__file__}
    for name, dt, acc, cc in [("f16-f32@75", "fp16", "fp32", 75), ("f16-f16@75", "fp16", "fp16", 75),
                              ("bf16-f32@75", "bf16", "fp32", 75), ("f32-f32@75", "fp32", "fp32", 75),
                              ("f16-f32@70", "fp16", "fp32", 70), ("f16-f32@80", "fp16", "fp32", 80),
                              ("f16-f32@86", "fp16", "fp32", 86), ("f16-f32@89", "fp16", "fp32", 89),
                              ("f16-f32@90", "fp16", "fp32", 90), ("f16-f32@100", "fp16", "fp32", 100),
                              ("f16-f32@120", "fp16", "fp32", 120), ("bf16-f32@80", "bf16", "fp32", 80)]:
        sig = {"a": "*" + dt, "b": "*" + dt, "c": "*" + acc, "K": "constexpr", "BM": "constexpr",
               "BN": "constexpr", "BK": "constexpr"}
        src = ASTSource(gemm, sig, constexprs={"K": 128, "BM": 64, "BN": 64, "BK": 32})
        kernel = triton.compile(src, target=GPUTarget("cuda", cc, 32))
        ptx = kernel.asm["ptx"]
        out[name] = {"sha256": hashlib.sha256(ptx.encode()).hexdigest(), "mma_sync": ptx.count("mma.sync"),
                     "f16_m16n8k8": len(F16_MMA.findall(ptx)), "fma_rn_f32": ptx.count("fma.rn.f32"),
                     "target": re.search(r"\\.target (\\w+)", ptx).group(1), "key": kernel.hash}
    # a rank-3 (batched) dot: the Turing lowering asserts for some shapes, so the set keeps it on FMA
    src = ASTSource(bdot, {"X": "*fp16", "Y": "*fp16", "Z": "*fp32", "B": "constexpr", "M": "constexpr",
                           "N": "constexpr", "K": "constexpr"}, constexprs={"B": 8, "M": 16, "N": 32, "K": 64})
    ptx = triton.compile(src, target=GPUTarget("cuda", 75, 32)).asm["ptx"]
    out["batched@75"] = {"sha256": hashlib.sha256(ptx.encode()).hexdigest(), "mma_sync": ptx.count("mma.sync"),
                         "f16_m16n8k8": len(F16_MMA.findall(ptx)), "fma_rn_f32": ptx.count("fma.rn.f32"),
                         "target": re.search(r"\\.target (\\w+)", ptx).group(1), "key": ""}
    print(json.dumps(out))
''')


def probe_file(directory: Path) -> Path:
    """The probe as a file (Triton reads a @jit function's source from its file)."""
    path = directory / "t4patch_triton_probe.py"
    path.write_text(PROBE, encoding="utf-8")
    return path


def compile_probe(site: Path, cache: Path, mma: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("T4PATCH_TRITON_MMA", "TRITON_OVERRIDE_ARCH")}
    env.update(PYTHONPATH=str(site), TRITON_CACHE_DIR=str(cache), CUDA_VISIBLE_DEVICES="")
    if mma is not None:
        env["T4PATCH_TRITON_MMA"] = mma
    progress(f"compiling the probe kernels with {site} (T4PATCH_TRITON_MMA={mma})")
    probe = probe_file(cache.parent)
    done = subprocess.run([sys.executable, str(probe)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert Path(result.pop("triton")).resolve().is_relative_to(site.resolve()), "compiled with another Triton"
    return result


def record_mismatches(site: Path) -> list[str]:
    dist = resolve_target(site_packages=str(site)).find("triton")
    assert dist is not None
    return [rel for rel, digest in dist.record().items()
            if digest is not None and not rel.startswith("../") and (site / rel).is_file()
            and sha256_file(site / rel) != digest]


@pytest.fixture(scope="module", params=VERSIONS)
def triton_site(request, tmp_path_factory):
    version = request.param
    tree = extracted_wheel(wheel_path("triton", version), python_only=False)
    site = site_from_extracted(tree, tmp_path_factory.mktemp(f"triton-{version}") / "site", [COMPILER])
    # The cache extraction writes file contents only; the wheel marks Triton's bundled CUDA tools (ptxas,
    # cuobjdump, nvdisasm) executable, as pip would install them (hard links: this also marks the cache's copy).
    for tool in (site / "triton/backends/nvidia/bin").iterdir():
        tool.chmod(0o755)
    return version, site


def test_apply_turns_fp16_dots_into_turing_mma_and_nothing_else(triton_site, cli, tmp_path, monkeypatch):
    version, site = triton_site
    monkeypatch.delenv("T4PATCH_PATCHES", raising=False)
    target = ["--site-packages", str(site)]
    patch_set = find_patch_set("triton", version)
    assert record_mismatches(site) == [], "the fresh install must match its RECORD"
    cache = tmp_path / "one-triton-cache"  # shared by every state below, on purpose

    stock = compile_probe(site, cache, None)
    assert stock["f16-f32@75"]["target"] == "sm_75"
    assert stock["f16-f32@75"]["mma_sync"] == 0 and stock["f16-f32@75"]["fma_rn_f32"] > 0, "stock: FMA path"
    assert stock["f16-f16@75"]["mma_sync"] == 0

    applied = cli("apply", f"triton=={version}", *target)
    assert applied.code == 0, applied.err
    assert sha256_file(site / COMPILER) == patch_set.targets[0].patched_sha256
    patched = compile_probe(site, cache, None)
    for variant in ("f16-f32@75", "f16-f16@75"):
        assert patched[variant]["f16_m16n8k8"] > 0, f"{variant}: Turing mma.sync m16n8k8 expected"
        assert patched[variant]["mma_sync"] == patched[variant]["f16_m16n8k8"]
        assert patched[variant]["fma_rn_f32"] == 0
        assert patched[variant]["key"] != stock[variant]["key"], "patched kernel must not reuse stock's cache entry"
    # Volta (7.0) and every cc >= 8.0 compile as stock, as do non-fp16 dots at 7.5
    for variant in ("f16-f32@70", "f16-f32@80", "f16-f32@86", "f16-f32@89", "f16-f32@90", "f16-f32@100",
                    "f16-f32@120", "bf16-f32@80", "bf16-f32@75", "f32-f32@75", "batched@75"):
        assert patched[variant]["sha256"] == stock[variant]["sha256"], f"{variant}: PTX must be byte-identical"
    assert patched["bf16-f32@75"]["mma_sync"] == 0 and patched["f32-f32@75"]["mma_sync"] == 0
    assert patched["batched@75"]["mma_sync"] == 0 and patched["batched@75"]["fma_rn_f32"] > 0

    switched_off = compile_probe(site, cache, "0")
    assert switched_off["f16-f32@75"]["sha256"] == stock["f16-f32@75"]["sha256"], "switch off = stock PTX"
    assert switched_off["f16-f32@75"]["key"] not in (stock["f16-f32@75"]["key"], patched["f16-f32@75"]["key"])
    assert compile_probe(site, cache, "1")["f16-f32@75"]["sha256"] == patched["f16-f32@75"]["sha256"]

    env = {**os.environ, "PYTHONPATH": str(site), "TRITON_CACHE_DIR": str(cache), "T4PATCH_TRITON_MMA": "yes"}
    bad = subprocess.run([sys.executable, str(probe_file(tmp_path))], env=env, capture_output=True, text=True,
                         timeout=600)
    assert bad.returncode != 0 and "T4PATCH_TRITON_MMA must be 0" in bad.stderr

    status = json.loads(cli("status", "triton", "--json", "--check", *target).out)["engines"][0]
    assert status["state"] == "applied"
    reverted = cli("revert", "triton", *target)
    assert reverted.code == 0, reverted.err
    assert record_mismatches(site) == [], "revert must give back every RECORD sha256"
    assert sha256_file(site / COMPILER) == patch_set.targets[0].pristine_sha256
