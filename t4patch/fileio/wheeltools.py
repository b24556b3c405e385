"""The one wheel module: find a released wheel, read it, check it against its own RECORD, write a wheel.

Every command that reads a wheel (``wheel``, ``port``, ``validate --wheel``) and the test suite go through
here, so one fault of a wheel file gets one message and one exit code everywhere (auditwheel keeps the same
jobs in one ``wheeltools.py``). A wheel read back from disk - the user's ``--wheel``, a file in the wheel
cache, pip's download - is untrusted input: :func:`open_release` checks, before anything is returned,

- the file name parses as a wheel's and names the expected distribution and release;
- the file is a zip archive with exactly one top-level ``<name>-<version>.dist-info/RECORD``, whose name and
  METADATA's ``Name``/``Version`` say the same release as the file name (a release renamed to another's file
  name is refused);
- RECORD is well formed (three fields a row, a sha256 for every member but RECORD itself, sizes that are
  numbers, no path twice), every member is listed and every listed file is present; no member path is
  absolute or climbs out with ``..``; nothing is encrypted;
- every member's bytes hash to its RECORD sha256 and size. Hashing is streamed in :data:`CHUNK` pieces
  (``zipfile`` decompresses incrementally and checks the CRC at the end), so memory does not grow with a
  member's size: a vLLM wheel's 400 MB shared library costs one chunk, not 1.7x its size.

The faults and their exit codes (README "Wheels that are not the release", docs/fleet.md):

================================================  =========================================
fault                                             error (exit code)
================================================  =========================================
no file, a directory, not a zip archive           UsageError (2)
RECORD missing, not UTF-8, malformed              UsageError (2)
a member's bytes differ from its RECORD entry     UsageError (2)
RECORD lists a file the archive lacks             UsageError (2)
the archive holds a file RECORD does not list     UsageError (2)
wrong name/version (file name, dist-info, METADATA)  UsageError (2)
a good wheel that the patch set does not fit      PatchSetError (7) (the data is wrong)
================================================  =========================================

Writing (for ``t4patch wheel``) keeps every byte it does not change and gives the same output for the same
input: an unchanged member's compressed bytes are copied as they lie in the input (same method, CRC, time and
permissions), streamed, never held whole; changed or new members are stored uncompressed (no zlib involved)
with a timestamp chosen by the caller; headers have no extra fields and no data descriptors, in the order
given. Archives that would need ZIP64 (a member or the archive over 4 GiB, more than 65,535 members) are
refused rather than half-supported. The file is created ``0666`` minus the umask (``0644`` under umask 022,
as pip and ``cp`` leave files), never through a symlink, fsynced and renamed into place.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import csv
import hashlib
import io
import os
import secrets
import struct
import subprocess
import sys
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from t4patch.errors import T4PatchError, UsageError
from t4patch.fileio.atomic import fsync_dir
from t4patch.fileio.cache import cache_dir

CHUNK = 1 << 20  # bytes read at a time when hashing or copying a member
SIGNATURES = ("RECORD.jws", "RECORD.p7s")  # RECORD's own signature files, the only members RECORD need not hash

# ------------------------------------------------------------------------------------------- RECORD


def parse_record(text: str) -> dict[str, str | None]:
    """An installed RECORD (CSV: path, sha256=<urlsafe-b64>, size) as path -> hex sha256 or None.

    Lenient, as installers write it (no hash for RECORD, ``.pyc`` files, ``../`` script paths); a wheel's
    own RECORD is read with :func:`parse_wheel_record`, which is strict."""
    result: dict[str, str | None] = {}
    for row in csv.reader(io.StringIO(text)):
        if not row:
            continue
        result[row[0]] = _record_digest_to_hex(row[1] if len(row) > 1 else "")
    return result


def _record_digest_to_hex(digest: str) -> str | None:
    if not digest:
        return None
    algo, _, value = digest.partition("=")
    if algo != "sha256":
        return None
    padded = value + "=" * (-len(value) % 4)
    return base64.urlsafe_b64decode(padded).hex()


def record_hash(data_digest: bytes) -> str:
    """A RECORD hash field (``sha256=`` + urlsafe base64 without padding) for a raw sha256 digest."""
    return "sha256=" + base64.urlsafe_b64encode(data_digest).rstrip(b"=").decode()


def record_line(path: str, digest: bytes, size: int) -> str:
    """One RECORD row, CSV-quoted as the writers of wheels quote it."""
    line = io.StringIO()
    csv.writer(line, lineterminator="").writerow([path, record_hash(digest), str(size)])
    return line.getvalue()


@dataclass(frozen=True)
class RecordEntry:
    path: str
    sha256: str | None  # hex; None only for RECORD itself and its signatures
    size: int | None


def parse_wheel_record(text: str, record_name: str) -> dict[str, RecordEntry]:
    """A wheel's RECORD, strictly: raises ValueError naming the first bad row."""
    entries: dict[str, RecordEntry] = {}
    for number, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        if not row:
            continue
        if len(row) != 3 or not row[0]:
            raise ValueError(f"row {number} has {len(row)} field(s), expected path,sha256=...,size")
        path, digest, size = row
        if path in entries:
            raise ValueError(f"row {number} lists {path} a second time")
        if not digest:  # allowed for RECORD and its signatures only; open_release refuses it for any member
            entries[path] = RecordEntry(path, None, int(size) if size.isdigit() else None)
            continue
        algo, _, value = digest.partition("=")
        if algo != "sha256":
            raise ValueError(f"row {number} ({path}) has no sha256 hash ({digest[:40]!r})")
        try:
            raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
        except (binascii.Error, ValueError):
            raw = b""
        if len(raw) != 32:
            raise ValueError(f"row {number} ({path}) has a sha256 that is not 32 bytes of base64")
        if not size.isdigit():
            raise ValueError(f"row {number} ({path}) has the size {size[:20]!r}, expected a number of bytes")
        entries[path] = RecordEntry(path, raw.hex(), int(size))
    if record_name not in entries:
        raise ValueError(f"it does not list {record_name} itself")
    return entries


