"""The vllm-marlin-sm75 recipe against the real vLLM 0.33.0 sdist (skipped when it is not on this machine).

Everything up to the compiler: the archive's sha256 and every pinned file, the exact source change, vLLM's
generate_kernels.py for 7.5 writing exactly the recipe's seven sm75_kernel_*.cu and kernel_selector.h (all
stages = 2), and the three op schemas read from vLLM's torch_bindings.cpp. The sdist comes from
$T4PATCH_VLLM_SDIST or ~/.cache/t4patch/sdists/ (see docs/build.md, "The Marlin sm_75 extension").
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from t4patch.builder import extension as ext
from t4patch.builder.recipe import load_recipe
from t4patch.builder.sdist import locate_sdist, read_sources
from t4patch.engines.vllm import marlin_sm75 as m
from t4patch.fileio.hashing import sha256_file

pytest.importorskip("jinja2")  # vLLM's generator needs it


@pytest.fixture(scope="module")
def real():
    spec = load_recipe(m.RECIPE_NAME).extension
    assert spec is not None
    try:
        sdist = locate_sdist(spec)
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"no vLLM 0.33.0 sdist here: {exc}")
    return spec, read_sources(spec, sdist)


def test_real_sdist_matches_every_pin(real):
    spec, (sources, origin) = real
    assert set(sources) == {path for path, _ in spec.files}
    if origin["kind"] == "archive":
        assert origin["sdist_sha256"] == spec.sdist_sha256


def test_change_generator_and_schemas_on_the_real_sources(real, tmp_path):
    spec, (sources, _) = real
    ext.write_tree(spec, sources, tmp_path)
    assert sha256_file(tmp_path / spec.patched_path) == spec.patched_sha256
    argv, cwd = ext.generate_command(spec, ext.Toolchain(None, None, None, None, (), None, sys.executable, ""), tmp_path)
    subprocess.run(argv, cwd=cwd, check=True, capture_output=True)
    generated = ext.generated_files(spec, tmp_path)
    marlin_dir = tmp_path / "csrc" / "quantization" / "marlin"
    kernels = sorted(p.name for p in marlin_dir.glob("sm75_kernel_*.cu"))
    assert len(kernels) == 7 and set(kernels) <= set(generated) and not list(marlin_dir.glob("sm80_kernel_*.cu"))
    for name in kernels:
        text = (marlin_dir / name).read_text()
        instances = [ln for ln in text.splitlines() if ln.startswith("template __global__ void Marlin<")]
        # Marlin<a, b, c, s, threads, m_blocks, n_blocks, k_blocks, m_block_size_8, stages, group_blocks, is_zp_float>
        stages = {ln.split("<", 1)[1].split(">", 1)[0].split(", ")[9] for ln in instances}
        assert instances and stages == {"2"}, (name, stages)
    schemas = ext.op_schemas(sources[spec.bindings].decode(), spec.ops, spec.bindings)
    assert set(schemas) == {"marlin_gemm", "gptq_marlin_repack", "awq_marlin_repack"}
    assert schemas["marlin_gemm"].startswith("marlin_gemm(Tensor a, Tensor? c_or_none, Tensor b_q_weight,")
