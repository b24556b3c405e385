"""Imports run down the layers only, never in a cycle, and only the command layer reads the engine table.

The layers are listed once, here (lowest first). Every import in every module of ``t4patch/`` counts: module
level, inside functions, under ``TYPE_CHECKING``, and ``importlib.import_module("t4patch....")`` with a literal
name. ``import t4patch.a.b`` also runs ``t4patch/a/__init__.py``, so it is an edge to ``t4patch.a`` too, except
where ``t4patch.a`` is a package the importing module sits in (Python has initialised it already). A module may
import its own layer or a lower one; a cycle is a failure whatever the layers say. The checker is run on planted
trees as well, so a checker that has gone blind fails here.
"""

from __future__ import annotations

import ast
import shutil
from collections.abc import Iterable
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "t4patch"

# Lowest first. A module belongs to the first entry that is it or one of its packages. "t4patch" (the package's
# own __init__) is the bottom: every import of a submodule runs it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("t4patch", "t4patch.errors", "t4patch.fileio", "t4patch.data"),
    ("t4patch.cuda", "t4patch.environment", "t4patch.output"),  # output renders hints with environment.suggest
    ("t4patch.patching",),
    ("t4patch.contract", "t4patch.evidence"),
    ("t4patch.readiness", "t4patch.verify", "t4patch.builder"),
    ("t4patch.engines",),
    ("t4patch.cli_options", "t4patch.commands"),
    ("t4patch.cli", "t4patch.__main__"),
)
ENGINE_TABLE = "t4patch.commands.engine_table"
TABLE_READERS = ("t4patch.commands", "t4patch.cli")  # the only importers of the engine table