# ------------------------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class Expected:
    """What a wheel must be, and how the command names it in a refusal."""

    name: str  # canonical distribution name
    version: str  # the release, e.g. "0.33.0"
    role: str = "--wheel"  # how the command line names the file ("--wheel", "--from-wheel", "NEW's wheel")
    after: str = ""  # appended to every refusal, e.g. "; nothing was written"

    @property
    def spec(self) -> str:
        return f"{self.name}=={self.version}"


def wheel_fault(path: Path, expected: Expected, problem: str) -> UsageError:
    """The one refusal of a wheel that is not the release: exit 2, one line, what was expected and found."""
    return UsageError(
        f"{expected.role} {path}: expected the released {expected.spec} wheel, found {problem}{expected.after}",
        hint=f"use the wheel from the package index: pip download --no-deps --only-binary=:all: -d DIR "
        f"{expected.spec} (a cached copy under {cache_dir('wheels')} that is damaged can be deleted: it is "
        "downloaded again)",
    )


def _safe_member_name(name: str) -> bool:
    path = PurePosixPath(name)
    return bool(name) and not name.startswith("/") and "\\" not in name and ".." not in path.parts \
        and not (len(name) > 1 and name[1] == ":")


def stream_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> Iterator[bytes]:
    """The member's uncompressed bytes in pieces of at most :data:`CHUNK` (zipfile checks the CRC at the end)."""
    with zf.open(info) as fh:
        while chunk := fh.read(CHUNK):
            yield chunk


_READ_ERRORS = (OSError, EOFError, zipfile.BadZipFile, zlib.error, NotImplementedError, RuntimeError)


