"""Optional diffs of an installed engine: which are on, decided by hash, and the set a plan works with.

A patch set may carry optional diffs (``optional = "NAME"`` in its manifest), off unless asked for with
``--with NAME``. The manifest makes an optional diff the only diff of its files, so each of those files is
pristine or patched on its own, whatever the default set's state: whether an option is on is a fact of its
files' sha256, never of the state record. Three rules follow, and this module is where they live:

- ``apply --with NAME`` plans the default diffs plus NAME's; files already patched are skipped by the plan, so
  on an install with the default set applied only NAME's files are written.
- a plain ``apply`` never removes an option: one found applied is kept in the planned set (its files are
  already patched, so nothing is written for it) and the state record keeps naming it.
- ``revert`` plans every option that has a patched file, so every file t4patch patched goes back to its
  released bytes; an option none of whose files is patched is left out (a foreign file there is not ours).

Options are read here from the files; the caller decides when (under the environment lock for a real run).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from t4patch.environment import suggest
from t4patch.environment.target import InstalledDistribution, TargetEnvironment
from t4patch.patching.manifest import Patch, PatchSet
from t4patch.patching.plan import FileStatus, Operation, Plan, file_statuses


def summarise(files: tuple[FileStatus, ...]) -> str:
    """One state for a group of files: applied, not-applied, partial or foreign (a file of neither hash)."""
    states = {f.state for f in files}
    if states == {"patched"}:
        return "applied"
    if states == {"pristine"}:
        return "not-applied"
    if states & {"foreign", "missing"}:
        return "foreign"
    return "partial"


@dataclass(frozen=True)
class OptionStatus:
    """One optional diff of an installed engine's patch set, and its files' states."""

    name: str
    patch: Patch
    state: str  # applied | not-applied | partial | foreign
    files: tuple[FileStatus, ...]

    @property
    def touched(self) -> bool:
        """Whether any of its files holds t4patch's patched bytes (then revert must take it back)."""
        return any(f.state == "patched" for f in self.files)


def option_statuses(patch_set: PatchSet, dist: InstalledDistribution) -> tuple[OptionStatus, ...]:
    """Every optional diff of ``patch_set`` in the installed ``dist``, classified by its files' sha256."""
    out = []
    for patch in patch_set.optional_patches:
        if patch.optional is None:
            continue
        targets = tuple(t for t in patch_set.optional_targets if t.path in patch.paths)
        files = file_statuses(replace(patch_set, targets=targets), dist)
        out.append(OptionStatus(patch.optional, patch, summarise(files), files))
    return tuple(out)


def planned_set(patch_set: PatchSet, dist: InstalledDistribution, operation: Operation,
                requested: Sequence[str]) -> PatchSet:
    """The set to plan ``operation`` with: the default set plus the options the rules above turn on.

    ``requested`` must be option names of ``patch_set`` (checked when the specs were selected). Reads the
    optional files, so for a real run call it under the lock, just before the plan.
    """
    if not patch_set.optional_patches:
        return patch_set
    found = option_statuses(patch_set, dist)
    if operation == "revert":
        on = {o.name for o in found if o.touched}
    else:
        on = set(requested) | {o.name for o in found if o.state == "applied"}
    return patch_set.with_options(tuple(sorted(on))) if on else patch_set


def plan_label(plan: Plan) -> str:
    """``sglang==0.5.23`` or ``sglang==0.5.23 with NAME``: the set a plan applies (or reverts)."""
    on = plan.patch_set.options_on
    return f"{plan.patch_set.spec} with {', '.join(on)}" if on else plan.patch_set.spec


def kept_options(plan: Plan, requested: Sequence[str]) -> tuple[str, ...]:
    """Options an apply found applied without being asked for them (kept as they are, never removed)."""
    if plan.operation != "apply":
        return ()
    return tuple(o for o in plan.patch_set.options_on if o not in requested)


def kept_line(plan: Plan, requested: Sequence[str], target: TargetEnvironment | None = None) -> str | None:
    """The line an apply prints about options it found applied and left so (None when there are none); its
    revert command carries ``target``'s options, so it takes back the diffs of the environment just patched."""
    kept = kept_options(plan, requested)
    if not kept:
        return None
    revert = suggest.command(target, "revert", plan.patch_set.distribution)
    return (f"{plan.patch_set.spec}: optional {', '.join(kept)} was already applied and is left applied (apply "
            f"never removes an optional diff); to take back every diff: {revert}")
