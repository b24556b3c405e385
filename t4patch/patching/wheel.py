"""`t4patch wheel`: an engine's released wheel with its patch set applied, as a wheel for fleets and images.

Patching site-packages on every node at start-up does not scale to an image build or an autoscaled group; a
wheel built once and installed with the ordinary tools does. The wheel is made from the released one and
proves it on the way:

1. the input must be the released wheel: its file name says the spec's name and version, every member hashes
   to its RECORD entry (so a changed byte is caught unless RECORD was edited too), and every target file
   hashes to the patch set's pristine sha256 (so an edited RECORD cannot hide a changed target);
2. the patch set is proven against it as ``validate --wheel`` does (:func:`~t4patch.patching.wheelproof.
   prove_against_wheel`: exact apply, patched hash, exact revert) and applied in memory with the core's exact
   diff apply; each result must hash to the manifest's patched sha256;
3. the output keeps the real distribution name and release, with a PEP 440 local label
   (``0.33.0+t4patch.N``, :mod:`t4patch.patching.local_version`): ``.dist-info`` renamed, METADATA's
   ``Version`` line and RECORD rewritten, a t4patch state record added to the dist-info so ``t4patch status``
   on an install from it reports the set as applied; every other member keeps its stored bytes, and the file
   name keeps the wheel's tags;
4. the output is reproducible: member order is the input's, unchanged members are copied as stored, changed
   and new ones are stored uncompressed with the input's newest timestamp
   (:mod:`t4patch.patching.wheelfile`), and the state record's time is that timestamp too; ``SHA256SUMS``
   beside the wheel lists it.

Every check runs before anything is written; the wheel is written to a temporary file in the output directory
and renamed into place, so a refused input leaves the output directory as it was.
"""

from __future__ import annotations

import base64
import csv
import datetime as dt
import hashlib
import io
import os
import re
import subprocess
import sys
import tempfile
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

from t4patch.environment.target import parse_record
from t4patch.errors import PatchSetError, T4PatchError, UsageError
from t4patch.fileio.atomic import write_bytes_atomic
from t4patch.fileio.hashing import sha256_bytes, sha256_file
from t4patch.patching.local_version import label_for
from t4patch.patching.manifest import PatchSet
from t4patch.patching.plan import transform_bytes
from t4patch.patching.registry import find_patch_set
from t4patch.patching.selection import parse_spec
from t4patch.patching.state import RECORD_NAME, record_document
from t4patch.patching.unified_diff import DiffMismatch
from t4patch.patching.wheelfile import Member, copied, write_archive
from t4patch.patching.wheelproof import FileProof, prove_against_wheel

SUMS_NAME = "SHA256SUMS"
_SIGNATURES = ("RECORD.jws", "RECORD.p7s")
_VERSION_LINE = re.compile(rb"^Version: *(?P<version>[^\r\n]*)(?P<eol>\r?\n)", re.MULTILINE)


@dataclass(frozen=True)
class PatchedWheel:
    """What ``t4patch wheel`` made, and from what."""

    spec: str  # the patch set applied (distribution==release)
    options: tuple[str, ...]  # optional diffs turned on
    source: Path
    source_sha256: str
    label: str  # "t4patch.N"
    version: str  # "0.33.0+t4patch.N"
    path: Path
    sha256: str
    size: int
    sums: Path
    files: tuple[FileProof, ...]
    members: int

    def to_json(self) -> dict[str, object]:
        return {
            "patch_set": self.spec,
            "options": list(self.options),
            "input": {"path": str(self.source), "sha256": self.source_sha256},
            "label": self.label,
            "version": self.version,
            "wheel": {"path": str(self.path), "name": self.path.name, "sha256": self.sha256, "size": self.size,
                      "members": self.members},
            "sha256sums": str(self.sums),
            "files": [{"path": f.path, "pristine_sha256": f.pristine_sha256, "patched_sha256": f.patched_sha256}
                      for f in self.files],
        }


def exact_release(spec: str) -> tuple[str, str]:
    """``ENGINE==VERSION`` -> (canonical name, version); a wheel is made for exactly one release."""
    req = parse_spec(spec)
    pins = list(req.specifier)
    if len(pins) != 1 or pins[0].operator not in ("==", "===") or "*" in pins[0].version:
        raise UsageError(f"{spec!r}: expected ENGINE==VERSION (one exact release), found "
                         f"{'no version' if not pins else str(req.specifier)}",
                         hint=f"t4patch wheel {canonicalize_name(req.name)}==<version>  (t4patch list shows them)")
    version = pins[0].version
    if Version(version).local is not None:
        raise UsageError(f"{spec!r}: expected a released version, found the local version {version}",
                         hint=f"t4patch wheel {canonicalize_name(req.name)}=={Version(version).public}")
    return canonicalize_name(req.name), version