@dataclass
class ReleasedWheel:
    """An open wheel whose every member was hashed against its RECORD; close it (or use ``with``)."""

    path: Path
    expected: Expected
    zf: zipfile.ZipFile
    raw: BinaryIO  # the same file, for copying members' stored bytes
    infos: tuple[zipfile.ZipInfo, ...]
    dist_info: str  # "vllm-0.33.0.dist-info"
    record_text: str
    entries: dict[str, RecordEntry]
    _by_name: dict[str, zipfile.ZipInfo] = field(default_factory=dict, repr=False)

    @property
    def record_name(self) -> str:
        return f"{self.dist_info}/RECORD"

    @property
    def record(self) -> dict[str, str | None]:
        return {p: e.sha256 for p, e in self.entries.items()}

    @property
    def stamp(self) -> tuple[int, int, int, int, int, int]:
        """The newest member time (a reproducible stand-in for "when")."""
        return max(i.date_time for i in self.infos)

    def info(self, name: str) -> zipfile.ZipInfo | None:
        return self._by_name.get(name)

    def has(self, name: str) -> bool:
        return name in self._by_name and name in self.entries

    def read(self, name: str) -> bytes:
        """A member's bytes, whole (for the few small files a patch set names), checked against RECORD again."""
        info, entry = self._by_name.get(name), self.entries.get(name)
        if info is None or entry is None:
            raise wheel_fault(self.path, self.expected, f"no member {name}")
        try:
            data = self.zf.read(info)
        except _READ_ERRORS as exc:
            raise wheel_fault(self.path, self.expected, f"a damaged member {name} ({exc})") from None
        found = hashlib.sha256(data).hexdigest()
        if entry.sha256 is not None and found != entry.sha256:
            raise wheel_fault(self.path, self.expected,
                              f"{name} hashing to {found}, not to its RECORD sha256 {entry.sha256}")
        return data

    def close(self) -> None:
        self.zf.close()
        self.raw.close()

    def __enter__(self) -> ReleasedWheel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wheel_release(path: Path) -> tuple[str, Version] | None:
    """(canonical name, version) the file name says, or None for a name that is not a wheel's."""
    try:
        name, version, _build, _tags = parse_wheel_filename(path.name)
    except (InvalidWheelFilename, InvalidVersion):
        return None
    return canonicalize_name(name), version


def _metadata_release(data: bytes) -> tuple[str | None, str | None]:
    head = data.split(b"\n\n", 1)[0].decode("utf-8", "replace")
    name = version = None
    for line in head.splitlines():
        key, _, value = line.partition(":")
        if key == "Name" and name is None:
            name = value.strip()
        elif key == "Version" and version is None:
            version = value.strip()
    return name, version


def open_release(path: Path, expected: Expected) -> ReleasedWheel:
    """Open ``path`` and prove it is the released ``expected`` wheel (see the module docstring), or refuse."""
    def fault(problem: str) -> UsageError:
        return wheel_fault(path, expected, problem)

    if not path.is_file():
        raise fault("a directory" if path.is_dir() else "nothing there")
    try:
        raw = path.open("rb")
    except OSError as exc:
        raise fault(f"a file that cannot be read ({exc.strerror or exc})") from None
    try:
        return _check(path, raw, expected, fault)
    except BaseException:
        raw.close()
        raise