def module_names(root: Path) -> dict[str, Path]:
    """Dotted name -> file for every module under ``root`` (a ``t4patch`` directory)."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _imported(node: ast.AST, module: str, is_package: bool) -> Iterable[str]:
    """Dotted names an import node (or importlib.import_module call with a literal) asks for."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            base = module.split(".") if is_package else module.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            source = ".".join([*base, node.module] if node.module else base)
        else:
            source = node.module or ""
        yield source
        yield from (f"{source}.{alias.name}" for alias in node.names)  # kept only where it names a module
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, (ast.Attribute, ast.Name))
        and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == "import_module"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ):
        yield node.args[0].value


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the t4patch modules importing it runs (parent packages included, own ancestors left out)."""
    names = module_names(root)
    graph: dict[str, set[str]] = {}
    for module, path in names.items():
        own_ancestors = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)}
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            for target in _imported(node, module, _is_package(path)):
                parts = target.split(".")
                for i in range(1, len(parts) + 1):
                    name = ".".join(parts[:i])
                    if name in names and name != module and name not in own_ancestors:
                        edges.add(name)
        graph[module] = edges
    return graph


def layer_of(module: str) -> int:
    best: tuple[int, int] | None = None  # (prefix length, layer) of the longest matching entry
    for index, entries in enumerate(LAYERS):
        for entry in entries:
            matches = module == entry or module.startswith(entry + ".")
            if matches and (best is None or len(entry) > best[0]):
                best = (len(entry), index)
    if best is None:
        raise AssertionError(f"{module} is in no layer: add its package to LAYERS in {Path(__file__).name}")
    return best[1]


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{module} (layer {layer_of(module)}) imports {target} (layer {layer_of(target)})"
        for module, targets in graph.items()
        for target in targets
        if layer_of(target) > layer_of(module)
    )


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def table_readers(graph: dict[str, set[str]]) -> list[str]:
    """Modules outside the command layer that import the engine table."""
    return sorted(
        module
        for module, targets in graph.items()
        if ENGINE_TABLE in targets and not any(module == r or module.startswith(r + ".") for r in TABLE_READERS)
    )


# ----------------------------------------------------------------------------------------------- the real tree

GRAPH = import_graph(PACKAGE)


def test_every_module_is_in_a_layer_and_the_graph_is_not_empty():
    assert len(GRAPH) > 100 and sum(len(t) for t in GRAPH.values()) > 300, "the checker found too few imports"
    for module in GRAPH:
        layer_of(module)


def test_no_import_runs_up_the_layers():
    offences = upward_imports(GRAPH)
    assert not offences, "imports that run up the layers (move the code down, or hand the value in):\n" + "\n".join(
        offences
    )


def test_no_import_cycle():
    found = cycles(GRAPH)
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_only_the_command_layer_reads_the_engine_table():
    assert ENGINE_TABLE in GRAPH
    assert not table_readers(GRAPH), f"import {ENGINE_TABLE} only from t4patch/commands/ and t4patch/cli.py"
    assert any(ENGINE_TABLE in targets for targets in GRAPH.values()), "nothing reads the table: checker blind?"


def test_the_engines_package_holds_no_table_and_the_contract_imports_no_engine():
    assert not {t for t in GRAPH["t4patch.engines"] if t.startswith("t4patch.engines.")}
    contract = [m for m in GRAPH if m == "t4patch.contract" or m.startswith("t4patch.contract.")]
    assert contract and not any(t.startswith("t4patch.engines") for m in contract for t in GRAPH[m])


# ------------------------------------------------------------------------------------------- planted sources


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    copy = tmp_path / "t4patch"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "_data"))
    return copy


def test_a_planted_upward_import_is_reported(tree: Path):
    (tree / "patching" / "planted.py").write_text(
        '"""Planted."""\n\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n'
        "    from t4patch.commands.engine_table import ENGINES\n"
    )
    graph = import_graph(tree)
    assert "t4patch.patching.planted (layer 2) imports t4patch.commands.engine_table (layer 6)" in upward_imports(graph)
    assert table_readers(graph) == ["t4patch.patching.planted"]


def test_a_function_level_import_of_a_submodule_counts_its_package(tree: Path):
    (tree / "cuda" / "planted.py").write_text("def f():\n    import t4patch.verify.marlin.probe\n")
    offences = upward_imports(import_graph(tree))
    assert "t4patch.cuda.planted (layer 1) imports t4patch.verify (layer 4)" in offences
    assert "t4patch.cuda.planted (layer 1) imports t4patch.verify.marlin.probe (layer 4)" in offences


def test_a_planted_cycle_is_reported(tree: Path):
    (tree / "cuda" / "planted_a.py").write_text("from t4patch.cuda import planted_b\n")
    (tree / "cuda" / "planted_b.py").write_text("def f():\n    from . import planted_a\n")
    assert ["t4patch.cuda.planted_a", "t4patch.cuda.planted_b"] in cycles(import_graph(tree))


def test_a_literal_import_module_counts(tree: Path):
    (tree / "data" / "planted.py").write_text('import importlib\n\nimportlib.import_module("t4patch.engines")\n')
    assert "t4patch.data.planted (layer 0) imports t4patch.engines (layer 5)" in upward_imports(import_graph(tree))


def engine_imports(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(engine, other engine) for every import from one engine's package into another's."""
    def engine_of(module: str) -> str | None:  # an engine package is t4patch.engines.<name> with an engine.py
        parts = module.split(".")
        if len(parts) > 2 and parts[:2] == ["t4patch", "engines"] and f"t4patch.engines.{parts[2]}.engine" in graph:
            return parts[2]
        return None

    return {
        (a, b)
        for module, targets in graph.items()
        for target in targets
        if (a := engine_of(module)) and (b := engine_of(target)) and a != b
    }


def test_engines_reach_each_other_only_along_the_tables_redirects():
    """SGLang's Marlin redirect forwards to vLLM (its MarlinSpec says redirect_to="vllm"), so sglang may import
    vllm; nothing else crosses between engine packages, and never the other way (no cycle through the table)."""
    from t4patch.commands.engine_table import ENGINES

    declared = {(e.name, s.redirect_to) for e in ENGINES for s in e.marlin if s.redirect_to}
    found = engine_imports(GRAPH)
    assert found <= declared, f"engine packages import each other outside the table's redirects: {found - declared}"
    assert not {(b, a) for a, b in found} & found


def test_a_planted_engine_back_edge_is_reported(tree: Path):
    (tree / "engines" / "vllm" / "planted.py").write_text("from t4patch.engines.sglang import doctor\n")
    assert ("vllm", "sglang") in engine_imports(import_graph(tree))
