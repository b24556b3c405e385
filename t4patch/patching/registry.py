"""The shipped patch sets, found by walking ``patches/<distribution>/<version>/``.

Engine patch sets live there; ``patches/build/`` holds source patches for `t4patch build` recipes and is not
an engine registry, so it is skipped here.
"""

from __future__ import annotations

import errno
import os
import shlex
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import Version

from t4patch.data.locations import data_dir
from t4patch.errors import NotInstalledError, PatchSetError, UnsupportedVersionError, UsageError
from t4patch.patching.local_version import release_of
from t4patch.patching.manifest import MANIFEST_NAME, PatchSet, load_patch_set

NON_ENGINE_DIRS = frozenset({"build"})


def patch_set_dirs(root: Path | None = None) -> list[Path]:
    """Every directory holding a manifest, sorted by distribution then version.

    A patch-set directory must be named by the exact version it patches; anything else holding a manifest
    (``patches/vllm/latest/``) makes the whole tree invalid, said before anything is read or written.
    """
    try:
        base = root or data_dir("patches")
        if base.is_dir() and not os.access(base, os.R_OK | os.X_OK):  # glob would quietly find nothing
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(base))
        manifests = _manifests(base)
    except OSError as exc:  # e.g. T4PATCH_PATCHES names a directory this user may not read
        raise PatchSetError(
            f"cannot read the patch-set tree {exc.filename} ({exc.strerror or exc}); expected a readable "
            "patches/<distribution>/<version>/ tree",
            hint="fix its permissions, or point --patches / T4PATCH_PATCHES at a readable copy",
        ) from None
    for manifest in manifests:
        _check_manifest_file(manifest)
    found = [m.parent for m in manifests]
    for directory in found:
        if not _is_version(directory.name):
            raise PatchSetError(
                f"invalid patch-set tree {base}: {directory.parent.name}/{directory.name}/ holds a manifest but "
                f"{directory.name!r} is not a PEP 440 version; expected patches/<distribution>/<version>/",
                hint=f"rename or remove {directory}, then check it with: t4patch validate",
            )
    return sorted(found, key=lambda d: (d.parent.name, Version(d.name)))


def _manifests(base: Path) -> list[Path]:
    """``<base>/<distribution>/<version>/manifest.toml`` wherever a name is there at all: a glob would follow
    a manifest that is a dangling symlink to nothing and drop that release's set without a word."""
    if not base.is_dir():
        return []
    found = []
    for dist_dir in sorted(base.iterdir()):
        if dist_dir.name in NON_ENGINE_DIRS or not dist_dir.is_dir():
            continue
        for version_dir in sorted(dist_dir.iterdir()):
            if not version_dir.is_dir():
                continue
            manifest = version_dir / MANIFEST_NAME
            try:
                os.lstat(manifest)
            except (FileNotFoundError, NotADirectoryError):
                continue  # no manifest: not a patch-set directory
            found.append(manifest)
    return found


def _check_manifest_file(manifest: Path) -> None:
    """A manifest that is named but cannot be read is a data error naming the file, never a missing release."""
    problem = None
    if manifest.is_symlink() and not manifest.exists():
        problem = f"a symlink to {os.readlink(manifest)}, which does not exist"
    elif manifest.is_dir():
        problem = "a directory"
    elif not manifest.is_file():
        problem = "something that is not a regular file"
    elif not os.access(manifest, os.R_OK):
        problem = "a file this user may not read"
    if problem:
        raise PatchSetError(
            f"{manifest}: expected a readable patch-set manifest, found {problem}; the patch set for "
            f"{manifest.parent.parent.name} {manifest.parent.name} cannot be loaded",
            hint=f"restore or remove {manifest.parent}, then check the tree with: t4patch validate",
        )


def _is_version(text: str) -> bool:
    try:
        Version(text)
    except ValueError:  # InvalidVersion, and a version with more digits than int() converts
        return False
    return True


def all_patch_sets(root: Path | None = None) -> list[PatchSet]:
    """Load (and so validate) every shipped patch set."""
    return [load_patch_set(d) for d in patch_set_dirs(root)]


