"""Which GPU architectures a built library or binary carries code for, read in pure Python.

An sm_75 build is only proven by its artifacts: a CMake cache that says ``75`` proves nothing if another
flag won, and ``75-virtual`` (llama.cpp's own default) ships PTX only, which the driver JIT-compiles at the
first run. NVIDIA's ``cuobjdump`` answers the question but is often not installed (it is not in the pip
CUDA wheels), so this module reads the container format itself; ``cuobjdump`` only cross-checks.

What is read:

* ELF sections ``.nv_fatbin`` / ``__nv_relfatbin`` (and a raw ``.fatbin`` file): a sequence of fatbin
  containers (magic 0xBA55ED50, u16 version, u16 header size, u64 payload size), each holding entries with
  a 64- or 80-byte header: u16 kind (1 = PTX, 2 = ELF/SASS), u16 version 0x0101, u32 header size, u64
  stored payload size, u32 compressed size, u32 arch at offset 28, u64 flags at 40 (0x2000 = LZ4, 0x8000 =
  zstd), u64 uncompressed size at 56. Kind and arch sit in the uncompressed header, so the architecture
  list never depends on decompression. Layout confirmed on nvcc 13.0 objects (``-compress-mode`` none,
  default, size, speed, balance); NVIDIA does not document it, so anything unexpected raises instead of
  being guessed.
* When the payload can be decoded (uncompressed, LZ4 in pure Python, zstd through ``compression.zstd``,
  the ``zstandard`` module or the ``zstd`` command), the payload is checked against its header: a SASS
  entry must be a cubin whose ELF ``e_flags`` name the same SM, a PTX entry's ``.target`` the same arch.
  Entries that cannot be decoded are counted and reported, never silently assumed consistent.
* PTX text embedded outside any fatbin (candle's kernels are ``include_str!``-ed PTX in the Rust binary):
  every ``.version X.Y`` + ``.target sm_NN`` module header is counted per target.
* ``ar`` archives (``.a``) are read member by member.
"""

from __future__ import annotations

import mmap
import re
import shutil
import struct
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from t4patch.errors import VerificationError

FATBIN_MAGIC = 0xBA55ED50
_MAGIC_BYTES = struct.pack("<I", FATBIN_MAGIC)
FATBIN_SECTIONS = (".nv_fatbin", "__nv_relfatbin")

KIND_PTX = 1
KIND_ELF = 2
FLAG_LZ4 = 0x2000
FLAG_ZSTD = 0x8000
_EM_CUDA = 190

# A PTX module header: ".version 9.0" then ".target sm_75" (possibly ", debug" etc. after the target).
_PTX_HEADER = re.compile(rb"\.version[ \t]+(\d+)\.(\d+)[ \t]*\r?\n(?:[ \t]*//[^\n]*\n|\s)*?[ \t]*\.target[ \t]+(sm_\d+[af]?)")
_PTX_TARGET = re.compile(rb"\.target[ \t]+(sm_\d+[af]?)")


@dataclass(frozen=True)
class FatbinEntry:
    """One entry of a fatbin container: machine code (SASS) or PTX for one architecture."""

    kind: str  # "sass" or "ptx"
    arch: int  # 75 for sm_75 / compute_75
    container: int  # index of the fatbin container (one per translation unit, in practice) in the file
    compression: str  # "none", "lz4", "zstd" or "unknown:0x...."
    stored_size: int
    decoded: bool  # payload decoded and checked against the header
    payload_arch: int | None = None  # the SM read from the decoded payload (cubin e_flags / PTX .target)

    @property
    def name(self) -> str:
        return f"sm_{self.arch}" if self.kind == "sass" else f"compute_{self.arch}"


