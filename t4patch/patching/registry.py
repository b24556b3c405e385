"""The shipped patch sets, found by walking ``patches/<distribution>/<version>/``.

Engine patch sets live there; ``patches/build/`` holds source patches for `t4patch build` recipes and is not
an engine registry, so it is skipped here.
"""

from __future__ import annotations

from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import Version

from t4patch.data.locations import data_dir
from t4patch.errors import NotInstalledError, UnsupportedVersionError
from t4patch.patching.manifest import MANIFEST_NAME, PatchSet, load_patch_set

NON_ENGINE_DIRS = frozenset({"build"})


def patch_set_dirs(root: Path | None = None) -> list[Path]:
    """Every directory holding a manifest, sorted by distribution then version."""
    base = root or data_dir("patches")
    found = [
        m.parent
        for m in base.glob(f"*/*/{MANIFEST_NAME}")
        if m.parent.parent.name not in NON_ENGINE_DIRS
    ]
    return sorted(found, key=lambda d: (d.parent.name, Version(d.name) if _is_version(d.name) else Version("0")))


def _is_version(text: str) -> bool:
    try:
        Version(text)
    except ValueError:
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


def find_patch_set(distribution: str, version: str, root: Path | None = None) -> PatchSet:
    """The patch set for exactly ``distribution==version``, or an error listing what is supported."""
    name = canonicalize_name(distribution)
    for directory in patch_set_dirs(root):
        if canonicalize_name(directory.parent.name) == name and Version(directory.name) == Version(version):
            return load_patch_set(directory)
    versions = supported_versions(name, root)
    if not versions:
        raise NotInstalledError(
            f"t4patch has no patch sets for {distribution!r}; it patches: {', '.join(engines(root)) or 'nothing'}",
            hint="t4patch list",
        )
    raise UnsupportedVersionError(
        f"{name} {version} is installed; t4patch has patch sets for {name} {', '.join(versions)} only",
        hint=f"install {name}=={versions[-1]} (pip install --no-deps {name}=={versions[-1]} in that environment), "
        "or check for a newer t4patch",
    )
