"""Land the hunks of one file's diff on another release of that file: exact, at an offset, by 3-way merge.

This is the core of `t4patch port`. Each hunk of the OLD release's diff is tried, in order, on the NEW
release's file, in four ways that never loosen what "matches" means:

1. **exact**: the hunk's old lines (context and removed) are at the stated line, byte for byte;
2. **offset**: the same old lines, byte for byte, at another line (the nearest one; reported, as ``patch``
   reports "Hunk #1 succeeded at 1000 (offset -21 lines)"); two equally near places are ambiguous and refused;
3. **upstream**: the old lines are nowhere but the hunk's new lines are: the NEW release already carries the
   change (an upstream fix landed), so the hunk is dropped with a note;
4. **merge**: a real 3-way merge (``git merge-file`` semantics) of OLD-before-hunk -> OLD-after-hunk onto the
   NEW file; clean only when the NEW release did not change the lines the hunk touches or their neighbours.

There is no fuzz: a context line that differs by one character is a mismatch, and a hunk none of these lands
is **failed**, reported with the NEW code around where it should go (and the merge's conflict), so a maintainer
can write it by hand.
"""

from __future__ import annotations

import difflib
import os
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field

from t4patch.errors import ToolMissingError
from t4patch.patching.unified_diff import FileDiff, Hunk, apply_file_diff, split_lines

Merge = Callable[[bytes, bytes, bytes], "MergeResult"]
CONTEXT_SHOWN = 4  # lines of NEW code shown on each side of a hunk that failed


@dataclass(frozen=True)
class MergeResult:
    clean: bool
    merged: bytes  # the merged text (with conflict markers when not clean)
    conflicts: int


@dataclass(frozen=True)
class HunkResult:
    """How one hunk of the OLD diff landed on the NEW file."""

    number: int  # 1-based within the file's diff
    stated_line: int  # the hunk's old start line, as the OLD diff states it
    method: str  # "exact" | "offset" | "upstream" | "merge" | "failed"
    offset: int = 0  # for "offset": lines from where the diff says (NEW file, after earlier hunks)
    new_line: int | None = None  # 1-based line of the NEW file (after earlier hunks) where it landed / was found
    note: str = ""
    around: tuple[str, ...] = ()  # for "failed": the NEW code where the hunk should go, numbered

    @property
    def landed(self) -> bool:
        return self.method in ("exact", "offset", "merge")

    def describe(self) -> str:
        if self.method == "exact":
            return f"hunk #{self.number}: exact at line {self.new_line}"
        if self.method == "offset":
            return f"hunk #{self.number}: exact context at line {self.new_line} (offset {self.offset:+d} lines)"
        if self.method == "merge":
            return f"hunk #{self.number}: 3-way merge, at line {self.new_line}"
        if self.method == "upstream":
            return f"hunk #{self.number}: already upstream ({self.note})"
        return f"hunk #{self.number}: FAILED ({self.note})"

    def to_json(self) -> dict[str, object]:
        return {
            "hunk": self.number,
            "stated_line": self.stated_line,
            "method": self.method,
            "offset": self.offset,
            "new_line": self.new_line,
            "note": self.note,
            "around": list(self.around),
        }


@dataclass(frozen=True)
class FilePort:
    """One file's diff ported: the NEW text before and after, and each hunk's outcome."""

    path: str
    before: bytes
    after: bytes
    hunks: tuple[HunkResult, ...] = field(default_factory=tuple)

    @property
    def all_upstream(self) -> bool:
        return bool(self.hunks) and all(h.method == "upstream" for h in self.hunks)

    @property
    def failed(self) -> tuple[HunkResult, ...]:
        return tuple(h for h in self.hunks if h.method == "failed")


def git_merge_file(ours: bytes, base: bytes, theirs: bytes) -> MergeResult:
    """``git merge-file -p ours base theirs`` on temp files: the merge git itself does for a rebase."""
    with tempfile.TemporaryDirectory(prefix="t4patch-merge-") as tmp:
        paths = []
        for name, data in (("new", ours), ("old", base), ("old-patched", theirs)):
            path = os.path.join(tmp, name)
            with open(path, "wb") as fh:
                fh.write(data)
            paths.append(path)
        try:
            proc = subprocess.run(
                ["git", "merge-file", "-p", "-L", "NEW", "-L", "OLD", "-L", "OLD patched", *paths],
                capture_output=True,
                check=False,
            )
        except FileNotFoundError:
            raise ToolMissingError(
                "t4patch port merges hunks with `git merge-file`: expected git on PATH, found none",
                hint="install git (apt-get install git), then rerun t4patch port",
            ) from None
    if proc.returncode < 0 or proc.returncode > 127:
        raise ToolMissingError(f"git merge-file failed: {proc.stderr.decode(errors='replace').strip()}")
    return MergeResult(proc.returncode == 0, proc.stdout, proc.returncode)


def _positions(lines: list[bytes], block: list[bytes], start: int) -> list[int]:
    if not block:
        return []
    first = block[0]
    n = len(block)
    return [i for i in range(start, len(lines) - n + 1) if lines[i] == first and lines[i:i + n] == block]


def _nearest(positions: list[int], target: int) -> int | None:
    """The position nearest ``target``; None when two are equally near (ambiguous)."""
    if not positions:
        return None
    ranked = sorted(positions, key=lambda p: (abs(p - target), p))
    if len(ranked) > 1 and abs(ranked[0] - target) == abs(ranked[1] - target):
        return None
    return ranked[0]


