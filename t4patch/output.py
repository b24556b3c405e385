"""How commands talk to the user: aligned text tables for people, versioned JSON for programs.

Every `--json` document carries ``"schema": JSON_SCHEMA`` and the command name, so scripts can refuse a
format they do not understand instead of misreading it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any, TextIO

from t4patch.environment.suggest import render

JSON_SCHEMA = 1
_documents_written = 0  # how many JSON documents this process wrote (the CLI adds an error one only if none)


def documents_written() -> int:
    return _documents_written


def emit_json(command: str, payload: dict[str, Any], stream: TextIO | None = None) -> None:
    """Write one JSON document for ``command`` to stdout (or ``stream``)."""
    global _documents_written
    _documents_written += 1
    doc = {"schema": JSON_SCHEMA, "command": command, **payload}
    out = stream or sys.stdout
    json.dump(doc, out, indent=2, sort_keys=False, default=str)
    out.write("\n")


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Render rows as a left-aligned text table with a header line; cells are str()-ed."""
    str_rows = [[("" if c is None else str(c)) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in str_rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    lines = ["  ".join(h.ljust(widths[i]) for i, h in enumerate(headers)).rstrip()]
    for row in str_rows:
        lines.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
    return "\n".join(lines)


def say(text: str = "") -> None:
    """Print human output (stdout); kept in one place so tests can capture it uniformly, and so every
    suggested command names the t4patch the user ran (:func:`t4patch.environment.suggest.render`)."""
    print(render(text))


def warn(text: str) -> None:
    """Print a warning line to stderr."""
    print(f"warning: {render(text)}", file=sys.stderr)


def note(text: str) -> None:
    """Print a line about something t4patch did on its own (e.g. finishing an interrupted commit) to stderr."""
    print(f"t4patch: {render(text)}", file=sys.stderr, flush=True)  # flushed: a held SIGTERM may follow at once
