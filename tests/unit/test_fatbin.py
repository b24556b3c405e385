"""The pure-Python fatbin reader against objects nvcc compiles in the test, and against synthetic fatbins.

The nvcc tests are the proof that the reader understands what NVIDIA's compiler really writes (every
-compress-mode, multi-arch, PTX-only, shared libraries with several containers, ar archives); the synthetic
tests run everywhere (no nvcc needed) and pin the error paths: corrupt headers, a payload whose cubin names
another SM than its entry header, trailing garbage.
"""

from __future__ import annotations

import json
import struct
import subprocess
from pathlib import Path

import pytest

from t4patch.cuda.fatbin import (
    FLAG_LZ4,
    cuda_architectures,
    lz4_block_decompress,
)
from t4patch.errors import VerificationError
from tests.helpers import CUDA_KERNEL as KERNEL
from tests.helpers import NVCC, needs_nvcc
from tests.helpers import cubin as _cubin
from tests.helpers import fatbin_container as _container
from tests.helpers import fatbin_entry as _entry


def _nvcc(tmp: Path, name: str, *flags: str, shared: bool = False, sources: int = 1) -> Path:
    srcs = []
    for i in range(sources):
        src = tmp / f"{name}_{i}.cu"
        src.write_text(KERNEL.replace("NAME", f"{name}_{i}").replace("axpy", f"axpy{i}"))
        srcs.append(str(src))
    out = tmp / (f"lib{name}.so" if shared else f"{name}.o")
    cmd = [NVCC, *flags, *srcs, "-o", str(out)]
    cmd[1:1] = ["-shared", "-Xcompiler", "-fPIC"] if shared else ["-c"]
    subprocess.run(cmd, check=True, capture_output=True)
    return out


@needs_nvcc
@pytest.mark.parametrize("mode", ["none", "default", "size", "speed", "balance"])
def test_sm75_object_every_compress_mode(tmp_path: Path, mode: str) -> None:
    obj = _nvcc(tmp_path, f"k_{mode}", "-gencode", "arch=compute_75,code=[compute_75,sm_75]", f"-compress-mode={mode}")
    s = cuda_architectures(obj)
    assert s.format == "elf" and s.sections == (".nv_fatbin",)
    assert s.sass == {"sm_75"} and s.ptx == {"compute_75"}
    assert s.containers == 1 and s.containers_without_sass(75) == 0
    # Whatever the compression, each decoded payload named the same SM as its header (else it would raise).
    if s.undecoded == 0:
        assert all(e.decoded and e.payload_arch == 75 for e in s.entries)
    else:  # only when no zstd decoder exists on this machine: reported, never assumed
        assert "zstd" in s.decoders_missing


@needs_nvcc
def test_lz4_entries_are_decoded_in_pure_python(tmp_path: Path) -> None:
    obj = _nvcc(tmp_path, "k_lz4", "-gencode", "arch=compute_75,code=[compute_75,sm_75]", "-compress-mode=speed")
    s = cuda_architectures(obj)
    lz4 = [e for e in s.entries if e.compression == "lz4"]
    assert lz4, f"nvcc -compress-mode=speed wrote no LZ4 entry: {s.compressions}"
    assert all(e.decoded and e.payload_arch == 75 for e in lz4)


@needs_nvcc
def test_multi_arch_and_ptx_only(tmp_path: Path) -> None:
    multi = _nvcc(tmp_path, "multi", "-gencode", "arch=compute_75,code=sm_75", "-gencode", "arch=compute_80,code=sm_80",
                  "-gencode", "arch=compute_90,code=compute_90")
    s = cuda_architectures(multi)
    assert s.sass == {"sm_75", "sm_80"} and s.ptx == {"compute_90"}
    # llama.cpp's default list carries Turing as 75-virtual: PTX only, no sm_75 SASS.
    virt = _nvcc(tmp_path, "virt", "-gencode", "arch=compute_75,code=compute_75")
    v = cuda_architectures(virt)
    assert v.sass == frozenset() and v.ptx == {"compute_75"}
    assert v.containers_without_sass(75) == 1


@needs_nvcc
def test_shared_library_with_several_containers(tmp_path: Path) -> None:
    lib = _nvcc(tmp_path, "two", "-gencode", "arch=compute_75,code=[compute_75,sm_75]", "-compress-mode=size",
                shared=True, sources=2)
    s = cuda_architectures(lib)
    assert s.containers >= 2  # one per translation unit (plus any the device link adds)
    assert s.containers_by_sass["sm_75"] == s.containers
    assert s.sass == {"sm_75"}


@needs_nvcc
def test_ar_archive_members(tmp_path: Path) -> None:
    a = _nvcc(tmp_path, "a75", "-gencode", "arch=compute_75,code=sm_75")
    b = _nvcc(tmp_path, "b80", "-gencode", "arch=compute_80,code=sm_80")
    archive = tmp_path / "libk.a"
    subprocess.run(["ar", "rcs", str(archive), str(a), str(b)], check=True)
    s = cuda_architectures(archive)
    assert s.format == "ar" and set(s.sections) == {"a75.o", "b80.o"}
    assert s.sass == {"sm_75", "sm_80"} and s.containers == 2
    assert s.containers_without_sass(75) == 1


