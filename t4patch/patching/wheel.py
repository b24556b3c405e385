"""`t4patch wheel`: an engine's released wheel with its patch set applied, as a wheel for fleets and images.

Patching site-packages on every node at start-up does not scale to an image build or an autoscaled group; a
wheel built once and installed with the ordinary tools does. The wheel is made from the released one and
proves it on the way:

1. the input must be the released wheel (:func:`t4patch.fileio.wheeltools.open_release`: its file name, its
   dist-info and its METADATA say the spec's name and version, every member hashes to its RECORD entry, streamed,
   so a changed byte is caught unless RECORD was edited too), and every target file hashes to the patch set's
   pristine sha256 (so an edited RECORD cannot hide a changed target);
2. the patch set is proven against it as ``validate --wheel`` does (:func:`~t4patch.patching.wheelproof.
   prove_against_wheel`: exact apply, patched hash, exact revert) and applied in memory with the core's exact
   diff apply; each result must hash to the manifest's patched sha256;
3. the output keeps the real distribution name and release, with a PEP 440 local label
   (``0.33.0+t4patch.0.1.0.h1a2b3c4d``, :mod:`t4patch.patching.local_version`; an optional-diff wheel's label
   sorts below the plain one's): ``.dist-info`` renamed, METADATA's
   ``Version`` line and RECORD rewritten, a t4patch state record added to the dist-info so ``t4patch status``
   on an install from it reports the set as applied; every other member keeps its stored bytes, and the file
   name keeps the wheel's tags;
4. the output is reproducible: member order is the input's, unchanged members are copied as stored, changed
   and new ones are stored uncompressed with the input's newest timestamp
   (:mod:`t4patch.fileio.wheeltools`), and the state record's time is that timestamp too; ``SHA256SUMS``
   beside the wheel lists it.

Every check runs before anything is written (the output directory too: :mod:`t4patch.patching.output_dir`);
the wheel is written to a temporary file in the output directory (``0644`` under umask 022) and renamed into
place, so a refused input leaves the output directory as it was. A file of the output's name that is already
there is kept when it holds exactly the bytes this build makes and refused otherwise (t4patch replaces only
what it wrote); ``SHA256SUMS`` is rewritten only when every line of it is a t4patch line. Memory stays bounded:
members are hashed and copied in chunks, and only the patched files and metadata are held whole.
"""

from __future__ import annotations

import csv
import datetime as dt
import hashlib
import io
import re
import shlex
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from t4patch.errors import PatchSetError, T4PatchError, UnsupportedVersionError, UsageError
from t4patch.fileio.atomic import write_bytes_atomic
from t4patch.fileio.hashing import sha256_bytes, sha256_file
from t4patch.fileio.wheeltools import (
    SIGNATURES,
    Expected,
    Member,
    ReleasedWheel,
    copied,
    find_release,
    open_release,
    record_line,
    verify_written,
    wheel_fault,
    write_wheel_file,
)
from t4patch.patching.drafts import refuse_draft
from t4patch.patching.local_version import label_for
from t4patch.patching.manifest import PatchSet
from t4patch.patching.output_dir import check_entry, make_output_dir, output_dir
from t4patch.patching.plan import transform_bytes
from t4patch.patching.registry import find_patch_set, nearest_version, supported_versions
from t4patch.patching.release_spec import exact_release
from t4patch.patching.state import RECORD_NAME, record_document
from t4patch.patching.unified_diff import DiffMismatch
from t4patch.patching.wheelproof import FileProof, prove_against_wheel

SUMS_NAME = "SHA256SUMS"
_VERSION_LINE = re.compile(rb"^Version: *(?P<version>[^\r\n]*)(?P<eol>\r?\n)", re.MULTILINE)
_SUMS_LINE = re.compile(r"^(?P<digest>[0-9a-f]{64})  (?P<name>[^/\x00]+)$")
_AFTER = "; nothing was written"


@dataclass(frozen=True)
class PatchedWheel:
    """What ``t4patch wheel`` made, and from what."""

    spec: str  # the patch set applied (distribution==release)
    options: tuple[str, ...]  # optional diffs turned on
    source: Path
    source_sha256: str
    label: str  # "t4patch.0.1.0.h1a2b3c4d"
    version: str  # "0.33.0+t4patch.0.1.0.h1a2b3c4d"
    path: Path
    sha256: str
    size: int
    sums: Path
    files: tuple[FileProof, ...]
    members: int
    kept: bool = False  # the output was already there, byte for byte (nothing rewritten but SHA256SUMS)

    def to_json(self) -> dict[str, object]:
        return {
            "patch_set": self.spec,
            "options": list(self.options),
            "input": {"path": str(self.source), "sha256": self.source_sha256},
            "label": self.label,
            "version": self.version,
            "wheel": {"path": str(self.path), "name": self.path.name, "sha256": self.sha256, "size": self.size,
                      "members": self.members, "already_there": self.kept},
            "sha256sums": str(self.sums),
            "files": [{"path": f.path, "pristine_sha256": f.pristine_sha256, "patched_sha256": f.patched_sha256}
                      for f in self.files],
        }