@dataclass(frozen=True)
class FatbinSummary:
    """What GPU code one file carries: fatbin SASS and PTX, plus PTX text embedded outside fatbins."""

    path: Path
    format: str  # "elf", "ar", "fatbin" or "other"
    sections: tuple[str, ...]  # fatbin sections found (ELF) or members with CUDA code (ar)
    containers: int
    entries: tuple[FatbinEntry, ...]
    ptx_text: dict[str, int] = field(default_factory=dict)  # embedded PTX modules per .target, e.g. {"sm_75": 12}
    containers_by_sass: dict[str, int] = field(default_factory=dict)  # containers holding SASS for each arch
    undecoded: int = 0  # entries whose payload could not be decoded (no decoder for its compression)
    decoders_missing: tuple[str, ...] = ()  # compressions seen for which no decoder was available

    @property
    def sass(self) -> frozenset[str]:
        return frozenset(e.name for e in self.entries if e.kind == "sass")

    @property
    def ptx(self) -> frozenset[str]:
        return frozenset(e.name for e in self.entries if e.kind == "ptx")

    @property
    def has_cuda_code(self) -> bool:
        return bool(self.entries or self.ptx_text)

    @property
    def compressions(self) -> dict[str, int]:
        return dict(Counter(e.compression for e in self.entries))

    def containers_without_sass(self, arch: int) -> int:
        """How many fatbin containers carry no SASS for ``arch`` (each is code that cannot run natively)."""
        return self.containers - self.containers_by_sass.get(f"sm_{arch}", 0)

    def to_dict(self) -> dict[str, object]:
        return {
            "path": str(self.path),
            "format": self.format,
            "fatbin_sections": list(self.sections),
            "fatbin_containers": self.containers,
            "sass": sorted(self.sass, key=_arch_key),
            "ptx": sorted(self.ptx, key=_arch_key),
            "ptx_text": dict(sorted(self.ptx_text.items(), key=lambda kv: _arch_key(kv[0]))),
            "entries": len(self.entries),
            "compression": self.compressions,
            "entries_decoded": sum(1 for e in self.entries if e.decoded),
            "entries_undecoded": self.undecoded,
            "decoders_missing": list(self.decoders_missing),
            "containers_with_sass": dict(sorted(self.containers_by_sass.items(), key=lambda kv: _arch_key(kv[0]))),
        }


def _arch_key(name: str) -> tuple[int, str]:
    digits = re.search(r"\d+", name)
    return (int(digits.group()) if digits else 0, name)


def arch_sorted(names) -> list[str]:
    """Architecture names in numeric order (sm_75 before sm_120)."""
    return sorted(names, key=_arch_key)


# --------------------------------------------------------------------------------------------- decoders


def _lz4_length(nibble: int, src: bytes, i: int, what: str) -> tuple[int, int]:
    """An LZ4 length: the token's 4-bit value, extended by bytes while they are 255 (when the nibble is 15)."""
    length = nibble
    if nibble == 15:
        while True:
            if i >= len(src):
                raise ValueError(f"truncated {what} length")
            b = src[i]
            i += 1
            length += b
            if b != 255:
                break
    return length, i


def lz4_block_decompress(src: bytes, size: int) -> bytes:
    """Decode one raw LZ4 block (no frame) of known decompressed ``size``; raise ValueError if malformed."""
    out = bytearray()
    i, n = 0, len(src)
    while i < n:
        token = src[i]
        i += 1
        length, i = _lz4_length(token >> 4, src, i, "literal")
        if i + length > n:
            raise ValueError("literal run past end of block")
        out += src[i : i + length]
        i += length
        if i >= n:
            break  # the last sequence has literals only
        if i + 2 > n:
            raise ValueError("truncated match offset")
        offset = src[i] | (src[i + 1] << 8)
        i += 2
        if offset == 0 or offset > len(out):
            raise ValueError("match offset outside decoded data")
        mlen, i = _lz4_length(token & 15, src, i, "match")
        mlen += 4
        start = len(out) - offset
        if mlen <= offset:
            out += out[start : start + mlen]
        else:  # overlapping copy repeats the last `offset` bytes
            for k in range(mlen):
                out.append(out[start + k])
        if len(out) > size:
            raise ValueError("decoded data larger than announced")
    if len(out) != size:
        raise ValueError(f"decoded {len(out)} bytes, header announced {size}")
    return bytes(out)