def engines(root: Path | None = None) -> list[str]:
    """Canonical names of the distributions that have at least one patch set."""
    return sorted({canonicalize_name(d.parent.name) for d in patch_set_dirs(root)})


def supported_versions(distribution: str, root: Path | None = None) -> list[str]:
    name = canonicalize_name(distribution)
    return [d.name for d in patch_set_dirs(root) if canonicalize_name(d.parent.name) == name]


def newest_supported(distribution: str, root: Path | None = None) -> str | None:
    """The newest version of ``distribution`` that has a shipped patch set, or None (the one home of "the
    newest shipped version": examples in help texts, install hints, the default companion set)."""
    versions = supported_versions(distribution, root)
    return versions[-1] if versions else None


def find_patch_set(distribution: str, version: str, root: Path | None = None) -> PatchSet:
    """The patch set for exactly ``distribution==version``, or an error listing what is supported."""
    name = canonicalize_name(distribution)
    if not _is_version(version):
        raise UnsupportedVersionError(
            f"{name} {version[:60]!r} is installed, which is not a PEP 440 version; t4patch patches released "
            "versions only",
            hint=f"reinstall a release of {name}, e.g. pip install --force-reinstall --no-deps {name}==<version>",
        )
    for directory in patch_set_dirs(root):
        # An install of a `t4patch wheel` wheel (0.33.0+t4patch.N) is the release its patch set is for.
        if canonicalize_name(directory.parent.name) == name and Version(directory.name) == Version(release_of(version)):
            return load_patch_set(directory)
    versions = supported_versions(name, root)
    if not versions:
        raise NotInstalledError(
            f"t4patch has no patch sets for {distribution!r}; it patches: {', '.join(engines(root)) or 'nothing'}",
            hint="t4patch list",
        )
    nearest = nearest_version(versions, version)
    raise UnsupportedVersionError(
        f"{name} {version} is installed; t4patch has patch sets for {name} {', '.join(versions)} only "
        f"(nearest: {nearest})",
        hint=f"install the release t4patch has a set for, with its own dependencies (pip install {name}=={nearest} in "
        f"that environment: --no-deps would keep {version}'s), or make a "
        f"draft set for {version} to review: t4patch port {name}=={version} --from {name}=={nearest} "
        "(docs/maintaining.md)",
    )


def nearest_version(versions: list[str], version: str) -> str:
    """The shipped release nearest ``version``: the newest older one, else the oldest newer one (the one a
    port from it has the fewest upstream changes to cross, as maintainers port forward)."""
    try:
        target = Version(version)
    except ValueError:
        return versions[-1]
    ordered = sorted(versions, key=Version)
    older = [v for v in ordered if Version(v) < target]
    return older[-1] if older else ordered[0]


def sets_for_wheel(sets: list[PatchSet], wheel: Path) -> list[PatchSet]:
    """The patch sets made for the release ``wheel`` is (its file name says which), for ``validate --wheel``;
    proving every set against one wheel would fail for all the others, whose data is fine."""
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    try:
        name, version, _, _ = parse_wheel_filename(wheel.name)
    except InvalidWheelFilename as exc:
        raise UsageError(
            f"--wheel {wheel}: expected a wheel file name (NAME-VERSION-TAGS.whl), found {wheel.name!r} ({exc})",
            hint="pass the released wheel as pip downloaded it, or name the patch-set directory too",
        ) from None
    matching = [ps for ps in sets if ps.distribution == name and Version(ps.version) == version]
    if not matching:
        versions = supported_versions(name)
        raise UnsupportedVersionError(
            f"--wheel {wheel.name} is {name} {version}; t4patch has patch sets for "
            + (f"{name} {', '.join(versions)} only" if versions else f"no {name} release"),
            hint="pass a wheel of a release t4patch has a set for (t4patch list), or name the patch-set directory: "
            f"t4patch validate DIR --wheel {shlex.quote(str(wheel))}",
        )
    return matching