WHEEL_EXAMPLE = "t4patch wheel {name}==<version>"


def _release_set(name: str, version: str) -> PatchSet:
    """The shipped set for the release; a release without one is said as a build request, never as an install
    (a wheel build has no environment)."""
    versions = supported_versions(name)
    if versions and not any(Version(v) == Version(version) for v in versions):
        nearest = nearest_version(versions, version)
        raise UnsupportedVersionError(
            f"t4patch wheel {name}=={version}: t4patch has patch sets for {name} {', '.join(versions)} only "
            f"(nearest: {nearest}); expected a release with a shipped set",
            hint=f"t4patch wheel {name}=={nearest}, or make a draft set for {version} to review: t4patch port "
            f"{name}=={version} --from {name}=={nearest} (docs/maintaining.md)",
        )
    return find_patch_set(name, version)


def build_patched_wheel(spec: str, *, out_dir: Path, from_wheel: Path | None = None,
                        options: tuple[str, ...] = ()) -> PatchedWheel:
    """Make the patched wheel of ``spec`` (``ENGINE==VERSION``) in ``out_dir``; see the module docstring."""
    name, version = exact_release(spec, option="wheel", example=WHEEL_EXAMPLE)
    patch_set = _release_set(name, version)
    refuse_draft(patch_set)
    if options:
        patch_set = patch_set.with_options(options)
    retry = f"t4patch wheel {patch_set.spec}{''.join(' --with ' + o for o in options)} -o DIR"
    out = output_dir(out_dir, option="-o", retry=retry)
    check_entry(out / SUMS_NAME, option="-o", retry=retry)
    _read_sums(out, retry)  # refuse a SHA256SUMS that is not t4patch's before anything is made
    if from_wheel is not None and not from_wheel.is_file():
        raise UsageError(f"--from-wheel {from_wheel}: expected a wheel file, found "
                         f"{'a directory' if from_wheel.is_dir() else 'nothing'}",
                         hint=f"pip download --no-deps --only-binary=:all: {patch_set.spec}")
    source = find_release(name, version, from_wheel, role="--from-wheel")
    role = "--from-wheel" if from_wheel is not None else "the downloaded wheel"
    with open_release(source, Expected(name, Version(version).public, role=role, after=_AFTER)) as wheel:
        return _build(patch_set, wheel, out, retry)


def _read_sums(out: Path, retry: str) -> dict[str, str]:
    """``SHA256SUMS`` in ``out`` as name -> digest; a file there that is not t4patch's is refused, not rewritten."""
    path = out / SUMS_NAME
    if not path.is_file():
        return {}
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"-o {out}: expected {SUMS_NAME} there to be t4patch's list of wheels, found a file that "
                         f"cannot be read ({exc}); nothing was written", hint=retry) from None
    lines: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        match = _SUMS_LINE.match(line)
        if match is None:
            raise UsageError(f"-o {out}: expected {SUMS_NAME} there to be t4patch's (lines of sha256, two spaces, a "
                             f"file name), found line {number} {line[:60]!r}; it is not t4patch's, so it is not "
                             "rewritten and nothing was written",
                             hint=f"move {shlex.quote(str(path))} away, or {retry}")
        lines[match["name"]] = match["digest"]
    return lines


def _update_sums(out_dir: Path, name: str, digest: str, retry: str) -> Path:
    """SHA256SUMS in ``out_dir``: this wheel's line added or replaced, other wheels' lines kept (a line whose
    file is gone is dropped: ``sha256sum --check`` would fail on it), sorted."""
    lines = {n: d for n, d in _read_sums(out_dir, retry).items() if n != name and (out_dir / n).is_file()}
    lines[name] = digest
    path = out_dir / SUMS_NAME
    write_bytes_atomic(path, "".join(f"{lines[n]}  {n}\n" for n in sorted(lines)).encode())
    return path


def _refuse(wheel: ReleasedWheel, problem: str) -> UsageError:
    return wheel_fault(wheel.path, wheel.expected, problem)


def _set_version(metadata: bytes, old: str, new: str, wheel: ReleasedWheel) -> bytes:
    """METADATA with its ``Version`` header (in the header block, before the first blank line) set to ``new``."""
    head_end = metadata.find(b"\n\n")
    head = metadata if head_end < 0 else metadata[:head_end + 1]
    match = _VERSION_LINE.search(head)
    if match is None or Version(match["version"].decode("utf-8", "replace").strip()) != Version(old):
        raise _refuse(wheel, f"METADATA without a 'Version: {old}' header")
    return metadata[:match.start("version")] + new.encode() + metadata[match.end("version"):]


