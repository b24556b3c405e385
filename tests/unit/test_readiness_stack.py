"""doctor's readiness checks: each says ok / warn / fail with a reason and a fix, from files alone.

Libraries are synthetic ELF files with a ``.nv_fatbin`` section built here (the fatbin writers are the shared
test helpers), so the checks read real fatbin headers without a GPU, a CUDA toolkit or a 1 GB torch.
"""

from __future__ import annotations

import json
import struct
import sys
import time
from pathlib import Path

import pytest

import t4patch.commands.doctor as doctor
from t4patch.commands.engine_table import ENGINES
from t4patch.cuda.code_index import code_architectures
from t4patch.cuda.gpu import Gpu, GpuReport
from t4patch.environment.target import resolve_target
from t4patch.readiness import stack
from t4patch.readiness.model import Check, Context
from tests.helpers import T4, cubin, fatbin_container, fatbin_entry, make_dist

A100 = Gpu(0, "NVIDIA A100", "8.0", 166912, 108, 40 * 2**30)
ROOMY = {"ram_total": 64 * 2**30, "ram_available": 60 * 2**30, "swap_total": 0, "swap_free": 0}


def elf_with_fatbin(path: Path, sass: tuple[int, ...] = (), ptx: tuple[int, ...] = ()) -> Path:
    """A minimal ELF64 shared object whose only section besides the string table is a .nv_fatbin."""
    entries = [fatbin_entry(2, sm, cubin(sm)) for sm in sass]
    entries += [fatbin_entry(1, sm, f".version 8.0\n.target sm_{sm}\n".encode()) for sm in ptx]
    fatbin = fatbin_container(*entries) if entries else b""
    names = b"\0.nv_fatbin\0.shstrtab\0"
    fat_off = 64
    str_off = fat_off + len(fatbin)
    sh_off = str_off + len(names) + (-(str_off + len(names)) % 8)
    header = b"\x7fELF" + bytes([2, 1, 1, 0]) + b"\0" * 8
    header += struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, sh_off, 0, 64, 0, 0, 64, 3, 2)
    body = fatbin + names + b"\0" * (sh_off - str_off - len(names))
    sections = b"\0" * 64
    sections += struct.pack("<IIQQQQIIQQ", 1, 1, 0, 0, fat_off, len(fatbin), 0, 0, 8, 0)
    sections += struct.pack("<IIQQQQIIQQ", 12, 3, 0, 0, str_off, len(names), 0, 0, 1, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header + body + sections)
    return path


def context(site: Path, gpus: tuple[Gpu, ...] = (T4,), memory: dict | None = None) -> Context:
    target = resolve_target(None, str(site))
    return Context(target, GpuReport(gpus, "580.1", "13.0", ("nvml",)), memory or ROOMY, ENGINES)


def torch_env(tmp_path: Path, *, sass: tuple[int, ...] = (), ptx: tuple[int, ...] = (), cuda: bool = True) -> Path:
    site = tmp_path / "site"
    files = {"torch/__init__.py": ""}
    if cuda:
        files["torch/lib/libtorch_cuda.so"] = ""
    make_dist(site, name="torch", version="2.13.0", files=files)
    if cuda:
        elf_with_fatbin(site / "torch/lib/libtorch_cuda.so", sass, ptx)
    return site


def test_code_index_reads_architectures_from_headers(tmp_path):
    lib = elf_with_fatbin(tmp_path / "lib.so", sass=(80, 90), ptx=(70,))
    archs = code_architectures(lib)
    assert archs.sass == {80, 90} and archs.ptx == {70} and archs.containers == 1 and archs.problem is None
    assert archs.runs_on(75) == "ptx" and archs.runs_on(80) == "sass"
    assert code_architectures(elf_with_fatbin(tmp_path / "b.so", sass=(80,))).runs_on(75) == "none"
    (tmp_path / "text.so").write_text("not an ELF")
    assert code_architectures(tmp_path / "text.so").problem


