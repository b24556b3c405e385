"""Suggested commands that work when pasted: the t4patch the user ran, the user's targeting options, quoted.

A hint such as ``t4patch apply vllm==0.33.0`` after ``t4patch status --check --site-packages DIR`` targets
the wrong environment when pasted (the default one) and fails. :func:`command` renders a t4patch command for
the environment the user named (``--python EXE`` / ``--site-packages DIR``, as resolved), quoted with
:func:`shlex.join` so paths with spaces or shell characters survive the paste.

The command word is the other half. The docs install t4patch in its own venv and run it as
``~/t4patch-venv/bin/t4patch`` without activating that venv, so a bare ``t4patch`` in a hint is "command not
found" (exit 127) when pasted. Hints are written with the plain word ``t4patch`` everywhere (messages stay
readable, and tests that call :func:`t4patch.cli.main` in-process see them as written); the printers
(:mod:`t4patch.output` and the CLI's error printer) pass every line through :func:`render`, the one place that
replaces the word, at a command position, by the program this process was started as (:func:`set_program`, called
once by the console entry point): the absolute path of the console script, ``~/...`` under ``$HOME``, or
``<python> -m t4patch`` for ``python -m t4patch``.

A hint that needs something only the user knows (the serving environment's interpreter) says so with the
placeholder :data:`PYTHON_PLACEHOLDER`: that is a manual step (fill in the path), not a command to paste as is.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # output.py renders through this module: keep it free of imports that could loop back
    from t4patch.environment.target import TargetEnvironment

PROGRAM = "t4patch"  # the command word hints are written with
PYTHON_PLACEHOLDER = "/path/to/venv/bin/python"  # in a hint: the user fills in the serving interpreter's path
_program = PROGRAM  # what render() puts in its place; "t4patch" until set_program() says how we were run
_pattern: re.Pattern[str] | None = None


def targeting(target: TargetEnvironment | None) -> list[str]:
    """The options that name ``target`` on a command line ([] for the running interpreter)."""
    return list(target.options) if target is not None else []


def command(target: TargetEnvironment | None, *argv: str) -> str:
    """``t4patch ARGV... [--python EXE | --site-packages DIR]``, shell-quoted, ready to paste (after
    :func:`render`)."""
    return shlex.join([PROGRAM, *argv, *targeting(target)])


def options_text(target: TargetEnvironment | None) -> str:
    """The targeting options alone, shell-quoted ("" for the running interpreter), for prose hints."""
    return shlex.join(targeting(target))


def _home_relative(path: str) -> str:
    """``path`` for a shell: ``~/rest`` when it is under $HOME and ``rest`` needs no quoting (so the tilde
    still expands), else the quoted absolute path."""
    home = os.environ.get("HOME", "")
    if home and home != "/" and path.startswith(home.rstrip("/") + "/"):
        rest = path[len(home.rstrip("/")) + 1:]
        if rest and shlex.quote(rest) == rest:
            return f"~/{rest}"
    return shlex.quote(path)


def program_for(argv0: str, executable: str) -> str:
    """How to run this t4patch again from any shell, given ``sys.argv[0]`` and ``sys.executable``.

    ``python -m t4patch`` (argv[0] is the package's ``__main__.py``) becomes ``<that python> -m t4patch``;
    a console script becomes its absolute path; anything else (an embedding, an empty argv) stays ``t4patch``.
    """
    name = os.path.basename(argv0)
    if name == "__main__.py" and os.path.basename(os.path.dirname(argv0)) == "t4patch":
        return f"{_home_relative(os.path.abspath(executable))} -m t4patch" if executable else PROGRAM
    if name.startswith(PROGRAM) and (os.sep in argv0 or os.path.isfile(argv0)):
        return _home_relative(os.path.abspath(argv0))
    return PROGRAM


def set_program(program: str, subcommands: Iterable[str]) -> None:
    """Make :func:`render` write ``program`` for the command word before any of ``subcommands``."""
    global _program, _pattern
    _program = program
    words = "|".join(sorted((re.escape(s) for s in subcommands), key=len, reverse=True))
    # a command position: the start, after whitespace, an opening bracket or quote, or a shell separator; never
    # inside a path (/t4patch), a name (t4patch-venv) or after "-m " (python -m t4patch is already whole)
    _pattern = re.compile(rf"(?<![\w./~-])(?<!-m ){PROGRAM}(?= (?:{words})\b)") if words else None


def program() -> str:
    """The command word as the user should type it (``t4patch`` until :func:`set_program`)."""
    return _program


def render(text: str) -> str:
    """``text`` with every ``t4patch SUBCOMMAND`` at a command position naming the t4patch the user ran."""
    if _pattern is None or _program == PROGRAM:
        return text
    return _pattern.sub(lambda _m: _program, text)


def reset_program() -> None:
    """Back to the plain word (tests)."""
    global _program, _pattern
    _program, _pattern = PROGRAM, None


def not_installed(name: str, target: TargetEnvironment, release: str | None, *argv: str) -> str:
    """The hint for ``name`` missing from ``target``: never an install of the engine with its dependencies (an
    engine's own pins, e.g. another torch, would replace what the environment holds, and t4patch's own venv is
    not where an engine belongs). Most often the command looked in the wrong environment, so: see what is there,
    or rerun against the serving interpreter (a manual step: fill in the path); else install the engine as its
    documentation says, then apply. ``argv``: the command to rerun (default ``apply RELEASE``)."""
    spec = release or name
    again = shlex.join([PROGRAM, *(argv or ("apply", spec))])
    own = "" if target.options else f" (t4patch looked in its own environment, {sys.executable})"
    return (f"see what is installed there: {command(target, 'status')}; if {name} is in another environment"
            f"{own}, name its interpreter (a manual step: fill in the path): {again} --python {PYTHON_PLACEHOLDER}; "
            f"if it is not installed yet, install {spec} as its docs say (t4patch installs no engine), then: "
            f"{command(target, 'apply', spec)}")