def _record_line(path: str, data: bytes) -> str:
    return record_line(path, hashlib.sha256(data).digest(), len(data))


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


def _build(patch_set: PatchSet, wheel: ReleasedWheel, out_dir: Path, retry: str) -> PatchedWheel:
    spec = patch_set.spec
    old_dir = wheel.dist_info
    signed = next((n for n in wheel.entries if n.startswith(f"{old_dir}/") and n.rpartition("/")[2] in SIGNATURES),
                  None)
    if signed is not None:
        raise _refuse(wheel, f"a signed RECORD ({signed}), which a patched wheel cannot keep valid")
    if f"{old_dir}/{RECORD_NAME}" in wheel.entries:
        raise _refuse(wheel, f"a t4patch state record already in it ({old_dir}/{RECORD_NAME})")
    proofs = tuple(prove_against_wheel(patch_set, wheel))
    changed: dict[str, bytes] = {}
    for target in patch_set.targets:
        try:
            data = transform_bytes(patch_set, target.path, wheel.read(target.path), "apply")
        except DiffMismatch as exc:
            raise PatchSetError(f"{spec}: {exc}") from None
        if sha256_bytes(data) != target.patched_sha256:
            raise PatchSetError(f"{spec}: {target.path} patches to {sha256_bytes(data)}, the manifest pins "
                                f"{target.patched_sha256}")
        changed[target.path] = data
    metadata_name = f"{old_dir}/METADATA"
    stamp = dt.datetime(*wheel.stamp, tzinfo=dt.timezone.utc).isoformat(timespec="seconds")
    record = record_document(patch_set, applied_at=stamp)
    label = label_for(patch_set, record)
    new_version = f"{patch_set.version}+{label}"
    release_in_dir = old_dir[: -len(".dist-info")].rpartition("-")[2]
    new_dir = f"{old_dir[: -len('.dist-info') - len(release_in_dir)]}{new_version}.dist-info"
    changed[metadata_name] = _set_version(wheel.read(metadata_name), patch_set.version, new_version, wheel)
    state_name = f"{new_dir}/{RECORD_NAME}"
    new_record = _new_record(wheel.record_text, old_dir, new_dir, changed, {state_name: record})
    out_name = _output_name(wheel.path, patch_set.version, new_version)
    final = out_dir / out_name
    before = check_entry(final, option="-o", retry=retry)

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
                yield Member.new(renamed or info.filename, changed[info.filename], like=info, date_time=wheel.stamp)
            else:
                yield copied(wheel.raw, info, renamed)

    kept = False
    try:
        make_output_dir(out_dir)
        if before is None:
            write_wheel_file(final, members(), lambda p: verify_written(p, names, fresh))
        else:  # a file of this name is there: keep it if it is this build's bytes, never replace someone's file
            with tempfile.TemporaryDirectory(prefix=".t4patch-wheel-", dir=out_dir) as scratch:
                fresh_path = Path(scratch) / out_name
                write_wheel_file(fresh_path, members(), lambda p: verify_written(p, names, fresh))
                found, made = sha256_file(final), sha256_file(fresh_path)
                if found != made:
                    raise UsageError(
                        f"-o {out_dir}: expected {out_name} there to be absent or this build's bytes (sha256 "
                        f"{made}), found a file with sha256 {found}, which t4patch did not make from this input; "
                        "it is kept and nothing was written",
                        hint=f"move {shlex.quote(str(final))} away, or {retry}",
                    )
                kept = True
    except OSError as exc:  # ENOSPC, EIO, a directory made read-only meanwhile: one line, nothing left behind
        raise T4PatchError(f"-o {out_dir}: writing {out_name} failed ({exc.strerror or exc}); the directory is as "
                           "it was", hint=f"free space or fix permissions there, then: {retry}") from None
    digest = sha256_file(final)
    sums = _update_sums(out_dir, out_name, digest, retry)
    return PatchedWheel(spec, patch_set.options_on, wheel.path, sha256_file(wheel.path), label, new_version, final,
                        digest, final.stat().st_size, sums, proofs, len(wheel.infos) + 1, kept)


def _output_names(infos: tuple[zipfile.ZipInfo, ...], old_dir: str, new_dir: str, state_name: str) -> list[str]:
    """The output's member names in order: the input's, dist-info renamed, the state record before RECORD."""
    names = []
    for info in infos:
        name = new_dir + info.filename[len(old_dir):] if info.filename.startswith(old_dir + "/") else info.filename
        if info.filename == f"{old_dir}/RECORD":
            names.append(state_name)
        names.append(name)
    return names
