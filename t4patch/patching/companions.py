"""Whether a patch set's companions (``[[requires]]``) are present at the release it needs, as data.

A patched SGLang below compute capability 8.0 calls vLLM 0.33.0's compiled kernels, so "SGLang's set is
applied" is only healthy with that vLLM beside it. This module answers the question once, structurally (what is
needed, what was found, the command that fixes it for the target's layout), for ``status --check`` and for the
messages that print it. The install command never pulls the companion's own dependencies (``--no-deps``): a
companion is there for its compiled code, and its pins (another torch) would replace the engine's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from t4patch.environment.target import InstalledDistribution, TargetEnvironment
from t4patch.patching.local_version import release_of
from t4patch.patching.manifest import Companion


@dataclass(frozen=True)
class CompanionGap:
    """One companion that is not as its patch set needs it."""

    needed: Companion
    found: str  # what is there instead: "not installed in ...", "vllm 0.32.0 is installed", "<library> is missing"
    fix: str  # the shell command (quoted for the target's layout) that puts the needed release there

    def describe(self) -> str:
        return f"needs {self.needed.spec} beside it but {self.found}"


def companion_gaps(requires: Iterable[Companion], target: TargetEnvironment) -> list[CompanionGap]:
    """The companions of ``requires`` that ``target`` lacks, holds at another release, or holds without the
    compiled library the patched code loads; [] when every one is as needed."""
    gaps = []
    for needed in requires:
        dist = target.find(needed.distribution)
        if dist is None:
            gaps.append(CompanionGap(needed, f"it is not installed in {target.description}",
                                     f"{target.pip_install()} --no-deps {needed.spec}"))
        elif release_of(dist.version) != needed.version:  # a `t4patch wheel` install is its release
            gaps.append(CompanionGap(needed, f"{needed.distribution} {dist.version} is installed",
                                     f"{target.pip_install()} --no-deps {needed.spec}"))
        elif needed.library and not (dist.root / needed.library).is_file():
            gaps.append(CompanionGap(needed, f"{dist.root / needed.library} is missing",
                                     dist.reinstall_command()))
    return gaps


def is_companion(dist: InstalledDistribution, requires: Iterable[Companion]) -> bool:
    """Whether ``dist`` is installed at exactly a release some patch set in ``requires`` needs beside it."""
    return any(c.distribution == dist.name and c.version == release_of(dist.version) for c in requires)
