"""Generic code never names an engine: engine knowledge lives in ``t4patch/engines/`` and in data.

Every module of the ``t4patch`` package outside ``t4patch/engines/`` is tokenized; comments and docstrings
are skipped (they may say which engine a piece of generic code was first written for), every other token
(identifiers, attribute names, string literals, f-string text) must not contain an engine's name. The
scanner is run against planted modules too, so a scanner that has gone blind fails here.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

from t4patch.commands.engine_table import ENGINES
from t4patch.readiness.report import STACK

PACKAGE = Path(__file__).resolve().parents[2] / "t4patch"
# Where engine names belong: one subpackage per engine and the one engine table of the command layer. (The
# maintainer tools in the repository's tools/ are outside the package and outside this scan.)
EXEMPT = ("engines/", "commands/engine_table.py")
# Engine code that still sits in a generic package, with why; each entry must still name an engine (a fixed
# module has to leave this list) and is reported, not hidden.
PENDING: dict[str, str] = {}
# An engine that is also part of every engine's stack (Triton: doctor's STACK) is a dependency generic code
# knows by name (its version check, the compile-only driver, TRITON_CACHE_DIR); only serving engines are banned.
ENGINE_NAMES = re.compile("|".join(re.escape(e.name) for e in ENGINES if e.name not in STACK), re.IGNORECASE)
_TEXT_TOKENS = {tokenize.NAME, tokenize.STRING, *(getattr(tokenize, n) for n in ("FSTRING_MIDDLE",) if hasattr(tokenize, n))}


def _docstring_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                lines.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return lines


def engine_names_in_code(source: str) -> list[tuple[int, str]]:
    """(line, token) for every code token naming an engine, comments and docstrings left out."""
    docstrings = _docstring_lines(ast.parse(source))
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in _TEXT_TOKENS:
            continue
        if token.type != tokenize.NAME and token.start[0] in docstrings:
            continue
        if ENGINE_NAMES.search(token.string):
            found.append((token.start[0], token.string))
    return found


def generic_modules() -> list[Path]:
    return sorted(
        path
        for path in PACKAGE.rglob("*.py")
        if not any(path.relative_to(PACKAGE).as_posix().startswith(prefix) for prefix in EXEMPT)
        and path.relative_to(PACKAGE).as_posix() not in PENDING
    )


def test_pending_modules_still_need_to_move():
    for rel, why in PENDING.items():
        path = PACKAGE / rel
        assert path.is_file() and engine_names_in_code(path.read_text(encoding="utf-8")), (
            f"{rel} no longer names an engine (or is gone): remove it from PENDING ({why})"
        )


def test_the_table_names_the_engines_the_scanner_looks_for():
    assert {e.name for e in ENGINES} >= {"vllm", "sglang"}


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('x = "vllm==0.33.0"\n', [(1, '"vllm==0.33.0"')]),
        ("from t4patch.engines.sglang import doctor\n", [(1, "sglang")]),
        ('def f(name):\n    return f"{name} for SGLang"\n', [(2, 'f"{name} for SGLang"')] if not hasattr(tokenize, "FSTRING_MIDDLE") else [(2, "for SGLang")]),
        ("if provider == 'Vllm':\n    pass\n", [(1, "'Vllm'")]),
        ('def f():\n    """Docstrings may say vLLM."""\n    # so may comments: sglang\n    return 1\n', []),
        ('"""Module docstring about SGLang."""\nVALUE = "sglang"\n', [(2, '"sglang"')]),
    ],
)
def test_the_scanner_finds_planted_names_and_skips_docs(source, expected):
    found = engine_names_in_code(source)
    assert [line for line, _ in found] == [line for line, _ in expected]
    assert all(ENGINE_NAMES.search(text) for _, text in found)


def test_the_scanner_fails_on_a_planted_module(tmp_path):
    planted = tmp_path / "generic.py"
    planted.write_text('"""A generic module."""\n\nWATCHED = ("torch", "vllm")\n')
    assert engine_names_in_code(planted.read_text()) == [(3, '"vllm"')]


def test_generic_code_never_names_an_engine():
    modules = generic_modules()
    assert len(modules) > 40, "the scanner found too few modules to scan"
    offences = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {text}"
        for path in modules
        for line, text in engine_names_in_code(path.read_text(encoding="utf-8"))
    ]
    assert not offences, (
        "generic code names an engine: move the knowledge to t4patch/engines/ (the Engine interface) or to data; "
        "for an example in a help text or hint, have the command layer pass one in (commands/engine_table.py's "
        "example_name() / example_spec()):\n"
        + "\n".join(offences)
    )
