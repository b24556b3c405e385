"""The one strict reader for t4patch's TOML data files (manifests, recipes, verification tables).

Why one reader: a data file that silently accepts a misspelt key is worse than no data file, because the
misspelling is read as "not set" and the default wins (``referencs`` drops a patch's references, a misspelt
limit turns a misfit into a pass). Every loader states its file's shape once, as a :class:`Table` of
:class:`Key` specs, and this module refuses, before any semantic check runs:

- an unknown key, naming the file, the key path (``patch[2].referencs``) and the keys allowed there;
- a wrong type, with the type expected and the type (and value) found;
- a missing required key.

Key paths: ``a.b`` for nested tables, ``patch[2]`` for the 2nd table of an array of tables (1-based, in the
order they appear in the file, matching ``0002-...diff`` for patch sets), ``arch.sm_75`` for entries of a
table keyed by name. Semantic checks (hash format, numbering, ranges) stay in each loader, which raises
through the same :class:`DataKind` so every message of one file kind has one shape and one error class.

Parsing is tomllib / tomli (:mod:`t4patch.data.tomlcompat`); this module never parses TOML itself.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from t4patch.data.tomlcompat import tomllib
from t4patch.errors import T4PatchError


@dataclass(frozen=True)
class DataKind:
    """One kind of data file: what it is called in messages, which error it raises, and what to do next."""

    label: str  # "patch-set manifest", "build recipe", ...
    error: type[T4PatchError]
    hint: str | None = None  # None: a file shipped with t4patch, so the fix is to put t4patch's own files back

    def fail(self, path: Path | str | None, problem: str) -> T4PatchError:
        where = f" {path}" if path is not None else ""
        return self.error(f"invalid {self.label}{where}: {problem}", hint=self.hint or _shipped_data_hint())


def _shipped_data_hint() -> str:
    from t4patch.data.locations import reinstall_hint

    return f"this shipped data file is broken; {reinstall_hint()}"


# ----------------------------------------------------------------------------------------------- value specs


class Spec:
    """A value's expected shape. Subclasses implement :meth:`check` (raise via ``ctx``) and :meth:`describe`."""

    def describe(self) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def check(self, value: Any, ctx: _Context, keypath: str) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


@dataclass(frozen=True)
class Str(Spec):
    nonempty: bool = True

    def describe(self) -> str:
        return "a non-empty string" if self.nonempty else "a string"

    def check(self, value: Any, ctx: _Context, keypath: str) -> None:
        if not isinstance(value, str) or (self.nonempty and not value.strip()):
            raise ctx.wrong(keypath, self, value)


@dataclass(frozen=True)
class Int(Spec):
    def describe(self) -> str:
        return "an integer"

    def check(self, value: Any, ctx: _Context, keypath: str) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ctx.wrong(keypath, self, value)


@dataclass(frozen=True)
class Number(Spec):
    """An integer or a float (TOML writes ``4`` and ``4.0`` differently; both mean a number here)."""

    def describe(self) -> str:
        return "a number"

    def check(self, value: Any, ctx: _Context, keypath: str) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ctx.wrong(keypath, self, value)


@dataclass(frozen=True)
class Bool(Spec):
    def describe(self) -> str:
        return "a boolean (true or false)"

    def check(self, value: Any, ctx: _Context, keypath: str) -> None:
        if not isinstance(value, bool):
            raise ctx.wrong(keypath, self, value)


@dataclass(frozen=True)
class ListOf(Spec):
    """An array whose every item matches ``item`` (an array of tables when ``item`` is a :class:`Table`)."""

    item: Spec
    nonempty: bool = False

    def describe(self) -> str:
        if isinstance(self.item, Table):
            return "an array of tables" + (" (at least one)" if self.nonempty else "")
        return f"{'a non-empty' if self.nonempty else 'an'} array of {_plural(self.item.describe())}"

    def check(self, value: Any, ctx: _Context, keypath: str) -> None:
        if not isinstance(value, list):
            raise ctx.wrong(keypath, self, value)
        if self.nonempty and not value:
            raise ctx.error(f"{keypath}: expected {self.describe()}, found an empty array")
        for index, item in enumerate(value, start=1):
            self.item.check(item, ctx, f"{keypath}[{index}]")