def _check(path: Path, raw: BinaryIO, expected: Expected, fault: Callable[[str], UsageError]) -> ReleasedWheel:
    try:
        zf = zipfile.ZipFile(raw)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise fault(f"a file that is not a zip archive ({exc})") from None
    try:
        said = wheel_release(path)
        if said is None:
            raise fault(f"a file name that is not a wheel's ({path.name!r})")
        if said[0] != canonicalize_name(expected.name) or said[1] != Version(expected.version):
            raise fault(f"a wheel of {said[0]} {said[1]}")
        infos = tuple(zf.infolist())
        names = [i.filename for i in infos]
        if len(set(names)) != len(names):
            twice = next(n for n in names if names.count(n) > 1)
            raise fault(f"two members named {twice}")
        unsafe = next((n for n in names if not _safe_member_name(n)), None)
        if unsafe is not None:
            raise fault(f"a member with an unsafe path {unsafe!r}")
        records = [i for i in infos if i.filename.count("/") == 1 and i.filename.endswith(".dist-info/RECORD")]
        if len(records) != 1:
            raise fault("an archive with no .dist-info/RECORD" if not records else
                        f"{len(records)} top-level .dist-info/RECORD files (a wheel has one)")
        record_info = records[0]
        dist_info = record_info.filename.split("/")[0]
        stem = dist_info[: -len(".dist-info")]
        dir_name, _, dir_version = stem.rpartition("-")
        try:
            dir_ok = canonicalize_name(dir_name) == expected.name and Version(dir_version) == Version(expected.version)
        except InvalidVersion:
            dir_ok = False
        if not dir_ok:
            raise fault(f"the metadata directory {dist_info}/ in a file named {path.name}")
        encrypted = next((i.filename for i in infos if i.flag_bits & 0x1), None)
        if encrypted is not None:
            raise fault(f"an encrypted member {encrypted}")
        try:
            record_text = zf.read(record_info).decode("utf-8")
            entries = parse_wheel_record(record_text, record_info.filename)
        except (UnicodeDecodeError, ValueError, csv.Error) as exc:
            raise fault(f"a damaged {record_info.filename} ({type(exc).__name__}: {exc})") from None
        except _READ_ERRORS as exc:
            raise fault(f"a damaged member {record_info.filename} ({exc})") from None
        files = {i.filename: i for i in infos if not i.is_dir()}
        unlisted = next((n for n in files if n not in entries), None)
        if unlisted is not None:
            raise fault(f"{unlisted}, which its RECORD does not list")
        absent = next((p for p in entries if p not in files), None)
        if absent is not None:
            raise fault(f"a RECORD listing {absent}, which the archive does not hold")
        unhashed = {record_info.filename, *(f"{dist_info}/{sig}" for sig in SIGNATURES)}
        for name, info in files.items():
            entry = entries[name]
            if entry.sha256 is None:
                if name in unhashed:
                    continue
                raise fault(f"{name}, which its RECORD lists without a sha256")
            digest, size = hashlib.sha256(), 0
            try:
                for chunk in stream_member(zf, info):
                    digest.update(chunk)
                    size += len(chunk)
            except _READ_ERRORS as exc:
                raise fault(f"a damaged member {name} ({exc})") from None
            found = digest.hexdigest()
            if found != entry.sha256 or size != entry.size:
                raise fault(f"{name} hashing to {found} ({size} bytes), not to its RECORD sha256 {entry.sha256} "
                            f"({entry.size} bytes)")
        metadata_name = f"{dist_info}/METADATA"
        if metadata_name not in files:
            raise fault(f"no {metadata_name}")
        meta_name, meta_version = _metadata_release(zf.read(files[metadata_name]))
        try:
            meta_ok = (meta_name is not None and meta_version is not None
                       and canonicalize_name(meta_name) == expected.name
                       and Version(meta_version) == Version(expected.version))
        except InvalidVersion:
            meta_ok = False
        if not meta_ok:
            raise fault(f"METADATA saying Name {meta_name!r}, Version {meta_version!r} in a file named {path.name} "
                        "(another release renamed?)")
    except BaseException:
        zf.close()
        raise
    return ReleasedWheel(path, expected, zf, raw, infos, dist_info, record_text, entries,
                         {i.filename: i for i in infos if not i.is_dir()})


# ---------------------------------------------------------------------------------- finding a release


def cached_release(name: str, version: str, cache: Path) -> Path | None:
    """The wheel of ``name==version`` in ``cache`` (by what its file name says; first in name order), or None."""
    want = (canonicalize_name(name), Version(version))
    hits = sorted(w for w in cache.glob("*.whl") if w.is_file() and wheel_release(w) == want)
    return hits[0] if hits else None