def _around(lines: list[bytes], index: int, length: int) -> tuple[str, ...]:
    lo = max(0, index - CONTEXT_SHOWN)
    hi = min(len(lines), index + max(length, 1) + CONTEXT_SHOWN)
    return tuple(f"{n + 1:6d}  {lines[n].decode('utf-8', 'replace').rstrip()}" for n in range(lo, hi))


def _conflict_excerpt(merged: bytes) -> tuple[str, ...]:
    lines = split_lines(merged)
    start = next((i for i, line in enumerate(lines) if line.startswith(b"<<<<<<< ")), None)
    if start is None:
        return ()
    end = next((i for i in range(start, len(lines)) if lines[i].startswith(b">>>>>>> ")), len(lines) - 1)
    return tuple("        " + lines[n].decode("utf-8", "replace").rstrip() for n in range(start, min(end + 1, start + 60)))


def _changed_span(before: list[bytes], after: list[bytes]) -> tuple[int, int]:
    """First and one-past-last line of ``after`` that differ from ``before``."""
    matcher = difflib.SequenceMatcher(a=before, b=after, autojunk=False)
    changed = [(j1, j2) for tag, _, _, j1, j2 in matcher.get_opcodes() if tag != "equal"]
    if not changed:
        return 0, 0
    return changed[0][0], max(j2 for _, j2 in changed)


def port_file_diff(diff: FileDiff, old_before: bytes, new_before: bytes, merge: Merge = git_merge_file) -> FilePort:
    """Land every hunk of ``diff`` (made against ``old_before``) on ``new_before``; see the module docstring."""
    cur = split_lines(new_before)
    delta = 0  # size change of the hunks landed so far (lines)
    last_offset = 0
    floor = 0  # hunks land in order and never overlap: nothing before this index
    results: list[HunkResult] = []
    for number, hunk in enumerate(diff.hunks, start=1):
        start, old, new = hunk.old_new(False)
        expected = (start - 1 if old else start) + delta
        prefix = FileDiff(diff.path, diff.hunks[: number - 1])
        base_text = apply_file_diff(old_before, prefix)  # OLD with this diff's earlier hunks: exact by construction
        # 1 and 2: the hunk's old lines, byte for byte, at the stated line or the nearest other one
        found = [expected] if old and cur[expected:expected + len(old)] == old and expected >= floor else []
        if not found and old:
            found = [p] if (p := _nearest(_positions(cur, old, floor), expected + last_offset)) is not None else []
        if not old and floor <= expected <= len(cur):
            found = [expected]
        if found:
            at = found[0]
            cur[at:at + len(old)] = new
            offset = at - expected
            last_offset = offset
            results.append(HunkResult(number, hunk.source_start, "exact" if offset == 0 else "offset", offset, at + 1))
            delta += len(new) - len(old)
            floor = at + len(new)
            continue
        # 3: already upstream: the new lines are there and the old ones are not
        if new and (p := _nearest(_positions(cur, new, floor), expected + last_offset)) is not None:
            results.append(HunkResult(number, hunk.source_start, "upstream", p - expected, p + 1,
                                      note=f"the NEW file already has the hunk's result at line {p + 1}"))
            floor = p + len(new)
            delta += len(new) - len(old)
            continue
        # 4: a real 3-way merge of OLD-before-hunk -> OLD-after-hunk onto the NEW file as it stands
        theirs = apply_file_diff(old_before, FileDiff(diff.path, diff.hunks[:number]))
        ours = b"".join(cur)
        merged = merge(ours, base_text, theirs)
        if merged.clean and merged.merged == ours:
            results.append(HunkResult(number, hunk.source_start, "upstream", 0, None,
                                      note="a 3-way merge finds the change already in the NEW file"))
            continue
        if merged.clean:
            after = split_lines(merged.merged)
            lo, hi = _changed_span(cur, after)
            if lo < floor:  # the merge changed lines an earlier hunk already placed: not a clean landing here
                results.append(HunkResult(number, hunk.source_start, "failed", 0, None,
                                          note="the 3-way merge touches lines of an earlier hunk",
                                          around=_around(cur, expected, len(old))))
                continue
            delta += len(after) - len(cur)
            cur = after
            floor = hi
            results.append(HunkResult(number, hunk.source_start, "merge", 0, lo + 1))
            continue
        note = (f"context not found (the NEW code differs where the hunk goes); "
                f"3-way merge: {merged.conflicts} conflict(s)")
        around = _around(cur, min(max(expected, 0), len(cur)), len(old))
        excerpt = _conflict_excerpt(merged.merged)
        results.append(HunkResult(number, hunk.source_start, "failed", 0, None, note=note,
                                  around=around + (("    merge conflict:",) + excerpt if excerpt else ())))
    return FilePort(diff.path, new_before, b"".join(cur), tuple(results))


def missing_file(diff: FileDiff, why: str) -> FilePort:
    """Every hunk of ``diff`` failed because the NEW release has no such file."""
    return FilePort(
        diff.path, b"", b"", tuple(HunkResult(n, h.source_start, "failed", note=why) for n, h in enumerate(diff.hunks, 1))
    )


__all__ = ["FilePort", "HunkResult", "Hunk", "MergeResult", "git_merge_file", "missing_file", "port_file_diff"]
