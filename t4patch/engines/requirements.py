"""Companion requirements read from the patch sets (``[[requires]]``), for the engine modules that act on them.

"This engine's patch set needs that release of another engine beside it" is a release fact, so it lives in
the manifest; the doctor checks, the Marlin loaders and their hints read it here instead of repeating it.
"""

from __future__ import annotations

from t4patch.environment.target import TargetEnvironment
from t4patch.errors import T4PatchError
from t4patch.patching.companions import companion_gaps
from t4patch.patching.manifest import Companion, PatchSet
from t4patch.patching.registry import all_patch_sets, find_patch_set, newest_supported


def patch_set_for(distribution: str, version: str | None) -> PatchSet | None:
    """The patch set for ``distribution==version``; for no or an unsupported version, the newest shipped one."""
    if version is not None:
        try:
            return find_patch_set(distribution, version)
        except T4PatchError:
            pass
    newest = newest_supported(distribution)
    return find_patch_set(distribution, newest) if newest else None


def companion(distribution: str, version: str | None, needs: str) -> Companion | None:
    """The release of ``needs`` that the patch set of ``distribution`` (at ``version``) requires beside it."""
    patch_set = patch_set_for(distribution, version)
    if patch_set is None:
        return None
    return next((c for c in patch_set.requires if c.distribution == needs), None)


def required_releases(distribution: str) -> list[Companion]:
    """Every release of ``distribution`` some shipped patch set requires as a companion, newest set first."""
    found: list[Companion] = []
    for patch_set in reversed(all_patch_sets()):
        for item in patch_set.requires:
            if item.distribution == distribution and item not in found:
                found.append(item)
    return found


def companion_problems(patch_set: PatchSet, target: TargetEnvironment) -> list[str]:
    """What is wrong with ``patch_set``'s companions in ``target`` (not installed, another release, its library
    missing), each with the exact install command for that layout (``--target`` for a bare site-packages); the
    finding itself is :func:`t4patch.patching.companions.companion_gaps`, shared with `status --check`."""
    return [
        f"{patch_set.spec} {gap.describe()} (the patched code fails at load without it): {gap.fix}"
        for gap in companion_gaps(patch_set.requires, target)
    ]
