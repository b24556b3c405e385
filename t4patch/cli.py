"""Command-line entry point: parse, dispatch to one command module, map errors to exit codes.

Commands are listed here explicitly (see :mod:`t4patch.commands`). A :class:`~t4patch.errors.T4PatchError`
becomes one line on stderr and its exit code; any other exception is a bug in t4patch and says so. With
``--debug`` the traceback is shown too.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Sequence

from t4patch import __version__
from t4patch.environment import suggest
from t4patch.errors import T4PatchError
from t4patch.output import documents_written, emit_json

COMMANDS = (
    "doctor",
    "list",
    "status",
    "apply",
    "revert",
    "validate",
    "verify",
    "build",
    "port",
    "wheel",
)
INTERNAL_ERROR_EXIT = 70  # EX_SOFTWARE: a t4patch bug, not a user error


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="t4patch",
        description="Run today's LLM serving engines on NVIDIA Turing GPUs (Tesla T4, sm_75).",
    )
    parser.add_argument("--version", action="version", version=f"t4patch {__version__}")
    parser.add_argument("--debug", action="store_true", help="show a traceback on errors")
    parser.add_argument(
        "--patches",
        metavar="DIR",
        help="use the patch sets in DIR instead of the shipped ones (same as T4PATCH_PATCHES=DIR)",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        module = importlib.import_module(f"t4patch.commands.{name}")
        module.configure_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one t4patch command line; return its exit code."""
    try:
        return _run(argv)
    except KeyboardInterrupt:  # Ctrl-C before a command started (imports, parsing): one line, exit 130
        print("t4patch: interrupted", file=sys.stderr)
        return 130


def _run(argv: Sequence[str] | None) -> int:
    if argv is None:  # the console script or python -m t4patch: hints name this program, so they work when pasted
        suggest.set_program(suggest.program_for(sys.argv[0], sys.executable), COMMANDS)
    try:
        parser = build_parser()  # help texts quote shipped patch sets, so a broken tree is found here already
    except T4PatchError as exc:
        print(f"t4patch: error: {exc}", file=sys.stderr)
        return exc.exit_code
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if args.patches:
        os.environ["T4PATCH_PATCHES"] = args.patches
    written_before = documents_written()
    try:
        if hasattr(args, "python") and hasattr(args, "site_packages"):
            # Any command aimed at an environment first finishes a set a killed run left half committed there.
            from t4patch.patching.operation import recover_interrupted

            recover_interrupted(args.python, args.site_packages)
        return int(args.func(args))
    except T4PatchError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"t4patch {args.command}: error: {suggest.render(str(exc))}", file=sys.stderr)
        if getattr(args, "json", False) and documents_written() == written_before:
            # Scripts reading stdout get a document for failures too, not an empty stream (unless the command
            # already wrote its report, e.g. a verification that ran and failed).
            emit_json(
                args.command,
                {"error": {"type": type(exc).__name__, "exit_code": exc.exit_code,
                           "message": suggest.render(exc.message),
                           "hint": suggest.render(exc.hint) if exc.hint else None}},
            )
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"t4patch {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # noqa: BLE001 - everything else is a bug; say so plainly
        if args.debug:
            traceback.print_exc()
        print(
            f"t4patch {args.command}: internal error: {type(exc).__name__}: {exc} "
            "(this is a bug in t4patch; rerun with --debug and report the traceback)",
            file=sys.stderr,
        )
        return INTERNAL_ERROR_EXIT
