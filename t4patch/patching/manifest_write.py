"""Write a patch-set manifest (``manifest.toml``) that a maintainer can review line by line.

`t4patch port` writes draft sets; the text is laid out like the hand-written manifests (one key a line, long
prose wrapped with TOML's line-ending backslash, which joins the lines back without the breaks) so a review
diff against the OLD set's manifest shows only what changed. The emitted text is parsed back with tomllib
and compared with the document it was made from; the strict manifest loader checks the rest when the set is
loaded. (Writing is not parsing: t4patch never parses TOML itself.)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from t4patch.data.tomlcompat import tomllib

WIDTH = 104  # prose is wrapped to about this many characters per line


def _basic(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)  # JSON string escapes are TOML basic-string escapes


def _escape_ml(segment: str) -> str:
    out = []
    for ch in segment:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return "".join(out)


def _wrapped(text: str) -> str:
    """A multi-line basic string whose line-ending backslashes join the pieces back into ``text`` exactly.

    Each piece but the last ends with one space and the next starts with a non-space: a line-ending backslash
    drops the line break and the next line's leading whitespace, and keeps everything before it."""
    pieces: list[str] = []
    current = ""
    for word in text.split(" "):
        if current and word and len(current) + len(word) > WIDTH and current.endswith(" ") \
                and not current.endswith("  "):
            pieces.append(current)
            current = ""
        current += word + " "
    pieces.append(current[:-1])
    return '"""\\\n' + "\\\n".join(_escape_ml(p) for p in pieces) + '"""'


def toml_string(text: str) -> str:
    """``text`` as a TOML string: a plain basic string, or a wrapped multi-line one for long prose."""
    if len(text) <= WIDTH + 16 or "\n" in text or " " not in text:  # one-liners (titles, paths) stay one line
        return _basic(text)
    candidate = _wrapped(text)
    try:
        if tomllib.loads(f"x = {candidate}\n")["x"] == text:
            return candidate
    except tomllib.TOMLDecodeError:
        pass
    return _basic(text)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, (list, tuple)):
        items = [_value(v) for v in value]
        one_line = "[" + ", ".join(items) + "]"
        if len(one_line) <= WIDTH - 20:
            return one_line
        return "[\n" + "".join(f"  {item},\n" for item in items) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as TOML here")


def _table(lines: list[str], table: dict[str, Any]) -> None:
    for key, value in table.items():
        if value is None or isinstance(value, dict):
            continue
        lines.append(f"{key} = {_value(value)}")


def render_manifest(doc: dict[str, Any], header: Sequence[str] = ()) -> str:
    """The manifest text for ``doc`` (the dict the strict reader would return), with ``header`` comments."""
    lines = [f"# {h}" if h else "#" for h in header]
    _table(lines, {k: v for k, v in doc.items() if k not in ("requires", "patch", "target")})
    for name in ("requires", "patch", "target"):
        for entry in doc.get(name, []):
            lines.append("")
            lines.append(f"[[{name}]]")
            _table(lines, entry)
            for sub, value in entry.items():
                if isinstance(value, dict):
                    lines.append(f"[{name}.{sub}]")
                    _table(lines, value)
    text = "\n".join(lines) + "\n"
    if tomllib.loads(text) != _plain(doc):
        raise AssertionError("the manifest text does not parse back to its document (a t4patch bug)")
    return text


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
