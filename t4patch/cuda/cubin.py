"""Function names in a cubin (a CUDA ELF), read from its symbol table in pure Python.

"The library has sm_75 SASS" is not the question users have; "the library has sm_75 *Marlin* kernels" is.
This reads the kernel symbols (STT_FUNC) of one decoded cubin so callers can count the kernels they need.
"""

from __future__ import annotations

import struct

_SHT_SYMTAB = 2
_STT_FUNC = 2


def function_names(cubin: bytes) -> list[str]:
    """Names of the function symbols in an ELF64 little-endian cubin; [] for anything else."""
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2 or cubin[5] != 1:
        return []
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", cubin, 0x3A)
    sections = []
    for i in range(shnum):
        base = shoff + i * shentsize
        sh_type, = struct.unpack_from("<I", cubin, base + 4)
        offset, size = struct.unpack_from("<QQ", cubin, base + 0x18)
        link, = struct.unpack_from("<I", cubin, base + 0x28)
        entsize, = struct.unpack_from("<Q", cubin, base + 0x38)
        sections.append((sh_type, offset, size, link, entsize))
    names = []
    for sh_type, offset, size, link, entsize in sections:
        if sh_type != _SHT_SYMTAB or not entsize:
            continue
        _, str_off, str_size, _, _ = sections[link]
        strtab = cubin[str_off:str_off + str_size]
        for s in range(offset, offset + size, entsize):
            st_name, st_info = struct.unpack_from("<IB", cubin, s)
            if st_info & 0xF != _STT_FUNC:
                continue
            end = strtab.find(b"\0", st_name)
            names.append(strtab[st_name:end].decode("ascii", "replace"))
    return names
