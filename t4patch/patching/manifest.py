"""Patch sets: load ``patches/<distribution>/<version>/manifest.toml`` and its diffs, and validate them.

A patch set is data, and data shipped to users must be checked before it can touch a file: the schema
version, the names, that every diff parses, only modifies files (no create/delete/rename), stays inside the
distribution's own top-level packages (no absolute paths, no ``..``), and that every file a diff touches is
pinned by a pristine and a patched sha256. Whether the pristine hash equals the wheel's RECORD is checked
against the installed distribution when a plan is made (see :mod:`t4patch.patching.plan`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from t4patch.data.reader import DataKind, Int, ListOf, Str, Table, optional, read
from t4patch.errors import PatchSetError, T4PatchError
from t4patch.patching.unified_diff import FileDiff, parse_diff

SCHEMA_VERSION = 1
MANIFEST_NAME = "manifest.toml"
_DIFF_NAME = re.compile(r"^(?P<number>\d{4})-(?P<slug>[a-z0-9][a-z0-9-]*)\.diff$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Patch:
    """One numbered diff of a patch set and the reasons it exists."""

    number: int
    file: str
    title: str
    fixes: str
    gpus: str
    references: tuple[str, ...]
    diffs: tuple[FileDiff, ...]  # one per file the diff touches, in diff order

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(d.path for d in self.diffs)


@dataclass(frozen=True)
class Target:
    """A file the patch set changes, pinned before and after."""

    path: str
    pristine_sha256: str
    patched_sha256: str


@dataclass(frozen=True)
class Companion:
    """Another distribution the patched engine needs beside it (``[[requires]]``), at exactly one release."""

    distribution: str  # canonical name
    version: str
    why: str
    library: str | None = None  # a compiled library of the companion the patched code loads, relative to site-packages

    @property
    def spec(self) -> str:
        return f"{self.distribution}=={self.version}"


@dataclass(frozen=True)
class PatchSet:
    distribution: str  # canonical name
    version: str
    packages: tuple[str, ...]
    summary: str
    patches: tuple[Patch, ...]
    targets: tuple[Target, ...]
    directory: Path
    requires: tuple[Companion, ...] = ()

    @property
    def spec(self) -> str:
        return f"{self.distribution}=={self.version}"

    def diffs_for(self, path: str) -> list[FileDiff]:
        """Every hunk-set touching ``path``, in application order."""
        return [d for p in self.patches for d in p.diffs if d.path == path]


PATCH_SET = DataKind(
    label="patch set",
    error=PatchSetError,
    hint="fix the patch set, then check it with: t4patch validate",
)

# The whole manifest, stated once: the strict reader refuses any other key, a wrong type, a missing key.
MANIFEST_SCHEMA = Table(
    {
        "schema": Int(),
        "distribution": Str(),
        "version": Str(),
        "packages": ListOf(Str(), nonempty=True),
        "summary": Str(),
        "requires": optional(
            ListOf(
                Table(
                    {
                        "distribution": Str(),
                        "version": Str(),
                        "why": Str(),
                        "library": optional(Str()),
                    }
                )
            )
        ),
        "patch": ListOf(
            Table(
                {
                    "file": Str(),
                    "title": Str(),
                    "fixes": Str(),
                    "gpus": Str(),
                    "references": optional(ListOf(Str())),
                }
            ),
            nonempty=True,
        ),
        "target": ListOf(
            Table({"path": Str(), "pristine_sha256": Str(), "patched_sha256": Str()}),
            nonempty=True,
        ),
    }
)


def _fail(where: Path, problem: str) -> T4PatchError:
    return PATCH_SET.fail(where, problem)  # a PatchSetError (exit 7)


def check_relative_path(path: str, packages: tuple[str, ...], where: Path) -> str:
    """Refuse absolute paths, ``..``, backslashes and paths outside the distribution's packages."""
    pure = PurePosixPath(path)
    if not path or "\\" in path or pure.is_absolute() or path.startswith("~"):
        raise _fail(where, f"target {path!r} must be a relative POSIX path inside site-packages")
    if any(part in ("..", ".", "") for part in path.split("/")):
        raise _fail(where, f"target {path!r} must not contain '..', '.' or empty components")
    if pure.parts[0] not in packages:
        raise _fail(
            where,
            f"target {path!r} lies outside the distribution's packages {list(packages)}",
        )
    return path


