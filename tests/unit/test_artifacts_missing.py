"""`verify build` advice fits the file: a released library whose gaps are architecture-specific code is not told
to rebuild llama.cpp; a t4patch build is told to rebuild; a library without target code is told so."""

from __future__ import annotations

from pathlib import Path

from t4patch.cuda.fatbin import cuda_architectures
from t4patch.verify.artifacts.missing import advice, container_gaps
from tests.helpers import cubin, fatbin_container, fatbin_entry


def library(path: Path, *containers: tuple[int, ...]) -> Path:
    path.write_bytes(b"".join(fatbin_container(*(fatbin_entry(2, sm, cubin(sm)) for sm in sms)) + b"\0" * 8
                              for sms in containers))
    return path


def test_released_library_with_hopper_and_ampere_only_units(tmp_path):
    summary = cuda_architectures(library(tmp_path / "lib.fatbin", (75, 80), (90,), (100, 120), (80, 86)))
    gaps = container_gaps(summary, 75)
    assert (gaps.with_target, gaps.newer_only, gaps.ampere_class) == (1, 2, 1) and gaps.only_architecture_specific
    text = advice([("lib.so", summary)], 75, None)
    assert "Nothing to rebuild" in text and "t4patch build" not in text
    assert "2 are built only for sm_90 or newer" in text and "1 are built for sm_80..sm_89" in text
    # the same gaps in a t4patch build still say what they are, not "rebuild llama.cpp"
    assert "t4patch build llama.cpp" not in advice([("lib.so", summary)], 75, "t4patch build llama.cpp --arch 75")


def test_build_without_target_code_is_told_to_rebuild(tmp_path):
    summary = cuda_architectures(library(tmp_path / "b.fatbin", (80, 86)))
    assert container_gaps(summary, 75).only_architecture_specific is False
    assert advice([("b", summary)], 75, "t4patch build llama.cpp --arch 75") == (
        "rebuild for this architecture: t4patch build llama.cpp --arch 75"
    )
    other = advice([("b", summary)], 75, None)
    assert "with sm_75 in its CUDA architecture list" in other and "t4patch build" not in other


def test_a_hopper_only_library_is_not_told_to_rebuild(tmp_path):
    summary = cuda_architectures(library(tmp_path / "h.fatbin", (90,), (90, 100)))
    gaps = container_gaps(summary, 75)
    assert (gaps.with_target, gaps.newer_only) == (0, 2) and gaps.only_architecture_specific
    text = advice([("flashmla.so", summary)], 75, None)
    assert "Nothing to rebuild" in text and "Rebuild" not in text
