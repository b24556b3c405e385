"""Patch sets: load ``patches/<distribution>/<version>/manifest.toml`` and its diffs, and validate them.

A patch set is data, and data shipped to users must be checked before it can touch a file: the schema
version, the names, that every diff parses, only modifies files (no create/delete/rename), stays inside the
distribution's own top-level packages (no absolute paths, no ``..``), and that every file a diff touches is
pinned by a pristine and a patched sha256. Whether the pristine hash equals the wheel's RECORD is checked
against the installed distribution when a plan is made (see :mod:`t4patch.patching.plan`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from t4patch.data.reader import Bool, DataKind, Int, ListOf, Str, Table, optional, read
from t4patch.errors import PatchSetError, T4PatchError, UsageError
from t4patch.patching.unified_diff import FileDiff, parse_diff

SCHEMA_VERSION = 1
MANIFEST_NAME = "manifest.toml"
_DIFF_NAME = re.compile(r"^(?P<number>\d{4})-(?P<slug>[a-z0-9][a-z0-9-]*)\.diff$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_OPTION_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")
# the diff is the upstream change (a backport) / a different fix for the same problem / t4patch's own change,
# and the link is a thread about the problem (an issue, an unmerged or closed pull request) that it cites
RELATIONS = ("mirrors", "replaces", "related")
FORWARDED = ("yes", "no", "not-needed")  # DEP-3 "Forwarded": sent upstream, not (yet), or no point


@dataclass(frozen=True)
class Upstream:
    """DEP-3 style maintenance facts of one diff (``[patch.upstream]``): what it tracks upstream, and why."""

    link: str  # the upstream issue or pull request the diff mirrors, replaces or is related to
    relation: str  # one of RELATIONS
    forwarded: str  # one of FORWARDED
    why: str  # why the diff exists (and, when not forwarded, why not)

    def to_json(self) -> dict[str, str]:
        return {"link": self.link, "relation": self.relation, "forwarded": self.forwarded, "why": self.why}


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
    upstream: Upstream | None = None
    optional: str | None = None  # the name `apply --with NAME` turns it on by; None: always applied

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
    # A set written by `t4patch port` that no maintainer has reviewed yet: apply refuses it (selection layer).
    draft: bool = False
    # Optional diffs (off unless asked for) and the files only they touch; ``patches`` / ``targets`` above are
    # what a plain apply changes. :meth:`with_options` gives the set with some of them turned on.
    optional_patches: tuple[Patch, ...] = ()
    optional_targets: tuple[Target, ...] = ()
    options_on: tuple[str, ...] = ()

    @property
    def spec(self) -> str:
        return f"{self.distribution}=={self.version}"

    @property
    def option_names(self) -> tuple[str, ...]:
        return tuple(p.optional for p in self.optional_patches if p.optional)

    @property
    def all_patches(self) -> tuple[Patch, ...]:
        """Every diff of the set, default and optional, in file order."""
        return tuple(sorted(self.patches + tuple(p for p in self.optional_patches if p not in self.patches),
                            key=lambda p: p.number))

    def with_options(self, names: tuple[str, ...] | list[str]) -> PatchSet:
        """This set with the optional diffs ``names`` turned on (their diffs and targets join the default ones)."""
        unknown = [n for n in names if n not in self.option_names]
        if unknown:
            raise UsageError(
                f"{self.spec}: expected an optional diff name ({', '.join(self.option_names) or 'this set has none'}), "
                f"found {', '.join(unknown)}",
                hint="t4patch list (shows each set's optional diffs)",
            )
        chosen = [p for p in self.optional_patches if p.optional in names and p not in self.patches]
        paths = {path for p in chosen for path in p.paths}
        return replace(
            self,
            patches=tuple(sorted(self.patches + tuple(chosen), key=lambda p: p.number)),
            targets=self.targets + tuple(t for t in self.optional_targets if t.path in paths),
            options_on=tuple(sorted(set(self.options_on) | set(names))),
        )

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
        "draft": optional(Bool()),  # written by `t4patch port`; a maintainer deletes it after review
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
                    "optional": optional(Str()),  # a name: off unless `apply --with NAME`
                    "upstream": optional(
                        Table({"link": Str(), "relation": Str(), "forwarded": Str(), "why": Str()})
                    ),
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

    every_patch = _load_patches(raw["patch"], directory, manifest_path, packages)
    targets = _load_targets(raw["target"], manifest_path, packages)

    touched = {path for p in every_patch for path in p.paths}
    declared = {t.path for t in targets}
    if touched - declared:
        raise _fail(manifest_path, f"diffs touch files with no [[target]] hashes: {sorted(touched - declared)}")
    if declared - touched:
        raise _fail(manifest_path, f"[[target]] files no diff touches: {sorted(declared - touched)}")
    patches, optional_patches, optional_paths = _split_optional(every_patch, manifest_path)

    expected_files = {MANIFEST_NAME, *(p.file for p in every_patch)}
    stray = sorted(f.name for f in directory.iterdir() if f.name not in expected_files)
    if stray:
        raise _fail(directory, f"files not listed in the manifest: {stray}")

    requires = _load_requires(raw.get("requires", []), manifest_path, distribution)
    return PatchSet(
        distribution,
        version,
        packages,
        summary,
        patches,
        tuple(t for t in targets if t.path not in optional_paths),
        directory,
        requires,
        draft=bool(raw.get("draft", False)),
        optional_patches=optional_patches,
        optional_targets=tuple(t for t in targets if t.path in optional_paths),
    )


def _split_optional(
    patches: tuple[Patch, ...], manifest_path: Path
) -> tuple[tuple[Patch, ...], tuple[Patch, ...], set[str]]:
    """Default and optional diffs. An optional diff comes after every default one and is the only diff touching
    its files, so each file has one pinned patched sha256 whichever options are on."""
    default = tuple(p for p in patches if p.optional is None)
    optional_ = tuple(p for p in patches if p.optional is not None)
    if not default:
        raise _fail(manifest_path, "expected at least one [[patch]] without `optional` (a set of only options "
                                   "changes nothing by default)")
    if optional_ and min(p.number for p in optional_) < max(p.number for p in default):
        raise _fail(manifest_path, "optional diffs must be numbered after every default diff")
    names = [p.optional for p in optional_]
    if len(set(names)) != len(names):
        raise _fail(manifest_path, f"optional diff names must be unique, found {names}")
    paths: set[str] = set()
    for p in optional_:
        others = {path for q in patches if q is not p for path in q.paths}
        shared = sorted(set(p.paths) & others)
        if shared:
            raise _fail(manifest_path, f"{p.file} (optional {p.optional!r}) touches {shared}, which other diffs "
                                       "touch too; an optional diff must be the only diff of its files")
        paths |= set(p.paths)
    return default, optional_, paths


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
        except (OSError, UnicodeDecodeError) as exc:  # a directory, unreadable, not UTF-8
            raise _fail(diff_path, f"expected a readable UTF-8 diff, found an unreadable one ({exc})") from None
        try:
            file_diffs = parse_diff(text)
        except ValueError as exc:
            raise _fail(diff_path, str(exc)) from None
        for fd in file_diffs:
            check_relative_path(fd.path, packages, diff_path)
        option = entry.get("optional")
        if option is not None and not _OPTION_NAME.match(option):
            raise _fail(manifest_path, f"patch[{index}].optional: expected a lowercase name like "
                                       f"'decode-window', found {option!r}")
        patches.append(
            Patch(
                number=index,
                file=file,
                title=entry["title"].strip(),
                fixes=entry["fixes"].strip(),
                gpus=entry["gpus"].strip(),
                references=tuple(entry.get("references", [])),
                diffs=tuple(file_diffs),
                upstream=_load_upstream(entry.get("upstream"), manifest_path, index),
                optional=option,
            )
        )
    return tuple(patches)


def _load_upstream(entry: dict[str, Any] | None, manifest_path: Path, index: int) -> Upstream | None:
    if entry is None:
        return None
    where = f"patch[{index}].upstream"
    link = entry["link"].strip()
    if not link.startswith("https://"):
        raise _fail(manifest_path, f"{where}.link: expected an https:// URL of an upstream issue or PR, found {link!r}")
    for key, allowed in (("relation", RELATIONS), ("forwarded", FORWARDED)):
        if entry[key] not in allowed:
            raise _fail(manifest_path, f"{where}.{key}: expected one of {', '.join(allowed)}, found {entry[key]!r}")
    return Upstream(link, entry["relation"], entry["forwarded"], entry["why"].strip())


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