def load_patch_set(directory: Path) -> PatchSet:
    """Load and validate the patch set in ``directory`` (…/<distribution>/<version>/)."""
    manifest_path = directory / MANIFEST_NAME
    if not manifest_path.is_file():
        raise _fail(directory, f"expected {MANIFEST_NAME}, found none")
    raw = read(manifest_path, MANIFEST_SCHEMA, PATCH_SET, version=SCHEMA_VERSION)  # schema == 1 from here on
    distribution = canonicalize_name(raw["distribution"].strip())
    version = raw["version"].strip()
    try:
        parsed_version = Version(version)
    except InvalidVersion:
        raise _fail(manifest_path, f"version {version!r} is not a PEP 440 version") from None
    if canonicalize_name(directory.parent.name) != distribution or directory.name != str(parsed_version):
        raise _fail(
            manifest_path,
            f"declares {distribution}=={version} but lives in {directory.parent.name}/{directory.name}/",
        )
    packages = tuple(p.strip() for p in raw["packages"])
    summary = raw["summary"].strip()

    patches = _load_patches(raw["patch"], directory, manifest_path, packages)
    targets = _load_targets(raw["target"], manifest_path, packages)

    touched = {path for p in patches for path in p.paths}
    declared = {t.path for t in targets}
    if touched - declared:
        raise _fail(manifest_path, f"diffs touch files with no [[target]] hashes: {sorted(touched - declared)}")
    if declared - touched:
        raise _fail(manifest_path, f"[[target]] files no diff touches: {sorted(declared - touched)}")

    expected_files = {MANIFEST_NAME, *(p.file for p in patches)}
    stray = sorted(f.name for f in directory.iterdir() if f.name not in expected_files)
    if stray:
        raise _fail(directory, f"files not listed in the manifest: {stray}")

    requires = _load_requires(raw.get("requires", []), manifest_path, distribution)
    return PatchSet(distribution, version, packages, summary, patches, targets, directory, requires)


def _load_requires(entries: list[dict[str, Any]], manifest_path: Path, distribution: str) -> tuple[Companion, ...]:
    companions: list[Companion] = []
    for index, entry in enumerate(entries, start=1):
        name = canonicalize_name(entry["distribution"].strip())
        if name == distribution:
            raise _fail(manifest_path, f"requires[{index}] names the patched distribution {name} itself")
        version = entry["version"].strip()
        try:
            Version(version)
        except InvalidVersion:
            raise _fail(manifest_path, f"requires[{index}] {name}: version {version!r} is not a PEP 440 version") from None
        library = entry.get("library")
        companions.append(Companion(name, version, entry["why"].strip(), library.strip() if library else None))
    return tuple(companions)


def _load_patches(
    entries: list[dict[str, Any]], directory: Path, manifest_path: Path, packages: tuple[str, ...]
) -> tuple[Patch, ...]:
    patches: list[Patch] = []
    for index, entry in enumerate(entries, start=1):
        file = entry["file"].strip()
        match = _DIFF_NAME.match(file)
        if not match:
            raise _fail(manifest_path, f"patch[{index}].file: diff name {file!r} must look like 0001-some-slug.diff")
        if int(match["number"]) != index:
            raise _fail(manifest_path, f"diff {file!r} is [[patch]] #{index}; numbers must run 0001, 0002, ...")
        diff_path = directory / file
        try:
            text = diff_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise _fail(manifest_path, f"lists {file}, which does not exist") from None
        try:
            file_diffs = parse_diff(text)
        except ValueError as exc:
            raise _fail(diff_path, str(exc)) from None
        for fd in file_diffs:
            check_relative_path(fd.path, packages, diff_path)
        patches.append(
            Patch(
                number=index,
                file=file,
                title=entry["title"].strip(),
                fixes=entry["fixes"].strip(),
                gpus=entry["gpus"].strip(),
                references=tuple(entry.get("references", [])),
                diffs=tuple(file_diffs),
            )
        )
    return tuple(patches)


def _load_targets(entries: list[dict[str, Any]], manifest_path: Path, packages: tuple[str, ...]) -> tuple[Target, ...]:
    targets: list[Target] = []
    seen: set[str] = set()
    for entry in entries:
        path = check_relative_path(entry["path"].strip(), packages, manifest_path)
        if path in seen:
            raise _fail(manifest_path, f"target {path} is listed twice")
        seen.add(path)
        hashes = []
        for key in ("pristine_sha256", "patched_sha256"):
            value = entry[key].strip()
            if not _SHA256.match(value):
                raise _fail(manifest_path, f"{path}: {key} must be 64 lowercase hex digits, found {value!r}")
            hashes.append(value)
        if hashes[0] == hashes[1]:
            raise _fail(manifest_path, f"{path}: pristine and patched sha256 are equal")
        targets.append(Target(path, hashes[0], hashes[1]))
    return tuple(targets)
