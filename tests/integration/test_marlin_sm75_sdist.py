"""The vllm-marlin-sm75 recipe against the real vLLM 0.33.0 sdist (skipped when it is not on this machine).

Everything up to the compiler: the archive's sha256 and every pinned file, the exact source change, vLLM's
generate_kernels.py for 7.5 writing exactly the recipe's seven sm75_kernel_*.cu and kernel_selector.h (all
stages = 2), and the three op schemas read from vLLM's torch_bindings.cpp. The sdist comes from
$T4PATCH_VLLM_SDIST or ~/.cache/t4patch/sdists/ (see docs/verification/marlin-sm75-emulated-2026-12-01.md).
"""

from __future__ import annotations

import sys

import pytest

from t4patch.engines.vllm import marlin_sm75 as m

pytest.importorskip("jinja2")  # vLLM's generator needs it


@pytest.fixture(scope="module")
def real():
    recipe = m.load_recipe()
    try:
        sdist = m.locate_sdist(recipe)
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"no vLLM 0.33.0 sdist here: {exc}")
    return recipe, m.read_sources(recipe, sdist)


def test_real_sdist_matches_every_pin(real):
    recipe, (sources, origin) = real
    assert set(sources) == {path for path, _ in recipe.files}
    if origin["kind"] == "archive":
        assert origin["sdist_sha256"] == recipe.sdist_sha256


def test_change_generator_and_schemas_on_the_real_sources(real, tmp_path):
    recipe, (sources, _) = real
    done = m.prepare_tree(recipe, sources, tmp_path, sys.executable, lambda text: None)
    assert done["patched"]["sha256"] == recipe.patched_sha256
    marlin_dir = tmp_path / "csrc" / "quantization" / "marlin"
    kernels = sorted(p.name for p in marlin_dir.glob("sm75_kernel_*.cu"))
    assert len(kernels) == 7 and not list(marlin_dir.glob("sm80_kernel_*.cu"))
    for name in kernels:
        text = (marlin_dir / name).read_text()
        instances = [ln for ln in text.splitlines() if ln.startswith("template __global__ void Marlin<")]
        # Marlin<a, b, c, s, threads, m_blocks, n_blocks, k_blocks, m_block_size_8, stages, group_blocks, is_zp_float>
        stages = {ln.split("<", 1)[1].split(">", 1)[0].split(", ")[9] for ln in instances}
        assert instances and stages == {"2"}, (name, stages)
    assert set(done["schemas"]) == {"marlin_gemm", "gptq_marlin_repack", "awq_marlin_repack"}
    assert done["schemas"]["marlin_gemm"].startswith("marlin_gemm(Tensor a, Tensor? c_or_none, Tensor b_q_weight,")