def _zstd_decoder():
    """A callable bytes -> bytes for zstd frames, or None when this Python has none (see module doc)."""
    try:  # Python >= 3.14
        from compression import zstd as _std

        return _std.decompress
    except ImportError:
        pass
    try:
        import zstandard

        return lambda data: zstandard.ZstdDecompressor().decompress(data, max_output_size=1 << 31)
    except ImportError:
        pass
    exe = shutil.which("zstd")
    if exe:
        def _cli(data: bytes) -> bytes:
            proc = subprocess.run([exe, "-d", "-c", "-q"], input=data, capture_output=True, check=False)
            if proc.returncode != 0:
                raise ValueError(f"zstd -d failed: {proc.stderr.decode(errors='replace').strip()}")
            return proc.stdout

        return _cli
    return None


_ZSTD_UNSET = object()
_zstd_cache: object = _ZSTD_UNSET


def _get_zstd():
    global _zstd_cache
    if _zstd_cache is _ZSTD_UNSET:
        _zstd_cache = _zstd_decoder()
    return _zstd_cache


# -------------------------------------------------------------------------------------------- ELF / ar


def _elf_sections(data) -> list[tuple[str, int, int, int]] | None:
    """(name, type, offset, size) of every section of a little-endian ELF64, or None if not such an ELF."""
    if len(data) < 64 or data[:4] != b"\x7fELF":
        return None
    if data[4] != 2 or data[5] != 1:
        raise VerificationError(
            "only little-endian 64-bit ELF files carry CUDA fatbins t4patch can read",
            hint="pass the x86-64/aarch64 library or binary the build produced",
        )
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    if shoff == 0 or shnum == 0:
        return []
    if shoff + shnum * shentsize > len(data) or shstrndx >= shnum:
        raise VerificationError("ELF section header table lies outside the file (truncated file?)")
    raw = []
    for i in range(shnum):
        name, typ, _flags, _addr, off, size = struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize)
        raw.append((name, typ, off, size))
    str_off, str_size = raw[shstrndx][2], raw[shstrndx][3]
    out = []
    for name, typ, off, size in raw:
        end = data.find(b"\0", str_off + name, str_off + str_size)
        label = bytes(data[str_off + name : end if end >= 0 else str_off + str_size]).decode("ascii", "replace")
        out.append((label, typ, off, size))
    return out


def _ar_members(data) -> list[tuple[str, int, int]]:
    """(name, offset, size) of the members of a System V / GNU ``ar`` archive."""
    members, pos = [], 8
    longnames = b""
    while pos + 60 <= len(data):
        header = bytes(data[pos : pos + 60])
        if header[58:60] != b"`\n":
            raise VerificationError(f"corrupt ar archive member header at offset {pos}")
        name = header[:16].decode("ascii", "replace").strip()
        size = int(header[48:58].decode("ascii").strip() or 0)
        body = pos + 60
        if name == "//":
            longnames = bytes(data[body : body + size])
        elif name.startswith("/") and name[1:].isdigit():
            start = int(name[1:])
            end = longnames.find(b"/\n", start)
            name = longnames[start : end if end >= 0 else len(longnames)].decode("ascii", "replace")
        if name not in ("/", "//", "/SYM64/"):
            members.append((name.rstrip("/"), body, size))
        pos = body + size + (size & 1)
    return members


# ---------------------------------------------------------------------------------------- fatbin parse


@dataclass
class _Acc:
    entries: list[FatbinEntry] = field(default_factory=list)
    containers: int = 0
    by_sass: Counter = field(default_factory=Counter)
    undecoded: int = 0
    missing: set[str] = field(default_factory=set)
    keep_sass: int | None = None  # decode and keep the SASS payloads of this arch (see sass_payloads)
    payloads: list[bytes] = field(default_factory=list)


def _decode_payload(payload: bytes, flags: int, usize: int, csize: int) -> tuple[str, bytes | None]:
    if flags & FLAG_ZSTD:
        decoder = _get_zstd()
        if decoder is None:
            return "zstd", None
        try:
            return "zstd", decoder(payload[: csize or len(payload)])
        except Exception as exc:
            raise VerificationError(f"zstd payload of a fatbin entry does not decode ({exc})") from exc
    if flags & FLAG_LZ4:
        try:
            return "lz4", lz4_block_decompress(payload[: csize or len(payload)], usize)
        except ValueError as exc:
            raise VerificationError(f"LZ4 payload of a fatbin entry does not decode ({exc})") from exc
    if flags & 0xF000 & ~(FLAG_LZ4 | FLAG_ZSTD) or (csize and not flags & (FLAG_LZ4 | FLAG_ZSTD)):
        return f"unknown:0x{flags:x}", None
    return "none", payload


