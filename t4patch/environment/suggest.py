"""Suggested commands that work when pasted: every hint carries the user's targeting options, shell-quoted.

A hint such as ``t4patch apply vllm==0.33.0`` after ``t4patch status --check --site-packages DIR`` targets
the wrong environment when pasted (the default one) and fails. :func:`command` renders a t4patch command for
the environment the user named (``--python EXE`` / ``--site-packages DIR``, as resolved), quoted with
:func:`shlex.join` so paths with spaces or shell characters survive the paste.
"""

from __future__ import annotations

import shlex

from t4patch.environment.target import TargetEnvironment


def targeting(target: TargetEnvironment | None) -> list[str]:
    """The options that name ``target`` on a command line ([] for the running interpreter)."""
    return list(target.options) if target is not None else []


def command(target: TargetEnvironment | None, *argv: str) -> str:
    """``t4patch ARGV... [--python EXE | --site-packages DIR]``, shell-quoted, ready to paste."""
    return shlex.join(["t4patch", *argv, *targeting(target)])


def options_text(target: TargetEnvironment | None) -> str:
    """The targeting options alone, shell-quoted ("" for the running interpreter), for prose hints."""
    return shlex.join(targeting(target))
