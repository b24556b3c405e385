"""Parse unified diffs (with ``unidiff``) and apply them *exactly*.

Exactly means: every hunk must match the file at the line numbers the diff states, context and removed
lines byte for byte. No fuzz, no offset search, no whitespace leniency. A patch tool that "finds" a hunk 20
lines away or ignores a changed context line produces a file nobody reviewed; t4patch instead refuses, and the
pinned sha256 of the result is checked on top. Reverting is the same operation with the diff turned around.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import unidiff
from unidiff.constants import LINE_TYPE_NO_NEWLINE

_LINE = re.compile(rb"[^\n]*\n|[^\n]+\Z")
_HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_FILE_HEADERS = ("--- ", "+++ ", "diff ", "index ")


@dataclass(frozen=True)
class Hunk:
    source_start: int
    source_length: int
    target_start: int
    target_length: int
    lines: tuple[tuple[str, bytes], ...]  # (" " | "-" | "+", line bytes with their newline, if any)

    def old_new(self, reverse: bool) -> tuple[int, list[bytes], list[bytes]]:
        """Start line (1-based) and the old/new line lists for applying forward or in reverse."""
        old = [text for tag, text in self.lines if tag in (" ", "-")]
        new = [text for tag, text in self.lines if tag in (" ", "+")]
        if reverse:
            return self.target_start, new, old
        return self.source_start, old, new


@dataclass(frozen=True)
class FileDiff:
    path: str  # relative path, without the a/ b/ prefixes
    hunks: tuple[Hunk, ...]


class DiffMismatch(Exception):
    """The file does not contain what a hunk expects at the stated position."""


def _strip_prefix(name: str, prefix: str) -> str:
    return name[len(prefix):] if name.startswith(prefix) else name


def check_structure(text: str) -> None:
    """Refuse text that is not only a unified diff: every line must be a file header, a hunk header, or one
    of the lines a hunk's header counts (blank lines between files are allowed).

    ``unidiff`` skips lines it does not recognise, so a diff with megabytes of junk after its last hunk (or a
    stray line between hunks) would otherwise load as if it were clean.
    """
    lines = text.split("\n")  # not splitlines(): a \r or \f inside a line of code is part of that line
    if lines and lines[-1] == "":
        lines.pop()
    i = 0
    while i < len(lines):
        line = lines[i]
        header = _HUNK_HEADER.match(line)
        if header is None:
            if not (line.startswith(_FILE_HEADERS) or not line.strip()):
                raise ValueError(f"not a unified diff: line {i + 1} is neither a header nor in a hunk: {line[:60]!r}")
            i += 1
            continue
        old = 1 if header[2] is None else int(header[2])
        new = 1 if header[4] is None else int(header[4])
        start = i + 1
        i += 1
        while old > 0 or new > 0:
            if i >= len(lines):
                raise ValueError(f"not a unified diff: the hunk at line {start} ends {old} old / {new} new line(s) early")
            body = lines[i]
            tag = body[:1]
            if tag == " " or body == "":
                old, new = old - 1, new - 1
            elif tag == "-":
                old -= 1
            elif tag == "+":
                new -= 1
            elif tag != "\\":
                raise ValueError(f"not a unified diff: line {i + 1}, inside the hunk at line {start}, is {body[:60]!r}")
            i += 1
        if old < 0 or new < 0:
            raise ValueError(f"not a unified diff: the hunk at line {start} has more lines than its header counts")
        if i < len(lines) and lines[i].startswith("\\"):
            i += 1  # "\ No newline at end of file" after the hunk's last line


def parse_diff(text: str) -> list[FileDiff]:
    """Parse ``text`` into per-file hunks; refuse anything but plain modifications of existing files."""
    check_structure(text)
    try:
        patch = unidiff.PatchSet(text)
    except unidiff.UnidiffParseError as exc:
        raise ValueError(f"not a unified diff ({exc})") from None
    if not patch:
        raise ValueError("contains no file changes")
    result: list[FileDiff] = []
    for pf in patch:
        if pf.is_added_file or pf.is_removed_file or pf.is_binary_file or getattr(pf, "is_rename", False):
            raise ValueError(f"{pf.path}: only modifications of existing text files are allowed")
        source = _strip_prefix(pf.source_file, "a/")
        target = _strip_prefix(pf.target_file, "b/")
        if source != target:
            raise ValueError(f"source {pf.source_file!r} and target {pf.target_file!r} name different files")
        hunks: list[Hunk] = []
        for h in pf:
            lines: list[tuple[str, bytes]] = []
            for line in h:
                if line.line_type == LINE_TYPE_NO_NEWLINE:
                    if not lines:
                        raise ValueError(f"{target}: '\\ No newline at end of file' with no line before it")
                    tag, previous = lines[-1]
                    lines[-1] = (tag, previous.rstrip(b"\n"))
                    continue
                if line.line_type not in (" ", "-", "+"):
                    raise ValueError(f"{target}: unexpected diff line type {line.line_type!r}")
                lines.append((line.line_type, line.value.encode("utf-8")))
            hunks.append(Hunk(h.source_start, h.source_length, h.target_start, h.target_length, tuple(lines)))
        if not hunks:
            raise ValueError(f"{target}: no hunks")
        result.append(FileDiff(target, tuple(hunks)))
    return result


def split_lines(data: bytes) -> list[bytes]:
    """Split on ``\\n`` only (keeping it), so ``\\r`` and other separators stay inside their line."""
    return _LINE.findall(data)


def apply_file_diff(data: bytes, diff: FileDiff, *, reverse: bool = False) -> bytes:
    """Apply ``diff`` to ``data`` at exactly the stated lines; raise :class:`DiffMismatch` otherwise."""
    lines = split_lines(data)
    out: list[bytes] = []
    cursor = 0
    for hunk in diff.hunks:
        start, old, new = hunk.old_new(reverse)
        index = start - 1 if old else start  # a pure insertion's start names the line it follows
        if index < cursor:
            raise DiffMismatch(f"{diff.path}: hunks overlap or are out of order at line {start}")
        found = lines[index:index + len(old)]
        if found != old:
            first_bad = next((i for i, (a, b) in enumerate(zip(found, old)) if a != b), min(len(found), len(old)))
            raise DiffMismatch(
                f"{diff.path}: line {index + first_bad + 1} does not match the diff "
                f"(expected {old[first_bad] if first_bad < len(old) else b'<end of file>'!r}, "
                f"found {found[first_bad] if first_bad < len(found) else b'<end of file>'!r})"
            )
        out.extend(lines[cursor:index])
        out.extend(new)
        cursor = index + len(old)
    out.extend(lines[cursor:])
    return b"".join(out)