def _payload_arch(kind: int, data: bytes) -> int | None:
    if kind == KIND_ELF:
        if len(data) < 52 or data[:4] != b"\x7fELF":
            raise VerificationError("a SASS entry of a fatbin does not hold an ELF cubin")
        machine = struct.unpack_from("<H", data, 18)[0]
        if machine != _EM_CUDA:
            raise VerificationError(f"a SASS entry's cubin has e_machine {machine}, expected {_EM_CUDA} (CUDA)")
        flags = struct.unpack_from("<I", data, 48)[0]
        # cubin ELF ABI >= 8 (CUDA 12.8+, OSABI 0x41) keeps the SM in bits 8..15, older ones in bits 0..7.
        return (flags >> 8) & 0xFF if data[8] >= 8 else flags & 0xFF
    match = _PTX_TARGET.search(data[:4096])
    if match is None:
        raise VerificationError("a PTX entry of a fatbin has no .target line")
    digits = re.search(rb"\d+", match.group(1))
    if digits is None:
        raise VerificationError(f"a PTX entry of a fatbin has a .target without an architecture number ({match.group(1)!r})")
    return int(digits.group())


def _parse_fatbin_region(data, start: int, end: int, acc: _Acc, decode: bool) -> None:
    """Parse every fatbin container in data[start:end] (containers may be separated by alignment padding)."""
    pos = start
    while pos < end:
        found = data.find(_MAGIC_BYTES, pos, end)
        if found < 0:
            tail = bytes(data[pos:end])
            if tail.strip(b"\0"):
                raise VerificationError(f"{end - pos} bytes after the last fatbin container are not padding")
            return
        if bytes(data[pos:found]).strip(b"\0"):
            raise VerificationError(f"unexpected bytes at offset {pos} before a fatbin container")
        pos = found
        if pos + 16 > end:
            raise VerificationError("truncated fatbin container header")
        _magic, version, hsize, fsize = struct.unpack_from("<IHHQ", data, pos)
        if version != 1 or hsize < 16:
            raise VerificationError(f"fatbin container version {version} / header {hsize} not understood")
        body, body_end = pos + hsize, pos + hsize + fsize
        if body_end > end:
            raise VerificationError("fatbin container runs past the end of its section")
        index = acc.containers
        acc.containers += 1
        sass_here: set[str] = set()
        e = body
        while e < body_end:
            if e + 64 > body_end:
                raise VerificationError("truncated fatbin entry header")
            kind, ever, ehsize, psize, csize = struct.unpack_from("<HHIQI", data, e)
            arch = struct.unpack_from("<I", data, e + 28)[0]
            flags, usize = struct.unpack_from("<Q", data, e + 40)[0], struct.unpack_from("<Q", data, e + 56)[0]
            if kind not in (KIND_PTX, KIND_ELF) or ehsize < 64 or e + ehsize + psize > body_end:
                raise VerificationError(
                    f"fatbin entry at offset {e} not understood (kind {kind}, version 0x{ever:x}, header {ehsize})"
                )
            payload = bytes(data[e + ehsize : e + ehsize + psize])
            compression = "none"
            decoded, payload_arch = False, None
            keep = kind == KIND_ELF and arch == acc.keep_sass
            if decode or keep:
                compression, plain = _decode_payload(payload, flags, usize, csize)
                if keep and plain is not None:
                    acc.payloads.append(plain)
                if plain is None:
                    acc.undecoded += 1
                    acc.missing.add(compression)
                else:
                    payload_arch = _payload_arch(kind, plain)
                    decoded = True
                    if payload_arch != arch:
                        raise VerificationError(
                            f"fatbin entry header says {'sm' if kind == KIND_ELF else 'compute'}_{arch} but its "
                            f"payload is for {payload_arch}"
                        )
            else:
                compression = "zstd" if flags & FLAG_ZSTD else "lz4" if flags & FLAG_LZ4 else "none"
                acc.undecoded += 1
            entry = FatbinEntry("sass" if kind == KIND_ELF else "ptx", arch, index, compression, psize,
                                decoded, payload_arch)
            acc.entries.append(entry)
            if entry.kind == "sass":
                sass_here.add(entry.name)
            e += ehsize + psize
        for name in sass_here:
            acc.by_sass[name] += 1
        pos = body_end


