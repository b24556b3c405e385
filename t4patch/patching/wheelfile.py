"""Read a wheel's members as stored, and write a wheel whose bytes depend only on what goes into it.

A patched wheel must keep every byte it does not change and must come out identical every time it is made
from the same inputs. Python's :mod:`zipfile` can do neither: it recompresses every member it writes (the
output then depends on the zlib build of the machine) and stamps new members with the current time. So this
module copies an unchanged member's compressed bytes as they are (same method, CRC, time and permissions),
stores changed or new members uncompressed (no zlib involved) with a timestamp chosen by the caller, and
writes headers with no extra fields and no data descriptors, in the order given. Archives that would need
ZIP64 (a member or the archive over 4 GiB, more than 65,535 members) are refused rather than half-supported.
"""

from __future__ import annotations

import struct
import zipfile
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import BinaryIO

from t4patch.errors import UsageError

_LOCAL = struct.Struct("<IHHHHHIIIHH")  # local file header (APPNOTE 4.3.7)
_LOCAL_SIG = 0x04034B50
_CENTRAL_SIG = 0x02014B50
_END_SIG = 0x06054B50
_ZIP32_MAX = 0xFFFFFFFF
_MAX_MEMBERS = 0xFFFF
_DATA_DESCRIPTOR = 0x08
_UTF8 = 0x800


@dataclass(frozen=True)
class Member:
    """One member to write: either the input's stored bytes (``raw``) or new plain bytes."""

    name: str
    method: int  # 0 stored, 8 deflated
    crc: int
    compressed: bytes
    size: int  # uncompressed
    date_time: tuple[int, int, int, int, int, int]
    external_attr: int
    create_version: int
    create_system: int
    extract_version: int
    flags: int

    @staticmethod
    def new(name: str, data: bytes, *, like: zipfile.ZipInfo | None, date_time: tuple[int, int, int, int, int, int],
            mode: int = 0o100644) -> Member:
        """A stored (uncompressed) member; attributes from ``like`` (the member it replaces) when given."""
        return Member(
            name=name, method=zipfile.ZIP_STORED, crc=zlib.crc32(data), compressed=data, size=len(data),
            date_time=date_time,
            external_attr=like.external_attr if like is not None else (mode << 16),
            create_version=like.create_version if like is not None else 20,
            create_system=like.create_system if like is not None else 3,
            extract_version=20, flags=_UTF8 if not name.isascii() else 0,
        )


def stored_bytes(archive: BinaryIO, info: zipfile.ZipInfo) -> bytes:
    """The member's compressed bytes exactly as they lie in ``archive`` (after its local header)."""
    archive.seek(info.header_offset)
    header = archive.read(_LOCAL.size)
    fields = _LOCAL.unpack(header)
    if fields[0] != _LOCAL_SIG:
        raise UsageError(f"{info.filename}: expected a zip local header at offset {info.header_offset}, found other "
                         "bytes (a damaged wheel)", hint="download the wheel again")
    archive.seek(info.header_offset + _LOCAL.size + fields[9] + fields[10])
    data = archive.read(info.compress_size)
    if len(data) != info.compress_size:
        raise UsageError(f"{info.filename}: the archive ends inside this member (a truncated wheel)",
                         hint="download the wheel again")
    return data


def copied(archive: BinaryIO, info: zipfile.ZipInfo, name: str | None = None) -> Member:
    """An unchanged member of the input, under ``name`` (default: its own), its stored bytes kept."""
    new_name = name if name is not None else info.filename
    return Member(
        name=new_name, method=info.compress_type, crc=info.CRC, compressed=stored_bytes(archive, info),
        size=info.file_size, date_time=info.date_time, external_attr=info.external_attr,
        create_version=info.create_version, create_system=info.create_system,
        extract_version=info.extract_version,
        flags=(info.flag_bits & ~_DATA_DESCRIPTOR & _UTF8) | (_UTF8 if not new_name.isascii() else 0),
    )


def _dos_time(date_time: tuple[int, int, int, int, int, int]) -> tuple[int, int]:
    year, month, day, hour, minute, second = date_time
    return (hour << 11) | (minute << 5) | (second // 2), ((year - 1980) << 9) | (month << 5) | day


def write_archive(out: BinaryIO, members: Iterable[Member]) -> None:
    """Write ``members`` in order as a complete zip archive (no ZIP64, no extra fields, no comments)."""
    central: list[bytes] = []
    offset = 0
    count = 0
    for m in members:
        name = m.name.encode("utf-8")
        if max(m.size, len(m.compressed), offset) >= _ZIP32_MAX:
            raise UsageError(f"{m.name}: the wheel would need ZIP64 (a member or the archive over 4 GiB), which "
                             "t4patch does not write", hint="report this wheel to the t4patch maintainers")
        time, date = _dos_time(m.date_time)
        local = _LOCAL.pack(_LOCAL_SIG, m.extract_version, m.flags, m.method, time, date, m.crc,
                            len(m.compressed), m.size, len(name), 0)
        out.write(local)
        out.write(name)
        out.write(m.compressed)
        central.append(struct.pack("<IBBHHHHHIIIHHHHHII", _CENTRAL_SIG, m.create_version, m.create_system,
                                   m.extract_version, m.flags, m.method, time, date, m.crc, len(m.compressed),
                                   m.size, len(name), 0, 0, 0, 0, m.external_attr, offset) + name)
        offset += len(local) + len(name) + len(m.compressed)
        count += 1
    if count > _MAX_MEMBERS:
        raise UsageError(f"the wheel would have {count} members, more than a zip without ZIP64 holds (65,535)",
                         hint="report this wheel to the t4patch maintainers")
    directory = b"".join(central)
    if offset + len(directory) >= _ZIP32_MAX:
        raise UsageError("the wheel would be over 4 GiB, which needs ZIP64; t4patch does not write it",
                         hint="report this wheel to the t4patch maintainers")
    out.write(directory)
    out.write(struct.pack("<IHHHHIIH", _END_SIG, 0, 0, count, count, len(directory), offset, 0))
