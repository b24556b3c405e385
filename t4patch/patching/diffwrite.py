"""Write a unified diff of one file (``--- a/<path>`` / ``+++ b/<path>``) that t4patch's exact apply accepts.

`t4patch port` regenerates every diff against the NEW release's files, so the shipped diff states the NEW
line numbers and applies exactly there (``apply`` never searches). Every diff written here is read back with
:func:`t4patch.patching.unified_diff.parse_diff` and applied to ``before``; anything but ``after`` is a bug
and raises, so a diff that would not reproduce the reviewed bytes is never written.
"""

from __future__ import annotations

import difflib

from t4patch.patching.unified_diff import apply_file_diff, parse_diff, split_lines

CONTEXT = 3  # lines of context, as `diff -u`


def _emit(line: bytes, tag: str) -> str:
    text = line.decode("utf-8")
    if text.endswith("\n"):
        return tag + text
    return tag + text + "\n\\ No newline at end of file\n"


def unified_diff(path: str, before: bytes, after: bytes, context: int = CONTEXT) -> str:
    """The unified diff turning ``before`` into ``after`` (empty when they are equal)."""
    if before == after:
        return ""
    a, b = split_lines(before), split_lines(after)
    out = [f"--- a/{path}\n", f"+++ b/{path}\n"]
    matcher = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    for group in matcher.get_grouped_opcodes(context):
        i1, i2, j1, j2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
        old_start = i1 + 1 if i2 > i1 else i1
        new_start = j1 + 1 if j2 > j1 else j1
        out.append(f"@@ -{old_start},{i2 - i1} +{new_start},{j2 - j1} @@\n")
        for tag, k1, k2, l1, l2 in group:
            if tag == "equal":
                out.extend(_emit(line, " ") for line in a[k1:k2])
                continue
            out.extend(_emit(line, "-") for line in a[k1:k2])
            out.extend(_emit(line, "+") for line in b[l1:l2])
    text = "".join(out)
    (parsed,) = parse_diff(text)
    if apply_file_diff(before, parsed) != after or apply_file_diff(after, parsed, reverse=True) != before:
        raise AssertionError(f"{path}: the generated diff does not reproduce the file (a t4patch bug)")
    return text
