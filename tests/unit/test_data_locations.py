"""``t4patch.data.locations`` is the one home of every data path, and the data trees are named after what they hold.

Every ``data_dir(...)`` call in the code (package, tools and tests) is found in the sources and must name a kind
the module knows, so a reader left on an old tree name (``data_dir("verify")``) fails here and not on the one
path that happens to reach it; no module but ``locations`` names the wheel's ``_data`` directory; no data tree
at the repository root shares a name with a code package (issue 20: ``verify/`` beside ``t4patch/verify/``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from t4patch.data import locations
from t4patch.data.locations import DATA_KINDS, data_dir
from t4patch.errors import DataFileError, PatchSetError

REPO = Path(__file__).resolve().parents[2]
CODE = [REPO / "t4patch", REPO / "tools", REPO / "tests"]


def data_dir_kinds(source: str) -> list[tuple[int, str]]:
    """(line, kind) for every ``data_dir("<literal>")`` / ``x.data_dir("<literal>")`` call in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        first = node.args[0]
        if name == "data_dir" and isinstance(first, ast.Constant) and isinstance(first.value, str):
            found.append((node.lineno, first.value))
    return found


def sources() -> list[Path]:
    return sorted(p for root in CODE for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def test_the_scanner_finds_planted_calls() -> None:
    planted = 'from t4patch.data import locations\nA = locations.data_dir("verify") / "x.toml"\nB = data_dir(kind)\n'
    assert data_dir_kinds(planted) == [(2, "verify")]


def test_every_data_dir_call_names_a_known_tree() -> None:
    here = Path(__file__).resolve()  # this file plants an unknown kind on purpose
    calls = [
        (p, line, kind) for p in sources() if p != here for line, kind in data_dir_kinds(p.read_text(encoding="utf-8"))
    ]
    assert len(calls) > 10, "the scanner found too few data_dir calls: it has gone blind"
    unknown = [f"{p.relative_to(REPO)}:{line}: data_dir({kind!r})" for p, line, kind in calls if kind not in DATA_KINDS]
    assert unknown == [], f"data_dir kinds not in {DATA_KINDS}:\n" + "\n".join(unknown)


def test_only_locations_names_the_wheels_data_directory() -> None:
    offenders = []
    for path in sorted((REPO / "t4patch").rglob("*.py")) + sorted((REPO / "tools").rglob("*.py")):
        if "__pycache__" in path.parts or path == Path(locations.__file__).resolve():
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and "_data" in node.value.split("/"):
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.value!r}")
    assert offenders == [], "code that finds shipped data itself instead of asking t4patch.data.locations:\n" + "\n".join(offenders)


def test_every_tree_is_in_the_checkout_and_named_apart_from_the_code() -> None:
    packages = {p.parent.name for p in (REPO / "t4patch").rglob("__init__.py") if "__pycache__" not in p.parts}
    assert "verify" in packages and "builder" in packages
    for kind in DATA_KINDS:
        assert (REPO / kind).is_dir() and any((REPO / kind).rglob("*.toml")), f"{kind}/ has no data in the checkout"
        clash = {kind, kind.rstrip("s"), kind.replace("-", "_")} & packages
        assert not clash, f"data tree {kind}/ is named like the code package t4patch/{clash.pop()}/"
        assert data_dir(kind) == REPO / kind  # a checkout reads its own trees (no _data inside the package here)


def test_an_unknown_kind_is_a_programming_error() -> None:
    for lookup in (data_dir, locations.shipped_dirs):
        with pytest.raises(ValueError, match="unknown data kind 'verify'"):
            lookup("verify")


def test_the_shipped_places_are_the_wheels_then_the_checkouts() -> None:
    package = Path(locations.__file__).resolve().parents[1]
    assert locations.shipped_dirs("cases") == (package / "_data" / "cases", package.parent / "cases")


@pytest.mark.parametrize("kind", DATA_KINDS)
def test_a_missing_tree_is_a_data_error_with_a_restore_hint(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, kind: str) -> None:
    monkeypatch.delenv("T4PATCH_PATCHES", raising=False)
    monkeypatch.setattr(locations, "_PACKAGE_DIR", tmp_path / "site" / "t4patch")
    locations.reinstall_hint.cache_clear()
    try:
        with pytest.raises(PatchSetError if kind == "patches" else DataFileError) as caught:
            data_dir(kind)
    finally:
        locations.reinstall_hint.cache_clear()
    error = caught.value
    assert f"t4patch's {kind}/ data is missing" in str(error)
    assert error.exit_code == (7 if kind == "patches" else 16)