@pytest.mark.parametrize(
    ("sass", "ptx", "cuda", "status"),
    [((75, 80), (), True, "ok"), ((80, 90), (), True, "fail"), ((80,), (70,), True, "warn"), ((), (), False, "fail")],
)
def test_torch_architecture_list(tmp_path, sass, ptx, cuda, status):
    check = stack.torch_cuda_arch(context(torch_env(tmp_path, sass=sass, ptx=ptx, cuda=cuda)))
    assert check.status == status
    if status != "ok":
        assert check.fix and "pip install" in check.fix and "--target" in check.fix  # aimed at the target
    if status == "fail" and cuda:
        assert "sm_80" in check.reason and "no kernel image" in check.reason


def test_torch_without_sm75_is_fine_without_a_turing_gpu(tmp_path):
    assert stack.torch_cuda_arch(context(torch_env(tmp_path, sass=(80,)), gpus=(A100,))).status == "ok"


def test_triton_version_against_torch_pin(tmp_path):
    site = torch_env(tmp_path, sass=(75,))
    meta = site / "torch-2.13.0.dist-info" / "METADATA"
    meta.write_text(meta.read_text() + "Requires-Dist: triton==3.8.0\n")
    assert stack.triton_version(context(site)).status == "warn"  # CUDA torch, no triton
    make_dist(site, name="triton", version="3.7.1", files={"triton/__init__.py": ""})
    check = stack.triton_version(context(site))
    assert check.status == "warn" and "triton==3.8.0" in (check.fix or "")


def test_nvcc_needed_at_run_time(tmp_path, monkeypatch):
    site = tmp_path / "site"
    make_dist(site, name="sglang", version="0.5.23", files={"sglang/__init__.py": ""})
    monkeypatch.setattr(stack, "nvcc_release", lambda: (None, None))
    check = stack.nvcc_at_runtime(context(site))
    assert check.status == "warn" and "sglang" in check.reason and "CUDA_HOME" in (check.fix or "")
    monkeypatch.setattr(stack, "nvcc_release", lambda: ("/opt/cuda/bin/nvcc", "12.8"))
    assert stack.nvcc_at_runtime(context(site)).status == "ok"
    assert stack.nvcc_at_runtime(context(tmp_path / "site")).reason.startswith("nvcc 12.8")


def test_flashinfer_on_turing(tmp_path):
    site = tmp_path / "site"
    make_dist(site, name="flashinfer_python", version="0.7.2", files={"flashinfer/__init__.py": ""})
    make_dist(site, name="sglang", version="0.5.23", files={"sglang/__init__.py": ""})
    check = stack.flashinfer_turing(context(site))
    assert check.status == "warn" and "flashinfer#3620" in check.reason and "--sampling-backend pytorch" in check.fix
    assert stack.flashinfer_turing(context(site, gpus=(A100,))).status == "ok"


def test_memory_against_model_load(tmp_path):
    small = {"ram_total": int(3.8 * 2**30), "ram_available": 0, "swap_total": 0, "swap_free": 0}
    check = stack.memory_for_model(context(tmp_path, memory=small))
    assert check.status == "warn" and "swapon" in (check.fix or "") and "3.8 GiB" in check.reason
    # the threshold is the seed article's VM as the article prints it (7.4 GiB RAM, no swap reported), never a
    # made-up need (issue 23.5): the article has no swap figure, and nobody measured the load's peak
    assert "7.4 GiB RAM" in check.reason and "not measured" in check.reason
    assert "needs about" not in check.reason and "23.5" not in check.reason
    assert "fallocate -l 4G" in (check.fix or "")
    article_vm = {"ram_total": int(7.36 * 2**30), "ram_available": 0, "swap_total": 0, "swap_free": 0}
    assert stack.memory_for_model(context(tmp_path, memory=article_vm)).status == "ok"
    assert stack.memory_for_model(context(tmp_path)).status == "ok"


def test_multi_gpu_peer_to_peer(tmp_path, monkeypatch):
    site = tmp_path / "site"
    make_dist(site, name="vllm", version="0.33.0", files={"vllm/__init__.py": ""})
    second = Gpu(1, "Tesla T4", "7.5", 65536, 40, 15 * 2**30)
    monkeypatch.setattr(stack, "_p2p_pairs", lambda count: [(0, 1, False)])
    check = stack.multi_gpu(context(site, gpus=(T4, second)))
    assert check.status == "warn" and "0-1" in check.reason and "--disable-custom-all-reduce" in (check.fix or "")
    monkeypatch.setattr(stack, "_p2p_pairs", lambda count: [(0, 1, True)])
    assert stack.multi_gpu(context(site, gpus=(T4, second))).status == "ok"
    assert stack.multi_gpu(context(site)).status == "ok"  # one GPU


