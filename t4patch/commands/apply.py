"""`t4patch apply SPEC...`: patch installed engines, all-or-nothing, idempotent."""

from __future__ import annotations

import argparse
import contextlib
from typing import Any, Literal

from t4patch.cli_options import add_json_option, add_target_options
from t4patch.environment.target import resolve_target
from t4patch.errors import UsageError
from t4patch.output import emit_json, say
from t4patch.patching.execute import environment_locks, execute
from t4patch.patching.plan import Plan, make_plan
from t4patch.patching.selection import select


def configure_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "apply",
        help="apply the patch set matching each installed engine",
        description="Apply the patch set for the installed version of each ENGINE. Every file is checked by "
        "sha256 first; if any file is foreign, nothing is written.",
    )
    parser.add_argument("specs", nargs="+", metavar="SPEC", help="engine, optionally pinned: vllm or vllm==0.33.0")
    parser.add_argument("--dry-run", action="store_true", help="print the unified diff it would make; write nothing")
    add_target_options(parser)
    add_json_option(parser)
    parser.set_defaults(func=run)
    return parser


def describe_plan(plan: Plan, dry_run: bool) -> dict[str, Any]:
    return {
        "patch_set": plan.patch_set.spec,
        "operation": plan.operation,
        "site_packages": str(plan.distribution.root),
        "already_done": plan.is_noop,
        "dry_run": dry_run,
        "files": [
            {
                "path": s.target.path,
                "state_before": s.state,
                "action": "write" if any(c.status is s for c in plan.changes) else "none",
            }
            for s in plan.statuses
        ],
        **({"diff": "".join(c.unified_diff(plan.operation) for c in plan.changes)} if dry_run else {}),
    }


def run_operation(args: argparse.Namespace, operation: Literal["apply", "revert"]) -> int:
    """Shared body of apply and revert: select every spec, plan all under the lock, then write."""
    target = resolve_target(args.python, args.site_packages)
    selections = [select(spec, target) for spec in args.specs]
    names = [s.distribution.name for s in selections]
    if len(set(names)) != len(names):
        raise UsageError(f"an engine is named twice: {', '.join(args.specs)}")
    # A dry run only reads: it takes no lock and writes nothing into the target.
    lock = contextlib.nullcontext() if args.dry_run else environment_locks([s.distribution.root for s in selections])
    with lock:
        plans = [make_plan(s.patch_set, s.distribution, operation) for s in selections]
        if not args.dry_run:
            execute(plans)
        results = [describe_plan(plan, args.dry_run) for plan in plans]
    if args.json:
        emit_json(operation, {"target": target.to_json(), "results": results})
        return 0
    for plan, result in zip(plans, results):
        spec = plan.patch_set.spec
        if plan.is_noop:
            say(f"{spec}: already {'applied' if operation == 'apply' else 'pristine'}, nothing to do")
        elif args.dry_run:
            say(f"{spec}: would {operation} {len(plan.changes)} file(s) in {plan.distribution.root} (dry run)")
            say(result["diff"].rstrip("\n"))
        else:
            verb = "applied" if operation == "apply" else "reverted"
            say(f"{spec}: {verb}, {len(plan.changes)} file(s) written in {plan.distribution.root}")
    return 0


def run(args: argparse.Namespace) -> int:
    return run_operation(args, "apply")
