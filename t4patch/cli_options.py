"""Options shared by every command that reads or changes an environment, so they are spelled one way.

doctor, status, apply, revert and verify all accept ``--python EXE`` / ``--site-packages DIR`` and ``--json``.
"""

from __future__ import annotations

import argparse


def add_target_options(parser: argparse.ArgumentParser) -> None:
    """Add ``--python`` / ``--site-packages`` (mutually exclusive) to ``parser``."""
    group = parser.add_argument_group("target environment (default: this interpreter)")
    exclusive = group.add_mutually_exclusive_group()
    exclusive.add_argument(
        "--python",
        metavar="EXE",
        help="act on the environment of this Python interpreter (e.g. the serving venv's bin/python)",
    )
    exclusive.add_argument(
        "--site-packages",
        metavar="DIR",
        help="act on this site-packages directory (e.g. a `pip install --target` tree)",
    )


def add_json_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--json``: one machine-readable document on stdout instead of text."""
    parser.add_argument("--json", action="store_true", help="print one JSON document (schema 1)")
