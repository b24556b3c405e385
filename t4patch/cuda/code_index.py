"""Which GPU architectures a shared library carries code for, from headers alone, fast enough for `doctor`.

:func:`t4patch.cuda.fatbin.cuda_architectures` reads and checks every payload (and scans the file for PTX
text), which is right for `verify build` and takes seconds on a 1 GB ``libtorch_cuda.so``. `doctor` only needs
the architecture lists, so this reader walks the ELF section headers and then the fatbin container and entry
headers, seeking over every payload: a few thousand small reads, no decompression, no torch import. A file
whose layout it does not understand is reported as unreadable, never guessed at.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from t4patch.cuda.fatbin import FATBIN_MAGIC, FATBIN_SECTIONS, KIND_ELF, KIND_PTX

_SHT_NOBITS = 8


@dataclass(frozen=True)
class CodeArchs:
    """The machine code (SASS) and PTX architectures of one file's fatbins, as compute capabilities (75)."""

    path: Path
    sass: frozenset[int]
    ptx: frozenset[int]
    containers: int
    problem: str | None = None  # why the file could not be read, when it could not

    def runs_on(self, capability: int) -> str:
        """"sass" when it has machine code for ``capability``, "ptx" when only PTX the driver can JIT (a PTX
        of an equal or lower architecture), "none" otherwise."""
        if capability in self.sass:
            return "sass"
        if any(arch <= capability for arch in self.ptx):
            return "ptx"
        return "none"

    def describe(self) -> str:
        sass = ", ".join(f"sm_{a}" for a in sorted(self.sass)) or "none"
        ptx = ", ".join(f"compute_{a}" for a in sorted(self.ptx)) or "none"
        return f"SASS {sass}; PTX {ptx}"


def _sections(fh: BinaryIO) -> list[tuple[str, int, int, int]] | None:
    fh.seek(0)
    ident = fh.read(64)
    if len(ident) < 64 or ident[:4] != b"\x7fELF" or ident[4] != 2 or ident[5] != 1:
        return None
    shoff = struct.unpack_from("<Q", ident, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", ident, 0x3A)
    if shoff == 0 or shnum == 0 or shstrndx >= shnum or shentsize < 64:
        return []
    fh.seek(shoff)
    table = fh.read(shnum * shentsize)
    if len(table) < shnum * shentsize:
        return None
    raw = [struct.unpack_from("<IIQQQQ", table, i * shentsize) for i in range(shnum)]
    str_off, str_size = raw[shstrndx][4], raw[shstrndx][5]
    fh.seek(str_off)
    names = fh.read(str_size)
    out = []
    for name, typ, _flags, _addr, off, size in raw:
        end = names.find(b"\0", name)
        out.append((names[name : end if end >= 0 else len(names)].decode("ascii", "replace"), typ, off, size))
    return out


def code_architectures(path: str | Path) -> CodeArchs:
    """The architectures of every fatbin in the ELF file ``path`` (no payload is read)."""
    path = Path(path)
    sass: set[int] = set()
    ptx: set[int] = set()
    containers = 0
    try:
        with path.open("rb") as fh:
            sections = _sections(fh)
            if sections is None:
                return CodeArchs(path, frozenset(), frozenset(), 0, "not a 64-bit little-endian ELF file")
            for name, typ, off, size in sections:
                if name not in FATBIN_SECTIONS or typ == _SHT_NOBITS:
                    continue
                pos, end = off, off + size
                while pos + 16 <= end:
                    fh.seek(pos)
                    header = fh.read(16)
                    magic, version, hsize, fsize = struct.unpack("<IHHQ", header)
                    if magic != FATBIN_MAGIC:
                        # containers are aligned; the gap between them is zero padding
                        pos += 8
                        continue
                    if version != 1 or hsize < 16:
                        return CodeArchs(path, frozenset(sass), frozenset(ptx), containers,
                                         f"fatbin container version {version} at offset {pos} not understood")
                    containers += 1
                    entry, body_end = pos + hsize, pos + hsize + fsize
                    while entry + 64 <= body_end:
                        fh.seek(entry)
                        head = fh.read(64)
                        kind, _ever, ehsize, psize = struct.unpack_from("<HHIQ", head)
                        arch = struct.unpack_from("<I", head, 28)[0]
                        if kind not in (KIND_PTX, KIND_ELF) or ehsize < 64:
                            return CodeArchs(path, frozenset(sass), frozenset(ptx), containers,
                                             f"fatbin entry at offset {entry} not understood (kind {kind})")
                        (sass if kind == KIND_ELF else ptx).add(arch)
                        entry += ehsize + psize
                    pos = body_end
    except (OSError, struct.error) as exc:
        return CodeArchs(path, frozenset(sass), frozenset(ptx), containers, f"could not read it ({exc})")
    return CodeArchs(path, frozenset(sass), frozenset(ptx), containers)
