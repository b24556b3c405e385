"""The artifact check's PTX-only rule (`--ptx-only` builds, torch extensions) on real nvcc output: exactly PTX for
compute_XY passes, any SASS fails, PTX for another target fails; without the rule the same PTX-only object fails
for lacking SASS, as before."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from t4patch.cuda.arch import parse_arch
from t4patch.verify.artifacts.check import check_artifacts
from tests.helpers import CUDA_KERNEL, NVCC, needs_nvcc

pytestmark = needs_nvcc
SM75 = parse_arch("75")


def compiled(tmp: Path, name: str, gencode: str) -> Path:
    src = tmp / f"{name}.cu"
    src.write_text(CUDA_KERNEL.replace("NAME", name))
    out = tmp / f"{name}.o"
    assert NVCC is not None
    subprocess.run([NVCC, "-c", str(src), "-o", str(out), "-gencode", gencode], check=True, capture_output=True)
    return out


@pytest.mark.parametrize(
    ("gencode", "problem"),
    [
        ("arch=compute_75,code=compute_75", None),
        ("arch=compute_75,code=[compute_75,sm_75]", "a PTX-only build carries SASS for sm_75"),
        ("arch=compute_80,code=compute_80", "expected PTX for compute_75 only, found PTX compute_80"),
    ],
)
def test_ptx_only_builds_must_carry_exactly_the_targets_ptx(tmp_path, gencode, problem):
    obj = compiled(tmp_path, "k", gencode)
    report = check_artifacts([obj], SM75, cuda_files=(obj,), use_cuobjdump=False, ptx_only=True)
    if problem is None:
        assert report.ok, report.all_problems()
    else:
        assert not report.ok and any(problem in p for p in report.all_problems()), report.all_problems()


def test_without_the_rule_ptx_only_code_still_lacks_sass(tmp_path):
    obj = compiled(tmp_path, "k", "arch=compute_75,code=compute_75")
    report = check_artifacts([obj], SM75, require=("sass",), use_cuobjdump=False)
    assert not report.ok and any("no sm_75 SASS" in p for p in report.all_problems())
