"""The suite keeps its shape: shared helpers come from ``tests.helpers`` only, and no test touches ``sys.path``.

Every Python file under ``tests/`` is parsed; an import of ``conftest``, of another test module (``test_*``,
``tests.unit.*`` ...) or of the old ``wheels`` module, and any use of ``sys.path`` in code, is an offence. The
scanner is run on planted sources too, so a scanner that has gone blind fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]


def offences(source: str) -> list[str]:
    """``line: what`` for every forbidden import or ``sys.path`` use in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
            if node.module == "tests":
                modules += [f"tests.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            found.append(f"{node.lineno}: relative import (use `from tests.helpers import ...`)")
        for module in modules:
            parts = module.split(".")
            if parts[0] in ("conftest", "wheels") or parts[0].startswith("test_"):
                found.append(f"{node.lineno}: imports {module} (shared helpers belong in tests/helpers.py)")
            elif parts[0] == "tests" and len(parts) > 1 and parts[1] != "helpers":
                found.append(f"{node.lineno}: imports {module} (only tests.helpers is shared)")
        if isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name) \
                and node.value.id == "sys":
            found.append(f"{node.lineno}: uses sys.path (pytest's pythonpath setting finds tests.helpers)")
    return found


def suite_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize(
    ("source", "count"),
    [
        ("from conftest import make_dist\n", 1),
        ("from test_fatbin import _cubin\n", 1),
        ("import test_doctor\n", 1),
        ("from wheels import wheel_path\n", 1),
        ("from tests.unit.test_build_runner import _recipe\n", 1),
        ("from tests import conftest\n", 1),
        ("from . import helpers\n", 1),
        ("import sys\nsys.path.insert(0, 'x')\n", 1),
        ("import sys\nsys.path[:0] = ['x']\n", 1),
        ("from tests.helpers import make_dist\nfrom tests import helpers\nimport sys\nprint(sys.argv)\n", 0),
        ('TOOL = """\nimport sys\nsys.path.insert(0, "x")\n"""\n', 0),  # program text for a child process
    ],
)
def test_the_scanner_finds_planted_offences(source: str, count: int) -> None:
    assert len(offences(source)) == count, offences(source)


def test_no_test_imports_another_test_module_or_touches_sys_path() -> None:
    found = [f"{p.relative_to(TESTS.parent)}:{o}" for p in suite_files()
             for o in offences(p.read_text(encoding="utf-8"))]
    assert found == [], "\n".join(found)


def test_every_test_directory_is_a_package() -> None:
    directories = {p.parent for p in TESTS.rglob("test_*.py") if "__pycache__" not in p.parts} | {TESTS}
    missing = sorted(str(d.relative_to(TESTS.parent)) for d in directories if not (d / "__init__.py").is_file())
    assert missing == [], f"test directories without __init__.py (module names would clash): {missing}"
