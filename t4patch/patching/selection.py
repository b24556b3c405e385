"""From what the user typed (``vllm``, ``vllm==0.33.0``, ``SGLang>=0.5``) to an installed distribution
and the patch set made for exactly its version."""

from __future__ import annotations

from dataclasses import dataclass

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from t4patch.environment.target import InstalledDistribution, TargetEnvironment
from t4patch.errors import NotInstalledError, PatchSetError, UnsupportedVersionError, UsageError
from t4patch.patching.manifest import PatchSet
from t4patch.patching.registry import engines, find_patch_set


@dataclass(frozen=True)
class Selection:
    requested: str
    distribution: InstalledDistribution
    patch_set: PatchSet


def parse_spec(spec: str) -> Requirement:
    try:
        req = Requirement(spec)
    except InvalidRequirement:
        raise UsageError(
            f"{spec!r} is not an engine spec; expected a name with an optional PEP 440 version, e.g. vllm==0.33.0",
            hint="t4patch list",
        ) from None
    if req.extras or req.url or req.marker:
        raise UsageError(f"{spec!r}: extras, URLs and markers mean nothing here; expected e.g. vllm==0.33.0")
    return req


def select(spec: str, target: TargetEnvironment) -> Selection:
    """Resolve ``spec`` in ``target``: installed, version matching the spec, and a shipped patch set."""
    req = parse_spec(spec)
    name = canonicalize_name(req.name)
    known = engines()
    if name not in known:
        raise NotInstalledError(
            f"t4patch has no patch sets for {req.name!r}; it patches: {', '.join(known)}",
            hint="t4patch list",
        )
    dist = target.find(name)
    if dist is None:
        raise NotInstalledError(
            f"{name} is not installed in {target.description}",
            hint="install it there first, or point t4patch at the serving environment with --python EXE",
        )
    if req.specifier and not req.specifier.contains(dist.version, prereleases=True):
        raise UnsupportedVersionError(
            f"asked for {spec} but {name} {dist.version} is installed in {target.description}",
            hint=f"ask for {name}=={dist.version}, or t4patch list for the versions t4patch supports",
        )
    patch_set = find_patch_set(name, dist.version)
    if patch_set.draft:  # written by `t4patch port`, not reviewed yet
        raise PatchSetError(
            f"{patch_set.spec} in {patch_set.directory} is a draft written by `t4patch port`: expected a reviewed "
            "patch set, found `draft = true` in its manifest; nothing was written",
            hint=f"review every diff in {patch_set.directory} (docs/maintaining.md), then delete the `draft = true` "
            f"line and run: t4patch validate {patch_set.directory}",
        )
    return Selection(spec, dist, patch_set)
