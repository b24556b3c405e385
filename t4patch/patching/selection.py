"""From what the user typed (``vllm``, ``vllm==0.33.0``, ``SGLang>=0.5``) to an installed distribution
and the patch set made for exactly its version, with the optional diffs asked for (``--with NAME``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from t4patch.environment import suggest
from t4patch.environment.target import InstalledDistribution, TargetEnvironment
from t4patch.errors import (
    NotInstalledError,
    TargetEnvironmentError,
    UnsupportedVersionError,
    UsageError,
)
from t4patch.patching.drafts import refuse_draft
from t4patch.patching.manifest import PatchSet
from t4patch.patching.options import planned_set
from t4patch.patching.plan import Operation
from t4patch.patching.registry import engines, find_patch_set, newest_supported


@dataclass(frozen=True)
class Selection:
    requested: str
    distribution: InstalledDistribution
    patch_set: PatchSet  # as shipped: the default diffs, its optional ones listed but off
    options: tuple[str, ...] = ()  # optional diffs of this set asked for with --with

    def planned_set(self, operation: Operation) -> PatchSet:
        """The set to plan ``operation`` with (see :mod:`t4patch.patching.options`); reads the optional
        files, so a real run calls it under the lock."""
        return planned_set(self.patch_set, self.distribution, operation, self.options)


MAX_SPEC_CHARS = 200  # a name and a version; a 10,000-digit "version" is not a spec


def example_spec() -> str:
    """A real pinned spec for this module's help wording: the first distribution with a shipped patch set, at
    its newest version (from the patch-set tree: this module never reads the engine table)."""
    names = engines()
    newest = newest_supported(names[0]) if names else None
    return f"{names[0]}=={newest}" if newest else "NAME==VERSION"


def parse_spec(spec: str) -> Requirement:
    if len(spec) > MAX_SPEC_CHARS:
        raise UsageError(
            f"an engine spec of {len(spec)} characters ({spec[:40]}...); expected a name with an optional PEP 440 "
            f"version of at most {MAX_SPEC_CHARS} characters, e.g. {example_spec()}",
            hint="t4patch list",
        )
    try:
        req = Requirement(spec)
    except InvalidRequirement:
        raise UsageError(
            f"{spec!r} is not an engine spec; expected a name with an optional PEP 440 version, e.g. {example_spec()}",
            hint="t4patch list",
        ) from None
    if req.extras or req.url or req.marker:
        raise UsageError(f"{spec!r}: extras, URLs and markers mean nothing here; expected e.g. {example_spec()}")
    return req


def _install_hint(name: str, target: TargetEnvironment) -> str:
    """Look there, retarget, or install the engine as its docs say (never a pip install of its dependencies)."""
    newest = newest_supported(name)
    return suggest.not_installed(name, target, f"{name}=={newest}" if newest else None)


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
    dist = find_installed(target, name)
    if dist is None:
        raise NotInstalledError(
            f"{name} is not installed in {target.description}",
            hint=_install_hint(name, target),
        )
    check_single_install(dist)
    try:
        matches = not req.specifier or req.specifier.contains(dist.version, prereleases=True)
    except ValueError as exc:  # e.g. a version with more digits than int() converts
        raise UsageError(f"{spec[:60]!r}: cannot compare it with {dist.version} ({exc})") from None
    if not matches:
        raise UnsupportedVersionError(
            f"asked for {spec} but {name} {dist.version} is installed in {target.description}",
            hint=f"ask for {name}=={dist.version}; the versions t4patch supports: t4patch list",
        )
    patch_set = find_patch_set(name, dist.version)
    refuse_draft(patch_set)  # written by `t4patch port`, not reviewed yet
    return Selection(spec, dist, patch_set)


def request_options(selections: Sequence[Selection], names: Sequence[str], *, flag: str = "--with") -> list[Selection]:
    """Give each selection the names in ``names`` that are optional diffs of its set.

    A name that no selected set has is a usage error naming every selected set's options, so a typo never
    silently applies the default set alone."""
    wanted = tuple(dict.fromkeys(names))
    unknown = [n for n in wanted if not any(n in s.patch_set.option_names for s in selections)]
    if unknown:
        offered = "; ".join(f"{s.patch_set.spec}: {', '.join(s.patch_set.option_names) or 'none'}" for s in selections)
        raise UsageError(
            f"{flag} {', '.join(unknown)}: expected the name of an optional diff of the selected patch set(s) "
            f"({offered}), found no optional diff by that name",
            hint="t4patch list (shows each set's optional diffs)",
        )
    return [replace(s, options=tuple(n for n in wanted if n in s.patch_set.option_names)) for s in selections]


def find_installed(target: TargetEnvironment, name: str) -> InstalledDistribution | None:
    """``target.find(name)`` with damaged metadata turned into a one-line error, and its version checked."""
    try:
        dist = target.find(name)
    except (OSError, ValueError) as exc:  # unreadable or non-UTF-8 METADATA, an unlistable directory
        raise TargetEnvironmentError(
            f"cannot read the installed metadata of {name} in {target.description} ({type(exc).__name__}: {exc})",
            hint=f"reinstall {name} there (pip install --force-reinstall --no-deps {name}==<version>)",
        ) from None
    if dist is not None:
        try:
            Version(dist.version)
        except InvalidVersion:
            raise UnsupportedVersionError(
                f"{name}: {dist.dist_info / 'METADATA'} gives Version {dist.version[:60]!r}, expected a PEP 440 "
                "version; t4patch patches only released versions",
                hint=f"reinstall the release: {dist.pip} --force-reinstall --no-deps {name}==<version>",
            ) from None
    return dist


def other_installs(dist: InstalledDistribution) -> list[Path]:
    """Other metadata directories of the same distribution beside ``dist``'s (a half-finished upgrade)."""
    others: list[Path] = []
    try:
        entries = sorted(dist.root.iterdir())
    except OSError:
        return others
    for entry in entries:
        if entry == dist.dist_info or entry.suffix not in (".dist-info", ".egg-info"):
            continue
        if canonicalize_name(entry.name.split("-", 1)[0].rsplit(".", 1)[0]) == dist.name:
            others.append(entry)
    return others


def check_single_install(dist: InstalledDistribution) -> None:
    """Refuse a distribution installed twice in one directory: which files belong to which is unknowable."""
    others = other_installs(dist)
    if others:
        names = ", ".join(p.name for p in [dist.dist_info, *others])
        raise TargetEnvironmentError(
            f"{dist.name} is installed more than once in {dist.root}: {names} (a half-finished upgrade?); "
            "expected exactly one metadata directory, so nothing was written",
            hint=f"remove the stale one(s), or {dist.reinstall_command()}",
        )
