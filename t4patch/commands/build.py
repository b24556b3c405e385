"""`t4patch build RECIPE`: build an engine (llama.cpp, mistral.rs) or a torch extension for one GPU architecture.

Order of work: load the recipe, plan, preflight (every failed check on its own line, then one
ToolMissingError), then either print the plan (``--dry-run``) or run it with progress, a full log, the
artifact architecture check and a build record. The targets are the shipped recipes (``recipes/``).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from t4patch.cli_options import add_json_option
from t4patch.output import emit_json, say

DESCRIPTION = """\
Build llama.cpp or mistral.rs for one NVIDIA architecture (default: sm_75, Tesla T4) with real machine
code, check the artifacts for that architecture, and write build-record.json next to the log.
Without --source the recipe's pinned ref is cloned into OUT/src (--ref picks another).
A torch-extension recipe (the Marlin sm_75 library) is built from its pinned source archive
(--source ARCHIVE_OR_TREE, else the recipe's environment variable, else ~/.cache/t4patch/sdists/) as
PTX only, into the t4patch cache (~/.cache/t4patch/extensions/), where the code that loads it finds it."""


def configure_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("build", help="build llama.cpp / mistral.rs / a torch extension for sm_75 and check "
                                   "the result", description=DESCRIPTION,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    # The recipe name is checked when the command runs (load_recipe lists the shipped ones), so broken or missing
    # recipe data is a one-line error of `build` itself, not of every command's parser.
    parser.add_argument("engine", metavar="RECIPE", help="what to build: one of the recipes shipped in recipes/ "
                        "(llama.cpp, mistral.rs, and the torch extensions; a wrong name lists them)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--ref", metavar="REF", help="tag, branch or commit to clone (default: the recipe's pinned ref)")
    source.add_argument("--source", metavar="DIR", type=Path, help="build this existing source tree instead of cloning "
                        "(a torch extension: its source archive or the unpacked tree)")
    parser.add_argument("--repo", metavar="URL", help="clone from this URL (a mirror) instead of the recipe's repository")
    parser.add_argument("--arch", default="75", help="architecture: 75 (default, Tesla T4), sm_75 or 7.5, one of the "
                        "GPU table's; 'cpu' for a CPU-only llama.cpp")
    parser.add_argument("--feature", action="append", default=[], metavar="NAME",
                        help="extra cargo feature (mistral.rs: cudnn; flash-attn for --arch 80 or newer)")
    parser.add_argument("--jobs", "-j", type=int, metavar="N", help="parallel compile jobs (default: all CPUs)")
    parser.add_argument("--out", metavar="DIR", type=Path,
                        help="output directory (default: ./t4patch-build/<engine>-sm<arch>)")
    parser.add_argument("--with-tests", action="store_true",
                        help="also build the engine's own test suite (llama.cpp: test-backend-ops, for t4patch verify llama.cpp)")
    parser.add_argument("--ptx-only", action="store_true",
                        help="PTX for the architecture only (CMake NN-virtual): a newer GPU then runs the Turing code "
                        "through JIT; the build record says so")
    parser.add_argument("--dry-run", action="store_true", help="print the exact commands and environment; run nothing")
    add_json_option(parser)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from t4patch.builder.plan import plan_build
    from t4patch.builder.preflight import check_json, enforce, find_nvcc, run_preflight
    from t4patch.builder.preflight import line as preflight_line
    from t4patch.builder.recipe import load_recipe
    from t4patch.builder.runner import StatusPrinter, format_seconds

    recipe = load_recipe(args.engine)
    nvcc = find_nvcc()
    toolchain = None
    if recipe.extension is not None:
        from t4patch.builder.extension_build import toolchain_for

        toolchain = toolchain_for(recipe)
    plan = plan_build(recipe, arch=args.arch, jobs=args.jobs, out=args.out, ref=args.ref, source_dir=args.source,
                      repository=args.repo, features=tuple(args.feature), nvcc=nvcc,
                      with_tests=args.with_tests, ptx_only=args.ptx_only, toolchain=toolchain)
    command_line = _command_line(args)
    if plan.source.mode == "reuse":
        from t4patch.builder.source import check_reused_clone

        assert plan.source.repository is not None
        check_reused_clone(plan.source.path, plan.source.repository, plan.out)  # before a dry run shows the plan
    checks = run_preflight(plan)
    if args.dry_run:
        if args.json:
            emit_json("build", {"dry_run": True, "plan": plan.to_dict(),
                                "preflight": [check_json(c) for c in checks],
                                "preflight_ok": all(c.ok for c in checks)})
        else:
            say(plan.render())
            say("preflight:")
            for check in checks:
                say("  " + preflight_line(check))
        enforce(checks, command=command_line)  # a dry run still fails when the build could not run
        return 0

    stream = sys.stderr
    for check in checks:
        if not check.ok or not args.json:
            stream.write("preflight " + preflight_line(check) + "\n")
    enforce(checks, command=command_line)

    from t4patch.builder.pipeline import execute

    _sigterm_as_interrupt()
    record, report = execute(plan, checks, printer=StatusPrinter(stream), command_line=command_line)
    if args.json:
        emit_json("build", {"dry_run": False, "record_path": str(plan.record_path), "record": record})
        return 0
    from t4patch.verify.artifacts.check import render_report

    source = record["source"] or {}
    say(f"built {recipe.name} for {'the CPU' if plan.arch is None else plan.arch.name} in "
        f"{format_seconds(record['durations']['total'])}")
    if source.get("kind") == "sdist":
        say(f"source  {source.get('path')} ({source.get('pinned_files')} pinned files, each sha256-checked)")
    else:
        say(f"source  {source.get('commit') or 'tree sha256 ' + str(source.get('tree_sha256'))}"
            + (" (verified against --ref " + str(source.get('requested_ref')) + ")" if source.get("ref_verified") else ""))
    if report is not None:
        say(render_report(report))
    else:
        for art in record["artifacts"]:
            say(f"artifact {art['path']}  sha256 {art['sha256']}")
    library = (record.get("extension") or {}).get("library") or {}
    if library.get("path"):
        say(f"library {library['path']}")
    say(f"log     {plan.log_path}")
    say(f"record  {plan.record_path}")
    return 0


def _sigterm_as_interrupt() -> None:
    """Treat SIGTERM (a CI timeout, `kill`) like Ctrl-C: stop the compiler, write the record, exit 130."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return

    def handler(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def _command_line(args: argparse.Namespace) -> str:
    """The command as the user would retype it (for the log header and 'rerun' hints)."""
    parts = ["t4patch", "build", args.engine]
    for flag, value in (("--ref", args.ref), ("--source", args.source), ("--repo", args.repo),
                        ("--jobs", args.jobs), ("--out", args.out)):
        if value is not None:
            parts += [flag, str(value)]
    if args.arch != "75":
        parts += ["--arch", args.arch]
    for feature in args.feature:
        parts += ["--feature", feature]
    for flag in ("with_tests", "ptx_only"):
        if getattr(args, flag, False):
            parts.append("--" + flag.replace("_", "-"))
    if getattr(args, "dry_run", False):
        parts.append("--dry-run")
    if getattr(args, "json", False):
        parts.append("--json")
    return shlex.join(parts)
