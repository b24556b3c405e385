"""What state each engine's patch set is in, decided by sha256: the model `status`, `doctor` and `verify` share.

Per file: pristine, patched, foreign (neither hash) or missing. Per engine: applied, not-applied, partial,
foreign, not-installed or no-patch-set, judged on the default diffs (what a plain apply changes). Each
optional diff is reported beside it with its own state (:mod:`t4patch.patching.options`): options are optional,
so they never change the engine's state. The hashes decide; the state record only adds who applied it and when.

``status --check`` means "this environment serves as patched": every checked engine's default diffs applied
(plus the options named with ``--with``), and every companion a checked set requires (``[[requires]]``)
installed at that release with its compiled library. Without engine names it checks every installed engine
except one installed only as another engine's companion (at the release that set requires, its own set
pristine): SGLang's documented setup puts vLLM 0.33.0 beside it for its compiled kernels, unpatched, and that
is healthy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from packaging.version import Version

from t4patch.environment import suggest
from t4patch.environment.target import InstalledDistribution, TargetEnvironment
from t4patch.errors import NotAppliedError, T4PatchError, UsageError
from t4patch.patching.companions import CompanionGap, companion_gaps, is_companion
from t4patch.patching.manifest import Companion
from t4patch.patching.options import OptionStatus, option_statuses, summarise
from t4patch.patching.plan import FileStatus, file_statuses
from t4patch.patching.registry import find_patch_set, supported_versions
from t4patch.patching.selection import find_installed, other_installs
from t4patch.patching.state import read_record


@dataclass(frozen=True)
class EngineStatus:
    name: str
    installed: InstalledDistribution | None
    patch_set: str | None
    overall: str  # applied | not-applied | partial | foreign | not-installed | no-patch-set
    files: tuple[FileStatus, ...]
    detail: str
    options: tuple[OptionStatus, ...] = ()  # the set's optional diffs, each with its own state
    requires: tuple[Companion, ...] = ()  # the set's companions ([[requires]]), checked by status --check

    def option(self, name: str) -> OptionStatus | None:
        return next((o for o in self.options if o.name == name), None)

    def to_json(self) -> dict[str, Any]:
        record = read_record(self.installed) if self.installed and self.overall != "not-installed" else None
        return {
            "engine": self.name,
            "installed_version": self.installed.version if self.installed else None,
            "site_packages": str(self.installed.root) if self.installed else None,
            "patch_set": self.patch_set,
            "state": self.overall,
            "detail": self.detail,
            "files": [_file_json(f) for f in self.files],
            "options": [
                {"name": o.name, "patch": o.patch.file, "title": o.patch.title, "state": o.state,
                 "files": [_file_json(f) for f in o.files]}
                for o in self.options
            ],
            "record": record.raw if record else None,
        }


def _file_json(f: FileStatus) -> dict[str, Any]:
    return {"path": f.target.path, "state": f.state, "sha256": f.sha256,
            "pristine_sha256": f.target.pristine_sha256, "patched_sha256": f.target.patched_sha256}


def engine_status(name: str, target: TargetEnvironment) -> EngineStatus:
    dist = find_installed(target, name)
    if dist is None:
        return EngineStatus(name, None, None, "not-installed", (), f"not installed in {target.description}")
    others = other_installs(dist)
    if others:
        return EngineStatus(
            name, dist, None, "foreign", (),
            f"installed more than once in {dist.root} ({', '.join(p.name for p in [dist.dist_info, *others])}): "
            f"remove the stale one or reinstall with {dist.reinstall_command()}",
        )
    try:
        patch_set = find_patch_set(name, dist.version)
    except T4PatchError as exc:
        return EngineStatus(name, dist, None, "no-patch-set", (), exc.message)
    files = file_statuses(patch_set, dist)
    overall = summarise(files)
    detail = {
        "applied": "every file matches its patched sha256",
        "not-applied": "every file matches its pristine (released) sha256",
        "partial": f"some files patched, some pristine; to finish: {suggest.command(target, 'apply', patch_set.spec)}",
        "foreign": f"a file matches neither hash: reinstall with {dist.reinstall_command()}",
    }[overall]
    return EngineStatus(name, dist, patch_set.spec, overall, files, detail, option_statuses(patch_set, dist),
                        patch_set.requires)


def companion_of(status: EngineStatus, statuses: list[EngineStatus]) -> list[str]:
    """The sets in ``statuses`` (applied, partly applied or not yet applied) that ``status`` is installed beside as
    their companion, at the release they require; [] for an engine that is not one."""
    if status.installed is None:
        return []
    return [s.patch_set for s in statuses
            if s is not status and s.patch_set and s.overall in ("applied", "partial", "not-applied")
            and is_companion(status.installed, s.requires)]


def checked_by_default(statuses: list[EngineStatus]) -> list[EngineStatus]:
    """What a bare ``status --check`` checks: every installed engine except one installed only as another
    engine's companion, i.e. at the release that engine's set requires, with its own set not applied (pristine).
    Nothing passes that would fail otherwise unless the other set is applied: while it is not, the check fails
    on it. A companion that is partly patched or foreign is still checked: someone changed it."""
    return [s for s in statuses if not (s.overall == "not-applied" and companion_of(s, statuses))]


def option_detail(status: EngineStatus, option: OptionStatus, target: TargetEnvironment | None = None) -> str:
    """What an optional diff's state means and the command that changes it (status prints it), aimed at
    ``target`` so the command works when pasted."""
    turn_on = suggest.command(target, "apply", status.patch_set or status.name, "--with", option.name)
    revert = suggest.command(target, "revert", status.name)
    return {  # the command last, after a colon: what a user copies is the end of the line
        "applied": f"every file patched; to take it back with the rest: {revert}",
        "not-applied": f"off, as by default; to turn it on: {turn_on}",
        "partial": f"some files patched; to take it back: {revert}; to finish it: {turn_on}",
        "foreign": "a file matches neither hash: "
        + (status.installed.reinstall_command() if status.installed else "reinstall the engine"),
    }[option.state]


def required_options(statuses: list[EngineStatus], names: list[str]) -> dict[str, tuple[str, ...]]:
    """``status --check --with NAME``: per engine, the names its set has. A name no checked set has is a
    usage error naming the sets' options, so a typo never turns into a check that passes."""
    wanted = tuple(dict.fromkeys(names))
    unknown = [n for n in wanted if not any(s.option(n) for s in statuses)]
    if unknown:
        offered = "; ".join(f"{s.patch_set}: {', '.join(o.name for o in s.options) or 'none'}"
                            for s in statuses if s.patch_set) or "no checked engine has a patch set here"
        raise UsageError(
            f"--with {', '.join(unknown)}: expected the name of an optional diff of the checked patch set(s) "
            f"({offered}), found no optional diff by that name",
            hint="t4patch list (shows each set's optional diffs)",
        )
    return {s.name: tuple(n for n in wanted if s.option(n)) for s in statuses}