def _scan_ptx_text(data, skip: list[tuple[int, int]]) -> Counter:
    """Count PTX module headers (``.version`` then ``.target``) outside the byte ranges in ``skip``."""
    found: Counter = Counter()
    for match in _PTX_HEADER.finditer(data):
        at = match.start()
        if any(lo <= at < hi for lo, hi in skip):
            continue
        found[match.group(3).decode()] += 1
    return found


def _summarize_buffer(data, acc: _Acc, decode: bool) -> tuple[str, list[str], Counter]:
    """Parse one ELF or raw fatbin held in ``data``; return (format, fatbin sections, embedded PTX text)."""
    if bytes(data[:4]) == _MAGIC_BYTES:
        _parse_fatbin_region(data, 0, len(data), acc, decode)
        return "fatbin", [], Counter()
    sections = _elf_sections(data)
    if sections is None:
        return "other", [], _scan_ptx_text(data, [])
    names, skip = [], []
    for name, typ, off, size in sections:
        if name in FATBIN_SECTIONS and typ != 8:  # 8 = SHT_NOBITS
            if off + size > len(data):
                raise VerificationError(f"ELF section {name} lies outside the file (truncated file?)")
            names.append(name)
            skip.append((off, off + size))
            _parse_fatbin_region(data, off, off + size, acc, decode)
    return "elf", names, _scan_ptx_text(data, skip)


def cuda_architectures(path: str | Path, *, decode: bool = True) -> FatbinSummary:
    """Read ``path`` (ELF object/library/binary, ``ar`` archive or raw fatbin) and list its GPU code.

    Raises VerificationError when a fatbin is present but malformed or inconsistent with itself.
    """
    path = Path(path)
    acc = _Acc()
    ptx_text: Counter = Counter()
    with path.open("rb") as fh:
        size = fh.seek(0, 2)
        if size == 0:
            return FatbinSummary(path, "other", (), 0, ())
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
            if data[:8] == b"!<arch>\n":
                fmt, names = "ar", []
                for member, off, msize in _ar_members(data):
                    before = acc.containers
                    _kind, _secs, text = _summarize_buffer(data[off : off + msize], acc, decode)
                    if acc.containers > before or text:
                        names.append(member)
                    ptx_text.update(text)
            else:
                fmt, names, text = _summarize_buffer(data, acc, decode)
                ptx_text.update(text)
    return FatbinSummary(
        path=path,
        format=fmt,
        sections=tuple(names),
        containers=acc.containers,
        entries=tuple(acc.entries),
        ptx_text=dict(ptx_text),
        containers_by_sass=dict(acc.by_sass),
        undecoded=acc.undecoded,
        decoders_missing=tuple(sorted(acc.missing)),
    )


def sass_payloads(path: str | Path, arch: int) -> list[bytes]:
    """The decoded cubins (SASS) for ``sm_<arch>`` in an ELF library, e.g. to list the kernels it carries.

    Only those entries are decompressed, so this stays fast on a 90 MB library. Raises VerificationError when
    the fatbin is malformed or an entry of that arch cannot be decoded (no decoder for its compression).
    """
    acc = _Acc(keep_sass=arch)
    with Path(path).open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
        _summarize_buffer(data, acc, decode=False)
    wanted = sum(1 for e in acc.entries if e.kind == "sass" and e.arch == arch)
    if len(acc.payloads) != wanted:
        raise VerificationError(
            f"{path}: {wanted - len(acc.payloads)} of {wanted} sm_{arch} entries could not be decoded "
            f"(compression {', '.join(sorted(acc.missing)) or '?'})",
            hint="pip install zstandard (or install the zstd command)",
        )
    return acc.payloads
