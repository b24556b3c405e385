"""`t4patch verify attention|marlin|build`: checks of what was patched or built, usable as CI gates."""

from __future__ import annotations

import argparse
import importlib

SUBCOMMANDS = ("verify_attention", "verify_marlin", "verify_build", "verify_llama_cpp")


def configure_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("verify", help="verify kernels and build artifacts for sm_75")
    nested = parser.add_subparsers(dest="verify_command", metavar="WHAT", required=True)
    for name in SUBCOMMANDS:
        importlib.import_module(f"t4patch.commands.{name}").configure_parser(nested)
    return parser