def companion_problems(status: EngineStatus, target: TargetEnvironment) -> list[CompanionGap]:
    """The companions ``status``'s set requires that ``target`` lacks (checked while the set is applied, partly
    applied or about to be applied: a patched engine without them fails when the patched code loads)."""
    if status.overall not in ("applied", "partial", "not-applied"):
        return []
    return companion_gaps(status.requires, target)


def check_applied(statuses: list[EngineStatus], required: dict[str, tuple[str, ...]],
                  target: TargetEnvironment) -> None:
    """``status --check``: every engine's default diffs applied (optional ones are optional), plus the options
    in ``required`` for each engine, plus its set's companions present at the required release; otherwise
    :class:`NotAppliedError` with the commands that fix it, aimed at ``target`` so they work when pasted."""
    problems: list[str] = []
    appliable: list[str] = []
    options: list[str] = []
    others: list[str] = []
    companions: list[str] = []
    for s in statuses:
        missing = [o for o in (s.option(n) for n in required.get(s.name, ())) if o and o.state != "applied"]
        gaps = companion_problems(s, target)
        companions += [g.fix for g in gaps if g.fix not in companions]
        if s.overall == "applied" and not missing and not gaps:
            continue
        states = (([] if s.overall == "applied" else [s.overall]) + [f"optional {o.name} {o.state}" for o in missing]
                  + [g.describe() for g in gaps])
        problems.append(f"{s.name} ({', '.join(states)})")
        if s.overall == "applied" and not missing:
            continue
        if s.overall == "not-installed":
            versions = supported_versions(s.name)
            release = f"{s.name}=={max(versions, key=Version)}" if versions else None
            others.append(suggest.not_installed(s.name, target, release, "status", s.name, "--check"))
        elif s.overall not in ("applied", "not-applied", "partial"):
            others.append(f"{s.name}: {s.detail}")
        elif any(o.state == "foreign" for o in missing):
            others.append(f"{s.name}: " + "; ".join(option_detail(s, o, target) for o in missing
                                                      if o.state == "foreign"))
        elif s.patch_set:
            appliable.append(s.patch_set)
            options += [o.name for o in missing if o.name not in options]
    if problems:
        with_ = [arg for n in options for arg in ("--with", n)]
        apply = [suggest.command(target, "apply", *appliable, *with_)] if appliable else []
        raise NotAppliedError("--check: not fully applied: " + ", ".join(problems),
                              hint="; ".join(companions + apply + others))
