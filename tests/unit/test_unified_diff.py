"""Exact diff application: no fuzz, no offsets, byte-exact, reversible."""

from __future__ import annotations

import pytest

from t4patch.patching.unified_diff import DiffMismatch, apply_file_diff, parse_diff, split_lines
from tests.helpers import unified

OLD = "".join(f"line {i}\n" for i in range(1, 21))
NEW = OLD.replace("line 5\n", "line five\n").replace("line 15\n", "line 15\nextra\n")


def test_forward_and_reverse_are_exact():
    (diff,) = parse_diff(unified("pkg/f.py", OLD, NEW))
    assert len(diff.hunks) == 2
    assert apply_file_diff(OLD.encode(), diff) == NEW.encode()
    assert apply_file_diff(NEW.encode(), diff, reverse=True) == OLD.encode()


def test_no_offset_search():
    (diff,) = parse_diff(unified("pkg/f.py", OLD, NEW))
    shifted = ("header\n" + OLD).encode()  # GNU patch would apply this at offset 1; t4patch must not
    with pytest.raises(DiffMismatch, match="line"):
        apply_file_diff(shifted, diff)


def test_changed_context_is_refused():
    (diff,) = parse_diff(unified("pkg/f.py", OLD, NEW))
    with pytest.raises(DiffMismatch, match="line 4 does not match"):
        apply_file_diff(OLD.replace("line 4\n", "line 4 \n").encode(), diff)


def test_carriage_returns_stay_inside_lines():
    assert split_lines(b"a\r\nb\rc\nd") == [b"a\r\n", b"b\rc\n", b"d"]


def test_no_newline_at_end_of_file():
    old, new = "a\nb\nc", "a\nB\nc"
    text = "--- a/p/f\n+++ b/p/f\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n\\ No newline at end of file\n"
    (diff,) = parse_diff(text)
    assert apply_file_diff(old.encode(), diff) == new.encode()
    assert apply_file_diff(new.encode(), diff, reverse=True) == old.encode()


def test_pure_insertion_at_start():
    (diff,) = parse_diff(unified("p/f", "b\nc\n", "a\nb\nc\n"))
    assert apply_file_diff(b"b\nc\n", diff) == b"a\nb\nc\n"
    assert apply_file_diff(b"a\nb\nc\n", diff, reverse=True) == b"b\nc\n"


def test_mismatched_names_refused():
    with pytest.raises(ValueError, match="different files|only modifications"):
        parse_diff("--- a/p/x\n+++ b/p/y\n@@ -1 +1 @@\n-a\n+b\n")
