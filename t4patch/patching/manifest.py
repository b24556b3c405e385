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

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from t4patch.data.tomlcompat import tomllib
from t4patch.errors import PatchSetError
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


def _fail(where: Path, problem: str) -> PatchSetError:
    return PatchSetError(
        f"invalid patch set {where}: {problem}",
        hint="fix the patch set, then check it with: t4patch validate",
    )


def _require_str(table: dict[str, object], key: str, where: Path) -> str:
    value = table.get(key)
    if not isinstance(value, str) or not value.strip():
        raise _fail(where, f"expected a non-empty string for {key!r}, found {value!r}")
    return value.strip()


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
    try:
        raw = tomllib.loads(manifest_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise _fail(directory, f"expected {MANIFEST_NAME}, found none") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise _fail(manifest_path, f"not valid TOML ({exc})") from None

    if raw.get("schema") != SCHEMA_VERSION:
        raise _fail(
            manifest_path,
            f"expected schema = {SCHEMA_VERSION}, found {raw.get('schema')!r} (a newer t4patch may be needed)",
        )
    distribution = canonicalize_name(_require_str(raw, "distribution", manifest_path))
    version = _require_str(raw, "version", manifest_path)
    try:
        parsed_version = Version(version)
    except InvalidVersion:
        raise _fail(manifest_path, f"version {version!r} is not a PEP 440 version") from None
    if canonicalize_name(directory.parent.name) != distribution or directory.name != str(parsed_version):
        raise _fail(
            manifest_path,
            f"declares {distribution}=={version} but lives in {directory.parent.name}/{directory.name}/",
        )
    packages_raw = raw.get("packages")
    if not (isinstance(packages_raw, list) and packages_raw and all(isinstance(p, str) for p in packages_raw)):
        raise _fail(manifest_path, "expected packages = [\"<top-level package>\", ...]")
    packages = tuple(packages_raw)
    summary = _require_str(raw, "summary", manifest_path)

    patches = _load_patches(raw.get("patch"), directory, manifest_path, packages)
    targets = _load_targets(raw.get("target"), manifest_path, packages)

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


def _load_requires(entries: object, manifest_path: Path, distribution: str) -> tuple[Companion, ...]:
    if not isinstance(entries, list):
        raise _fail(manifest_path, "expected [[requires]] tables")
    companions: list[Companion] = []
    for entry in entries:
        if not isinstance(entry, dict):
            raise _fail(manifest_path, "a [[requires]] entry is not a table")
        name = canonicalize_name(_require_str(entry, "distribution", manifest_path))
        if name == distribution:
            raise _fail(manifest_path, f"[[requires]] names the patched distribution {name} itself")
        version = _require_str(entry, "version", manifest_path)
        try:
            Version(version)
        except InvalidVersion:
            raise _fail(manifest_path, f"[[requires]] {name}: version {version!r} is not a PEP 440 version") from None
        library = entry.get("library")
        if library is not None and not (isinstance(library, str) and library.strip()):
            raise _fail(manifest_path, f"[[requires]] {name}: library must be a non-empty string")
        companions.append(Companion(name, version, _require_str(entry, "why", manifest_path), library))
    return tuple(companions)


def _load_patches(
    entries: object, directory: Path, manifest_path: Path, packages: tuple[str, ...]
) -> tuple[Patch, ...]:
    if not isinstance(entries, list) or not entries:
        raise _fail(manifest_path, "expected at least one [[patch]] table")
    patches: list[Patch] = []
    for index, entry in enumerate(entries, start=1):
        if not isinstance(entry, dict):
            raise _fail(manifest_path, f"[[patch]] #{index} is not a table")
        file = _require_str(entry, "file", manifest_path)
        match = _DIFF_NAME.match(file)
        if not match:
            raise _fail(manifest_path, f"diff name {file!r} must look like 0001-some-slug.diff")
        if int(match["number"]) != index:
            raise _fail(manifest_path, f"diff {file!r} is [[patch]] #{index}; numbers must run 0001, 0002, ...")
        refs = entry.get("references", [])
        if not (isinstance(refs, list) and all(isinstance(r, str) for r in refs)):
            raise _fail(manifest_path, f"{file}: references must be a list of strings")
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
                title=_require_str(entry, "title", manifest_path),
                fixes=_require_str(entry, "fixes", manifest_path),
                gpus=_require_str(entry, "gpus", manifest_path),
                references=tuple(refs),
                diffs=tuple(file_diffs),
            )
        )
    return tuple(patches)


def _load_targets(entries: object, manifest_path: Path, packages: tuple[str, ...]) -> tuple[Target, ...]:
    if not isinstance(entries, list) or not entries:
        raise _fail(manifest_path, "expected at least one [[target]] table")
    targets: list[Target] = []
    seen: set[str] = set()
    for entry in entries:
        if not isinstance(entry, dict):
            raise _fail(manifest_path, "a [[target]] entry is not a table")
        path = check_relative_path(_require_str(entry, "path", manifest_path), packages, manifest_path)
        if path in seen:
            raise _fail(manifest_path, f"target {path} is listed twice")
        seen.add(path)
        hashes = []
        for key in ("pristine_sha256", "patched_sha256"):
            value = _require_str(entry, key, manifest_path)
            if not _SHA256.match(value):
                raise _fail(manifest_path, f"{path}: {key} must be 64 lowercase hex digits, found {value!r}")
            hashes.append(value)
        if hashes[0] == hashes[1]:
            raise _fail(manifest_path, f"{path}: pristine and patched sha256 are equal")
        targets.append(Target(path, hashes[0], hashes[1]))
    return tuple(targets)