@needs_nvcc
def test_embedded_ptx_text_is_counted_per_target(tmp_path: Path) -> None:
    src = tmp_path / "k.cu"
    src.write_text(KERNEL.replace("NAME", "x"))
    texts = {}
    for arch in (75, 80):
        out = tmp_path / f"k{arch}.ptx"
        subprocess.run([NVCC, "-ptx", f"--gpu-architecture=sm_{arch}", str(src), "-o", str(out)], check=True)
        texts[arch] = out.read_text()
    # The way candle embeds kernels: PTX strings in a host object's read-only data.
    c = tmp_path / "emb.c"
    c.write_text("".join(f"const char K{i}[] = {json.dumps(t)};\n" for i, t in enumerate([texts[75], texts[75], texts[80]])))
    obj = tmp_path / "emb.o"
    subprocess.run(["cc", "-c", str(c), "-o", str(obj)], check=True)
    s = cuda_architectures(obj)
    assert s.containers == 0 and s.ptx_text == {"sm_75": 2, "sm_80": 1}
    assert s.has_cuda_code


# --------------------------------------------------------------------- synthetic fatbins (no nvcc needed)


def test_synthetic_raw_fatbin(tmp_path: Path) -> None:
    ptx = b".version 8.0\n.target sm_75\n.address_size 64\n"
    blob = _container(_entry(2, 75, _cubin(75)), _entry(1, 75, ptx)) + b"\0" * 8 + _container(_entry(2, 86, _cubin(86)))
    path = tmp_path / "k.fatbin"
    path.write_bytes(blob)
    s = cuda_architectures(path)
    assert s.format == "fatbin" and s.containers == 2
    assert s.sass == {"sm_75", "sm_86"} and s.ptx == {"compute_75"}
    assert s.containers_without_sass(75) == 1
    assert all(e.decoded for e in s.entries)


def test_old_cubin_abi_is_read_too(tmp_path: Path) -> None:
    path = tmp_path / "old.fatbin"
    path.write_bytes(_container(_entry(2, 75, _cubin(75, abi=7))))
    assert cuda_architectures(path).entries[0].payload_arch == 75


def test_header_payload_mismatch_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "lie.fatbin"
    path.write_bytes(_container(_entry(2, 75, _cubin(80))))
    with pytest.raises(VerificationError, match="sm_75 but its payload is for 80"):
        cuda_architectures(path)
    # Without decoding, the header alone is reported (and nothing is claimed about the payload).
    s = cuda_architectures(path, decode=False)
    assert s.sass == {"sm_75"} and s.undecoded == 1


def test_corrupt_fatbins_raise(tmp_path: Path) -> None:
    good = _container(_entry(2, 75, _cubin(75)))
    cases = {
        "truncated": good[:-9],
        "bad-kind": good[:16] + struct.pack("<H", 7) + good[18:],
        "garbage-after": good + b"JUNKJUNK",
        "bad-version": good[:4] + struct.pack("<H", 9) + good[6:],
    }
    for name, blob in cases.items():
        path = tmp_path / f"{name}.fatbin"
        path.write_bytes(blob)
        with pytest.raises(VerificationError):
            cuda_architectures(path)


def test_lz4_block_decoder() -> None:
    # Hand-made block: literal "abc", then a match of length 9 at offset 3 (overlapping copy), then literal "Z".
    block = bytes([0x35]) + b"abc" + struct.pack("<H", 3) + bytes([0x10]) + b"Z"
    assert lz4_block_decompress(block, 13) == b"abcabcabcabcZ"
    with pytest.raises(ValueError):
        lz4_block_decompress(block, 12)
    with pytest.raises(ValueError):
        lz4_block_decompress(bytes([0x30]) + b"abc" + struct.pack("<H", 9) + bytes([0x10]) + b"Z", 13)


def test_lz4_entry_in_synthetic_fatbin(tmp_path: Path) -> None:
    cubin = _cubin(75)
    # An all-literal LZ4 block (valid LZ4; no matches) of the cubin.
    n = len(cubin)
    block = bytes([0xF0]) + bytes([255] * ((n - 15) // 255)) + bytes([(n - 15) % 255]) + cubin
    path = tmp_path / "lz4.fatbin"
    path.write_bytes(_container(_entry(2, 75, block, flags=0x11 | FLAG_LZ4, csize=len(block), usize=n)))
    s = cuda_architectures(path)
    assert s.entries[0].compression == "lz4" and s.entries[0].payload_arch == 75


def test_non_cuda_files(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("nothing here")
    s = cuda_architectures(text)
    assert s.format == "other" and not s.has_cuda_code
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert not cuda_architectures(empty).has_cuda_code
    host = Path("/bin/true") if Path("/bin/true").exists() else None
    if host is not None:
        s = cuda_architectures(host)
        assert s.format == "elf" and not s.has_cuda_code