def find_release(name: str, version: str, explicit: Path | None = None, *, role: str = "--wheel") -> Path:
    """The wheel file of ``name==version``: ``explicit``, the one in the wheel cache
    (:func:`t4patch.fileio.cache.cache_dir`, ``$T4PATCH_WHEEL_CACHE``), or one ``pip download --no-deps``
    puts there. Nothing is checked here: :func:`open_release` does that for every caller."""
    if explicit is not None:
        return explicit.expanduser()
    cache = cache_dir("wheels")
    found = cached_release(name, version, cache) if cache.is_dir() else None
    if found is not None:
        return found
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"the wheel cache {cache}: expected a writable directory, found {exc.strerror or exc}",
                         hint=f"point T4PATCH_WHEEL_CACHE at a writable directory, or pass {role} PATH") from None
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
            "-q", "-d", str(cache), f"{name}=={version}"]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    found = cached_release(name, version, cache)
    if proc.returncode != 0 or found is None:
        last = ((proc.stderr or proc.stdout).strip().splitlines() or ["no output"])[-1][:200]
        raise T4PatchError(
            f"pip download of {name}=={version} failed (exit {proc.returncode}: {last}); nothing was written",
            hint=f"download it yourself (pip download --no-deps --only-binary=:all: -d DIR {name}=={version}, for the "
                 f"Python that will run it) and pass it with {role} DIR/<file>.whl",
        )
    return found


# ------------------------------------------------------------------------------------------- writing

_LOCAL = struct.Struct("<IHHHHHIIIHH")  # local file header (APPNOTE 4.3.7)
_LOCAL_SIG = 0x04034B50
_CENTRAL_SIG = 0x02014B50
_END_SIG = 0x06054B50
_ZIP32_MAX = 0xFFFFFFFF
_MAX_MEMBERS = 0xFFFF
_DATA_DESCRIPTOR = 0x08
_UTF8 = 0x800
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class Member:
    """One member to write: new plain bytes (``data``), or the input's stored bytes at ``source``."""

    name: str
    method: int  # 0 stored, 8 deflated
    crc: int
    size: int  # uncompressed
    compressed_size: int
    date_time: tuple[int, int, int, int, int, int]
    external_attr: int
    create_version: int
    create_system: int
    extract_version: int
    flags: int
    data: bytes | None = None  # what is written after the header, when given in memory
    source: tuple[BinaryIO, int] | None = None  # (file, offset of the stored bytes), streamed when written

    @staticmethod
    def new(name: str, data: bytes, *, like: zipfile.ZipInfo | None, date_time: tuple[int, int, int, int, int, int],
            mode: int = 0o100644) -> Member:
        """A stored (uncompressed) member; attributes from ``like`` (the member it replaces) when given."""
        return Member(
            name=name, method=zipfile.ZIP_STORED, crc=zlib.crc32(data), size=len(data), compressed_size=len(data),
            date_time=date_time,
            external_attr=like.external_attr if like is not None else (mode << 16),
            create_version=like.create_version if like is not None else 20,
            create_system=like.create_system if like is not None else 3,
            extract_version=20, flags=_UTF8 if not name.isascii() else 0, data=data,
        )

    def chunks(self) -> Iterator[bytes]:
        if self.data is not None:
            yield self.data
            return
        assert self.source is not None
        archive, offset = self.source
        left = self.compressed_size
        archive.seek(offset)
        while left:
            chunk = archive.read(min(CHUNK, left))
            if not chunk:
                raise UsageError(f"{self.name}: the archive ends inside this member (a truncated wheel)",
                                 hint="download the wheel again")
            left -= len(chunk)
            yield chunk


def _stored_offset(archive: BinaryIO, info: zipfile.ZipInfo) -> int:
    archive.seek(info.header_offset)
    header = archive.read(_LOCAL.size)
    if len(header) != _LOCAL.size or _LOCAL.unpack(header)[0] != _LOCAL_SIG:
        raise UsageError(f"{info.filename}: expected a zip local header at offset {info.header_offset}, found other "
                         "bytes (a damaged wheel)", hint="download the wheel again")
    fields = _LOCAL.unpack(header)
    return info.header_offset + _LOCAL.size + fields[9] + fields[10]


