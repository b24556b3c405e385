"""The apply/revert use case: select → lock → plan → write, as one call with a typed result.

This is the only entry point commands use to change an environment. :func:`perform` takes the lock on every
site-packages involved, plans every file *under* it (through the lock's lease, see
:mod:`t4patch.patching.execute`) and commits; :func:`preview` plans without the lock for ``--dry-run`` and
has no way to write. apply and revert are the same operation in two directions, so both commands call here
and neither imports the other.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from t4patch.environment.target import TargetEnvironment, resolve_target
from t4patch.errors import JournalRefusedError, TargetEnvironmentError, UsageError
from t4patch.patching import journal as jr
from t4patch.patching.execute import commit, locked
from t4patch.patching.journal import Recovery
from t4patch.patching.options import kept_line, kept_options, plan_label
from t4patch.patching.plan import Operation, Plan, make_plan
from t4patch.patching.selection import Selection, request_options, select


@dataclass(frozen=True)
class OperationResult:
    """What an apply or revert did (or, for a dry run, would do) to each selected engine."""

    operation: Operation
    dry_run: bool
    plans: tuple[Plan, ...]
    written: tuple[Path, ...]  # files replaced (empty for a dry run or when everything was already done)
    options: tuple[str, ...] = ()  # the optional diffs asked for (--with NAME)

    def describe(self, plan: Plan) -> dict[str, Any]:
        """One engine's result as the ``--json`` document's ``results`` entry."""
        return {
            "patch_set": plan.patch_set.spec,
            "options": list(plan.patch_set.options_on),  # on after an apply / taken back by a revert
            "options_kept": list(kept_options(plan, self.options)),  # found applied by an apply, left so
            "operation": plan.operation,
            "site_packages": str(plan.distribution.root),
            "already_done": plan.is_noop,
            "dry_run": self.dry_run,
            "files": [
                {
                    "path": s.target.path,
                    "state_before": s.state,
                    "action": "write" if any(c.status is s for c in plan.changes) else "none",
                }
                for s in plan.statuses
            ],
            **({"diff": diff_text(plan)} if self.dry_run else {}),
        }

    def lines(self, target: TargetEnvironment | None = None) -> list[str]:
        """The human report: one line per engine (plus the diff for a dry run); suggested commands aim at
        ``target``."""
        out = []
        for plan in self.plans:
            spec = plan_label(plan)
            if plan.is_noop:
                out.append(f"{spec}: already {'applied' if self.operation == 'apply' else 'pristine'}, nothing to do")
            elif self.dry_run:
                out.append(
                    f"{spec}: would {self.operation} {len(plan.changes)} file(s) in {plan.distribution.root} (dry run)"
                )
                out.append(diff_text(plan).rstrip("\n"))
            else:
                verb = "applied" if self.operation == "apply" else "reverted"
                out.append(f"{spec}: {verb}, {len(plan.changes)} file(s) written in {plan.distribution.root}")
            kept = kept_line(plan, self.options, target)
            if kept:
                out.append(kept)
        return out


def diff_text(plan: Plan) -> str:
    return "".join(c.unified_diff(plan.operation) for c in plan.changes)


def select_all(specs: Sequence[str], target: TargetEnvironment, options: Sequence[str] = ()) -> list[Selection]:
    """Resolve every spec in ``target`` with the optional diffs asked for; an engine named twice, or an
    option no selected set has, is a usage error."""
    selections = [select(spec, target) for spec in specs]
    names = [s.distribution.name for s in selections]
    if len(set(names)) != len(names):
        raise UsageError(f"an engine is named twice: {', '.join(specs)}")
    return request_options(selections, options)


def preview(specs: Sequence[str], target: TargetEnvironment, operation: Operation,
            options: Sequence[str] = ()) -> OperationResult:
    """Plan ``operation`` without the lock and without writing (``--dry-run``)."""
    plans = tuple(make_plan(s.planned_set(operation), s.distribution, operation)
                  for s in select_all(specs, target, options))
    return OperationResult(operation, True, plans, (), tuple(options))


def perform(specs: Sequence[str], target: TargetEnvironment, operation: Operation,
            options: Sequence[str] = ()) -> OperationResult:
    """Lock the site-packages of every selected engine, plan each under the lock, then write all or nothing."""
    selections = select_all(specs, target, options)
    with locked([s.distribution.root for s in selections]) as lease:
        lease.recover()  # a dead run's half-committed set first, so the plan sees a whole set
        # which options are on is read from the files here, under the lock, like the plan itself
        plans = tuple(lease.plan(s.planned_set(operation), s.distribution, operation) for s in selections)
        written = commit(lease, plans)
    return OperationResult(operation, False, plans, tuple(written), tuple(options))


def run(specs: Sequence[str], target: TargetEnvironment, operation: Operation, *, dry_run: bool,
        options: Sequence[str] = ()) -> OperationResult:
    """:func:`preview` for a dry run, else :func:`perform`; ``options``: optional diffs to apply too."""
    return (preview(specs, target, operation, options) if dry_run
            else perform(specs, target, operation, options))


def recover_target(target: TargetEnvironment) -> list[Recovery]:
    """Finish or undo any set a killed t4patch run left half committed anywhere in ``target``; say so.

    Cheap when there is nothing to do (one stat per search-path directory). Each journal names only the
    site-packages it lies in and is read and checked only under that directory's lock, so a run still in
    progress is waited for, not disturbed, and a journal that fails its checks is refused before anything is
    touched (:mod:`t4patch.patching.journal_check`).
    """
    done: list[Recovery] = []
    for path in jr.journal_paths(target.search_path):
        description = "commit"
        with contextlib.suppress(TargetEnvironmentError):  # read early only to name it in a refusal
            description = jr.read_journal(path).description
        try:
            # A journal seen without the lock may belong to a live run: wait for that run's lock, look again.
            with locked([path.parent]) as lease:
                if os.path.lexists(path):  # else it was live and has finished
                    done.extend(lease.recover())
        except JournalRefusedError:
            raise  # its line already names the journal and the way out
        except TargetEnvironmentError as exc:
            if not os.path.lexists(path) or str(path) in exc.message:
                raise  # gone meanwhile, or the line names the journal already
            raise type(exc)(
                f"an interrupted {description} left {path}; finishing it first failed: {exc.message}",
                hint=exc.hint or "run this command as the owner of that environment",
            ) from None
    for root in target.search_path:
        if jr.journal_leftovers(root):
            with locked([root]) as lease:
                done.extend(lease.recover())
    return done


def recover_interrupted(python: str | None, site_packages: str | None) -> list[Recovery]:
    """:func:`recover_target` for the target named by ``--python`` / ``--site-packages`` (the CLI's first step)."""
    return recover_target(resolve_target(python, site_packages))
