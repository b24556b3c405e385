"""One home for refusing a draft patch set.

A draft set (``draft = true``, written by ``t4patch port``) is data nobody has reviewed: ``apply``, ``wheel`` and
every other command that would put its bytes into an environment or an artifact refuse it with the same message,
and ``port`` replaces an existing set only when it is a draft (:attr:`PatchSet.draft`, read by the strict
manifest loader, never a text search).
"""

from __future__ import annotations

import shlex

from t4patch.errors import PatchSetError
from t4patch.patching.manifest import PatchSet


def refuse_draft(patch_set: PatchSet, *, doing: str = "nothing was written") -> None:
    """Raise the one refusal of a draft set (exit 7); return when ``patch_set`` is reviewed."""
    if not patch_set.draft:
        return
    directory = shlex.quote(str(patch_set.directory))
    raise PatchSetError(
        f"{patch_set.spec} in {patch_set.directory} is a draft written by `t4patch port`: expected a reviewed "
        f"patch set, found `draft = true` in its manifest; {doing}",
        hint=f"review every diff in {directory} (docs/maintaining.md), then delete the `draft = true` line and "
        f"run: t4patch validate {directory}",
    )