def stored_bytes(archive: BinaryIO, info: zipfile.ZipInfo) -> bytes:
    """The member's compressed bytes exactly as they lie in ``archive`` (whole: for tests and small members)."""
    archive.seek(_stored_offset(archive, info))
    data = archive.read(info.compress_size)
    if len(data) != info.compress_size:
        raise UsageError(f"{info.filename}: the archive ends inside this member (a truncated wheel)",
                         hint="download the wheel again")
    return data


def copied(archive: BinaryIO, info: zipfile.ZipInfo, name: str | None = None) -> Member:
    """An unchanged member of the input, under ``name`` (default: its own); its stored bytes are streamed from
    ``archive`` when written, never held in memory."""
    new_name = name if name is not None else info.filename
    return Member(
        name=new_name, method=info.compress_type, crc=info.CRC, size=info.file_size,
        compressed_size=info.compress_size, date_time=info.date_time, external_attr=info.external_attr,
        create_version=info.create_version, create_system=info.create_system,
        extract_version=info.extract_version,
        flags=(info.flag_bits & ~_DATA_DESCRIPTOR & _UTF8) | (_UTF8 if not new_name.isascii() else 0),
        source=(archive, _stored_offset(archive, info)),
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
        if max(m.size, m.compressed_size, offset) >= _ZIP32_MAX:
            raise UsageError(f"{m.name}: the wheel would need ZIP64 (a member or the archive over 4 GiB), which "
                             "t4patch does not write", hint="report this wheel to the t4patch maintainers")
        time, date = _dos_time(m.date_time)
        local = _LOCAL.pack(_LOCAL_SIG, m.extract_version, m.flags, m.method, time, date, m.crc,
                            m.compressed_size, m.size, len(name), 0)
        out.write(local)
        out.write(name)
        for chunk in m.chunks():
            out.write(chunk)
        central.append(struct.pack("<IBBHHHHHIIIHHHHHII", _CENTRAL_SIG, m.create_version, m.create_system,
                                   m.extract_version, m.flags, m.method, time, date, m.crc, m.compressed_size,
                                   m.size, len(name), 0, 0, 0, 0, m.external_attr, offset) + name)
        offset += len(local) + len(name) + m.compressed_size
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


def write_wheel_file(final: Path, members: Iterable[Member], check: Callable[[Path], None] | None = None) -> None:
    """Write the archive to a new temp file beside ``final`` (``0666`` minus the umask, ``O_EXCL|O_NOFOLLOW``),
    fsync it, run ``check`` on it, and rename it over ``final``; on any failure the temp file is removed."""
    temp = final.with_name(f".{final.name}.{secrets.token_hex(8)}.t4patch-tmp")
    fd = os.open(temp, _CREATE_FLAGS, 0o666)
    try:
        with os.fdopen(fd, "wb") as out:
            write_archive(out, members)
            out.flush()
            os.fsync(out.fileno())
        if check is not None:
            check(temp)
        os.replace(temp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            temp.unlink()
        raise
    fsync_dir(final.parent)


def verify_written(path: Path, names: list[str], fresh: dict[str, bytes]) -> None:
    """Read a just-written wheel back (an internal check): the members in the planned order, and every member
    written anew holding exactly its bytes. Copied members are the input's stored bytes with their CRC, whose
    content was hashed against RECORD on the way in, so they are not decompressed a second time."""
    try:
        with zipfile.ZipFile(path) as zf:
            if zf.namelist() != names:
                raise T4PatchError("internal error: the written wheel's member list is not the planned one",
                                   hint="report this to the t4patch maintainers")
            for name, data in fresh.items():
                if zf.read(name) != data:
                    raise T4PatchError(f"internal error: the written wheel's {name} is not what was planned",
                                       hint="report this to the t4patch maintainers")
    except (OSError, zipfile.BadZipFile, zlib.error, KeyError) as exc:
        raise T4PatchError(f"internal error: the written wheel cannot be read back ({exc})",
                           hint="report this to the t4patch maintainers") from None