def download_release(name: str, version: str, dest: Path) -> Path:
    """The released wheel from the package index, via this interpreter's pip (``pip download --no-deps``)."""
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
            "-q", "-d", str(dest), f"{name}=={version}"]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or len(wheels) != 1:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]
        raise T4PatchError(
            f"pip download of {name}=={version} failed (exit {proc.returncode}: {last}); nothing was written",
            hint=f"download it yourself (pip download --no-deps --only-binary=:all: -d DIR {name}=={version}, "
                 "for the Python the image runs) and pass it with --from-wheel DIR/<file>.whl",
        )
    return wheels[0]


def _refuse(source: Path, spec: str, problem: str) -> UsageError:
    return UsageError(
        f"{source.name}: expected the released {spec} wheel, found {problem}; nothing was written",
        hint=f"use the wheel from the package index: pip download --no-deps --only-binary=:all: {spec}",
    )


def _read(zf: zipfile.ZipFile, info: zipfile.ZipInfo, source: Path, spec: str) -> bytes:
    try:
        return zf.read(info)
    except (OSError, zipfile.BadZipFile, zlib.error, NotImplementedError) as exc:
        raise _refuse(source, spec, f"a damaged member {info.filename} ({exc})") from None


@dataclass(frozen=True)
class _Input:
    """The released wheel, checked: its members, dist-info and RECORD."""

    infos: tuple[zipfile.ZipInfo, ...]
    dist_info: str  # "vllm-0.33.0.dist-info"
    record_text: str
    stamp: tuple[int, int, int, int, int, int]  # the newest member time


def _check_input(zf: zipfile.ZipFile, source: Path, patch_set: PatchSet) -> _Input:
    spec = patch_set.spec
    try:
        name, version, _build, _tags = parse_wheel_filename(source.name)
    except InvalidWheelFilename as exc:
        raise _refuse(source, spec, f"a file name that is not a wheel's ({exc})") from None
    if canonicalize_name(name) != patch_set.distribution or version != Version(patch_set.version):
        raise _refuse(source, spec, f"a wheel of {name} {version}")
    infos = tuple(zf.infolist())
    records = [i for i in infos if i.filename.count("/") == 1 and i.filename.endswith(".dist-info/RECORD")]
    if len(records) != 1:
        raise _refuse(source, spec, f"{len(records)} top-level .dist-info/RECORD files (a wheel has one)")
    dist_info = records[0].filename.split("/")[0]
    if canonicalize_name(dist_info[: -len(".dist-info")].rpartition("-")[0]) != patch_set.distribution:
        raise _refuse(source, spec, f"the metadata directory {dist_info}/")
    for info in infos:
        if info.flag_bits & 0x1:
            raise _refuse(source, spec, f"an encrypted member {info.filename}")
        if info.filename.startswith(f"{dist_info}/") and info.filename.rpartition("/")[2] in _SIGNATURES:
            raise _refuse(source, spec, f"a signed RECORD ({info.filename}), which a patched wheel cannot keep valid")
    try:
        record_text = _read(zf, records[0], source, spec).decode("utf-8")
        record = parse_record(record_text)
        sizes = {row[0]: row[2] for row in csv.reader(io.StringIO(record_text)) if len(row) > 2}
    except (ValueError, csv.Error) as exc:
        raise _refuse(source, spec, f"a damaged RECORD ({type(exc).__name__}: {exc})") from None
    present = set()
    for info in infos:
        if info.is_dir() or info.filename == records[0].filename:
            continue
        present.add(info.filename)
        if info.filename not in record:
            raise _refuse(source, spec, f"{info.filename}, which its RECORD does not list")
        found = sha256_bytes(_read(zf, info, source, spec))
        if found != record[info.filename] or sizes.get(info.filename) != str(info.file_size):
            raise _refuse(source, spec, f"{info.filename} hashing to {found}, not to its RECORD sha256 "
                                        f"{record[info.filename]}")
    missing = sorted(set(record) - present - {records[0].filename})
    if missing:
        raise _refuse(source, spec, f"a RECORD listing {missing[0]}, which the archive does not hold")
    for target in patch_set.targets:
        if target.path not in record:
            raise PatchSetError(f"{spec}: {target.path} is not in {source.name}'s RECORD",
                                hint="the patch set is broken; check it with: t4patch validate")
        if record[target.path] != target.pristine_sha256:
            raise _refuse(source, spec, f"{target.path} with sha256 {record[target.path]} (the patch set pins the "
                                        f"released {target.pristine_sha256})")
    return _Input(infos, dist_info, record_text, max(i.date_time for i in infos))