@dataclass(frozen=True)
class MapOf(Spec):
    """A table whose keys are names chosen by the file (``[arch.sm_75]``, ``[tools]``); every value matches."""

    value: Spec
    nonempty: bool = False

    def describe(self) -> str:
        return f"a table of {_plural(self.value.describe())}"

    def check(self, value: Any, ctx: _Context, keypath: str) -> None:
        if not isinstance(value, dict):
            raise ctx.wrong(keypath, self, value)
        if self.nonempty and not value:
            raise ctx.error(f"{keypath}: expected {self.describe()}, found an empty table")
        for key, item in value.items():
            self.value.check(item, ctx, _join(keypath, key))


@dataclass(frozen=True)
class Key:
    """One key of a :class:`Table`: its value's spec, and whether the file must have it."""

    spec: Spec
    required: bool = True


def optional(spec: Spec) -> Key:
    return Key(spec, required=False)


@dataclass(frozen=True)
class Table(Spec):
    """A table with a fixed set of keys: unknown keys are refused, required ones must be there."""

    keys: Mapping[str, Key | Spec] = field(default_factory=dict)

    def key(self, name: str) -> Key:
        entry = self.keys[name]
        return entry if isinstance(entry, Key) else Key(entry)

    def describe(self) -> str:
        return "a table"

    def check(self, value: Any, ctx: _Context, keypath: str) -> None:
        if not isinstance(value, dict):
            raise ctx.wrong(keypath, self, value)
        allowed = ", ".join(self.keys) or "none"
        where = keypath or "top level"
        for name in value:
            if name not in self.keys:
                raise ctx.error(f"{_join(keypath, name)}: unknown key {name!r} (allowed in {where}: {allowed})")
        for name in self.keys:
            key = self.key(name)
            if name not in value:
                if key.required:
                    raise ctx.error(
                        f"{_join(keypath, name)}: missing required key {name!r} (expected {key.spec.describe()})"
                    )
                continue
            key.spec.check(value[name], ctx, _join(keypath, name))


# --------------------------------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class _Context:
    kind: DataKind
    path: Path | str | None

    def error(self, problem: str) -> T4PatchError:
        return self.kind.fail(self.path, problem)

    def wrong(self, keypath: str, spec: Spec, value: Any) -> T4PatchError:
        return self.error(f"{keypath or 'the document'}: expected {spec.describe()}, found {_found(value)}")


def check(
    doc: Mapping[str, Any],
    schema: Table,
    kind: DataKind,
    path: Path | str | None = None,
    *,
    version: int | None = None,
) -> dict[str, Any]:
    """Validate an already-parsed document against ``schema``; returns it (typed as a dict) or raises.

    With ``version``, the top-level ``schema`` key is compared first, so a file written for a newer t4patch
    says so instead of listing the new keys as unknown.
    """
    ctx = _Context(kind, path)
    found = doc.get("schema")
    if version is not None and isinstance(found, int) and not isinstance(found, bool) and found != version:
        raise ctx.error(f"expected schema = {version}, found {found!r} (a newer t4patch may be needed)")
    schema.check(doc, ctx, "")
    return dict(doc)


def read(path: Path, schema: Table, kind: DataKind, *, version: int | None = None) -> dict[str, Any]:
    """Parse the TOML file at ``path`` and :func:`check` it; every failure (missing, not TOML) is ``kind``'s."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise kind.fail(path, "expected a TOML file, found nothing there") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise kind.fail(path, f"expected a readable UTF-8 TOML file, found an unreadable one ({exc})") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise kind.fail(path, f"expected valid TOML, found a syntax error ({exc})") from None
    return check(doc, schema, kind, path, version=version)


# --------------------------------------------------------------------------------------------------- helpers


def _join(keypath: str, key: str) -> str:
    text = key if key.replace("_", "").replace("-", "").isalnum() else f'"{key}"'
    return f"{keypath}.{text}" if keypath else text


def _plural(description: str) -> str:
    for article in ("a non-empty ", "an ", "a "):
        if description.startswith(article):
            rest = description[len(article):]
            head, _, tail = rest.partition(" ")
            return ("non-empty " if article == "a non-empty " else "") + head + "s" + (f" {tail}" if tail else "")
    return description


def _found(value: Any) -> str:
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, int):
        return f"an integer ({value})"
    if isinstance(value, float):
        return f"a float ({value})"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return "an empty string" if not value.strip() else f"a string ({shown!r})"
    if isinstance(value, list):
        return f"an array of {len(value)} item{'s' if len(value) != 1 else ''}"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, (datetime.date, datetime.time)):
        return f"a date/time ({value})"
    return type(value).__name__