def sglang_kernel_env(tmp_path: Path, sass: tuple[int, ...]) -> Path:
    site = tmp_path / "site"
    make_dist(site, name="sglang", version="0.5.23", files={
        "sglang/__init__.py": "",
        "sglang/srt/layers/activation.py": "if _is_cuda:\n    from sgl_kernel import silu_and_mul as _s\n",
        "sglang/srt/layers/layernorm.py": "from sgl_kernel import (\n    rmsnorm,\n    fused_add_rmsnorm,\n)\n",
    })
    make_dist(site, name="sglang_kernel", version="0.4.10", files={"sgl_kernel/common_ops.abi3.so": ""})
    elf_with_fatbin(site / "sgl_kernel/common_ops.abi3.so", sass=sass)
    return site


def test_sglang_kernel_without_sm75_names_the_ops_and_the_flag(tmp_path):
    from t4patch.engines.sglang.readiness import kernel_code

    check = kernel_code(context(sglang_kernel_env(tmp_path, (80, 90))))
    assert check.status == "fail"
    assert "fused_add_rmsnorm, rmsnorm, silu_and_mul" in check.reason and "sm_80, sm_90" in check.reason
    assert "--enable-torch-compile" in (check.fix or "")
    assert kernel_code(context(sglang_kernel_env(tmp_path / "b", (75, 80)))).status == "ok"


def test_doctor_json_and_text_carry_the_checks_within_120_columns(tmp_path, cli, monkeypatch):
    site = sglang_kernel_env(tmp_path, (80,))
    monkeypatch.setattr(doctor, "detect", lambda: GpuReport((T4,), "580.1", "13.0", ("nvml",)))
    started = time.perf_counter()
    doc = json.loads(cli("doctor", "--json", "--site-packages", str(site)).out)
    elapsed = time.perf_counter() - started
    by_name = {c["name"]: c for c in doc["checks"]}
    assert by_name["sglang-kernel"]["status"] == "fail" and set(by_name) >= {"torch-cuda-arch", "nvcc", "memory"}
    assert all(set(c) == {"name", "status", "reason", "fix"} for c in doc["checks"])
    text = cli("doctor", "--site-packages", str(site)).out
    block = text[text.index("checks:"):]
    assert "fail  sglang-kernel" in block and "fix: do not serve with --enable-torch-compile" in block
    lines = block.split("\n\n")[0].splitlines()
    assert max(len(line) for line in lines if "fix: " not in line) <= 120  # reasons wrap; fixes stay pasteable
    assert all(line.strip().startswith("fix: ") for line in lines if "fix: " in line)
    assert "torch" not in sys.modules or sys.modules["torch"].__name__ == "torch"  # doctor itself imports no torch
    assert elapsed < 1.0, f"doctor took {elapsed:.2f} s"


def test_a_check_status_is_one_of_three():
    with pytest.raises(ValueError):
        Check("x", "maybe", "reason")


def test_sm75_kernel_counts_are_decoded_once_then_read_from_the_cache(tmp_path, monkeypatch):
    from t4patch.engines.vllm import readiness

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    library = tmp_path / "lib.so"
    library.write_bytes(b"x")
    names = ("_ZN4vllm6MarlinILi1EEEvv", "gptq_marlin_repack_kernel", "_ZN4vllm19cross_device_reduce1E")
    monkeypatch.setattr(readiness, "sm75_function_names", lambda path: names)
    assert readiness.sm75_kernel_counts(library) == {"marlin_gemm": 1, "marlin_repack": 1, "all_reduce": 1}

    def decode_again(path):
        raise AssertionError("decoded again although the cache holds the counts")

    monkeypatch.setattr(readiness, "sm75_function_names", decode_again)
    assert readiness.sm75_kernel_counts(library)["all_reduce"] == 1
    library.write_bytes(b"a reinstalled library")  # new size and mtime: a new key, decoded again
    with pytest.raises(AssertionError, match="decoded again"):
        readiness.sm75_kernel_counts(library)