def _set_version(metadata: bytes, old: str, new: str, source: Path, spec: str) -> bytes:
    """METADATA with its ``Version`` header (in the header block, before the first blank line) set to ``new``."""
    head_end = metadata.find(b"\n\n")
    head = metadata if head_end < 0 else metadata[:head_end + 1]
    match = _VERSION_LINE.search(head)
    if match is None or Version(match["version"].decode("utf-8", "replace").strip()) != Version(old):
        raise _refuse(source, spec, f"METADATA without a 'Version: {old}' header")
    return metadata[:match.start("version")] + new.encode() + metadata[match.end("version"):]


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    line = io.StringIO()
    csv.writer(line, lineterminator="").writerow([path, f"sha256={digest}", str(len(data))])
    return line.getvalue()


def _new_record(text: str, old_dir: str, new_dir: str, changed: dict[str, bytes], added: dict[str, bytes]) -> bytes:
    """RECORD with dist-info paths renamed, changed files re-hashed, ``added`` listed before RECORD's own line;
    every other line kept as it was written."""
    eol = "\r\n" if "\r\n" in text else "\n"
    out: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        (path, *_rest), = csv.reader([line])
        new_path = new_dir + path[len(old_dir):] if path.startswith(old_dir + "/") else path
        if path == f"{old_dir}/RECORD":
            out.extend(_record_line(a, data) for a, data in added.items())
            out.append(f"{new_dir}/RECORD,,")
        elif path in changed:
            out.append(_record_line(new_path, changed[path]))
        elif new_path != path:
            row = next(csv.reader([line]))
            buffer = io.StringIO()
            csv.writer(buffer, lineterminator="").writerow([new_path, *row[1:]])
            out.append(buffer.getvalue())
        else:
            out.append(line)
    return (eol.join(out) + eol).encode("utf-8")


def _output_name(source: Path, version: str, new_version: str) -> str:
    """The input's file name with the new version: name, build tag and compatibility tags kept as written."""
    parts = source.name[: -len(".whl")].split("-")
    if Version(parts[1]) != Version(version):
        raise UsageError(f"{source.name}: cannot find the version {version} in the file name")
    return "-".join([parts[0], new_version, *parts[2:]]) + ".whl"


def _update_sums(out_dir: Path, name: str, digest: str) -> Path:
    """SHA256SUMS in ``out_dir``: this wheel's line added or replaced, other wheels' lines kept, sorted."""
    path = out_dir / SUMS_NAME
    lines: dict[str, str] = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            found, _, other = line.partition("  ")
            if other and other != name and (out_dir / other).is_file():
                lines[other] = found
    lines[name] = digest
    write_bytes_atomic(path, "".join(f"{lines[n]}  {n}\n" for n in sorted(lines)).encode())
    return path


def build_patched_wheel(spec: str, *, out_dir: Path, from_wheel: Path | None = None,
                        options: tuple[str, ...] = ()) -> PatchedWheel:
    """Make the patched wheel of ``spec`` (``ENGINE==VERSION``) in ``out_dir``; see the module docstring."""
    name, version = exact_release(spec)
    patch_set = find_patch_set(name, version)
    if patch_set.draft:
        raise PatchSetError(f"{patch_set.spec} in {patch_set.directory} is a draft written by `t4patch port`: "
                            "expected a reviewed patch set; nothing was written",
                            hint="review it (docs/maintaining.md), delete `draft = true`, then run t4patch validate")
    if options:
        patch_set = patch_set.with_options(options)
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"-o {out_dir}: expected a directory, found a file", hint="t4patch wheel SPEC -o DIR")
    with tempfile.TemporaryDirectory(prefix="t4patch-wheel-") as scratch:
        if from_wheel is None:
            source = download_release(name, version, Path(scratch))
        else:
            source = from_wheel
            if not source.is_file():
                raise UsageError(f"--from-wheel {source}: expected a wheel file, found "
                                 f"{'a directory' if source.is_dir() else 'nothing'}",
                                 hint=f"pip download --no-deps --only-binary=:all: {patch_set.spec}")
        return _build(patch_set, source, out_dir, from_wheel is not None)


def _build(patch_set: PatchSet, source: Path, out_dir: Path, keep_source: bool) -> PatchedWheel:
    spec = patch_set.spec
    try:
        zf = zipfile.ZipFile(source)
    except (OSError, zipfile.BadZipFile) as exc:
        raise _refuse(source, spec, f"a file that is not a zip archive ({exc})") from None
    with zf, source.open("rb") as raw:
        wheel = _check_input(zf, source, patch_set)
        proofs = tuple(prove_against_wheel(patch_set, source))
        by_name = {i.filename: i for i in wheel.infos}
        changed: dict[str, bytes] = {}
        for target in patch_set.targets:
            try:
                data = transform_bytes(patch_set, target.path, _read(zf, by_name[target.path], source, spec), "apply")
            except DiffMismatch as exc:
                raise PatchSetError(f"{spec}: {exc}") from None
            if sha256_bytes(data) != target.patched_sha256:
                raise PatchSetError(f"{spec}: {target.path} patches to {sha256_bytes(data)}, the manifest pins "
                                    f"{target.patched_sha256}")
            changed[target.path] = data
        old_dir = wheel.dist_info
        metadata_name = f"{old_dir}/METADATA"
        if metadata_name not in by_name:
            raise _refuse(source, spec, f"no {metadata_name}")
        stamp = dt.datetime(*wheel.stamp, tzinfo=dt.timezone.utc).isoformat(timespec="seconds")
        record = record_document(patch_set, applied_at=stamp)
        label = label_for(patch_set, record)
        new_version = f"{patch_set.version}+{label}"
        release_in_dir = old_dir[: -len(".dist-info")].rpartition("-")[2]
        new_dir = f"{old_dir[: -len('.dist-info') - len(release_in_dir)]}{new_version}.dist-info"
        changed[metadata_name] = _set_version(_read(zf, by_name[metadata_name], source, spec), patch_set.version,
                                              new_version, source, spec)
        state_name = f"{new_dir}/{RECORD_NAME}"
        if f"{old_dir}/{RECORD_NAME}" in by_name:
            raise _refuse(source, spec, f"a t4patch state record already in it ({old_dir}/{RECORD_NAME})")
        new_record = _new_record(wheel.record_text, old_dir, new_dir, changed, {state_name: record})
        out_name = _output_name(source, patch_set.version, new_version)

        names = _output_names(wheel.infos, old_dir, new_dir, state_name)
        fresh: dict[str, bytes] = {}

        def members() -> Iterator[Member]:
            for info in wheel.infos:
                renamed = new_dir + info.filename[len(old_dir):] if info.filename.startswith(old_dir + "/") else None
                if info.filename == f"{old_dir}/RECORD":
                    fresh[state_name], fresh[f"{new_dir}/RECORD"] = record, new_record
                    yield Member.new(state_name, record, like=None, date_time=wheel.stamp)
                    yield Member.new(f"{new_dir}/RECORD", new_record, like=info, date_time=wheel.stamp)
                elif info.filename in changed:
                    fresh[renamed or info.filename] = changed[info.filename]
                    yield Member.new(renamed or info.filename, changed[info.filename], like=info,
                                     date_time=wheel.stamp)
                else:
                    yield copied(raw, info, renamed)

        out_dir.mkdir(parents=True, exist_ok=True)
        final = out_dir / out_name
        fd, temp = tempfile.mkstemp(prefix=f".{out_name}.", suffix=".tmp", dir=out_dir)
        try:
            with os.fdopen(fd, "wb") as out:
                write_archive(out, members())
                out.flush()
                os.fsync(out.fileno())
            _verify_output(Path(temp), names, fresh)
            os.replace(temp, final)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise
    digest = sha256_file(final)
    sums = _update_sums(out_dir, out_name, digest)
    # A downloaded input lives in a scratch directory that is gone when this returns: report its name only.
    return PatchedWheel(spec, patch_set.options_on, source if keep_source else Path(source.name), sha256_file(source),
                        label, new_version, final, digest, final.stat().st_size, sums, proofs, len(wheel.infos) + 1)


def _output_names(infos: tuple[zipfile.ZipInfo, ...], old_dir: str, new_dir: str, state_name: str) -> list[str]:
    """The output's member names in order: the input's, dist-info renamed, the state record before RECORD."""
    names = []
    for info in infos:
        name = new_dir + info.filename[len(old_dir):] if info.filename.startswith(old_dir + "/") else info.filename
        if info.filename == f"{old_dir}/RECORD":
            names.append(state_name)
        names.append(name)
    return names


def _verify_output(path: Path, names: list[str], fresh: dict[str, bytes]) -> None:
    """Read the written wheel back (an internal check): the members in the planned order, and every member
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
