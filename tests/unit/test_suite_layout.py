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
        ("from tests.unit.test_builder_runner import _recipe\n", 1),
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


# ----------------------------------------------------------------- unit test files are named after their module

REPO = TESTS.parent
UNIT = TESTS / "unit"
# Unit tests that cover behaviour across modules rather than one module, with why. Each must exist.
CROSS_CUTTING: dict[str, str] = {
    "test_apply_revert_status.py": "apply, status and revert end to end through the CLI on a synthetic engine",
    "test_optional_diffs.py": "optional diffs end to end (apply --with, status, revert) through the CLI",
    "test_environments_and_concurrency.py": "targeting another interpreter, concurrent runs, light command imports",
    "test_pasted_hints.py": "the advice of every command, run through a real shell (issue 23.3)",
    "test_engine_names.py": "a rule over every generic module of the package (no engine names)",
    "test_import_layers.py": "a rule over every import of the package (layers, cycles, the engine table's readers)",
    "test_engine_registration.py": "a synthetic third engine through every engine hook (doctor, verify marlin, "
                                   "verify attention): the contract as a whole",
    "test_docs_commands.py": "the commands in README and docs/ against the real parser",
    "test_docs_figures.py": "the figures README and docs/ state, against the manifests and t4patch.errors",
    "test_readme.py": "README's tables against the code",
    "test_suite_layout.py": "the shape of the test suite itself",
    "test_progress.py": "the suite's own progress helpers (tests/helpers.py)",
}
# Files still to rename (old -> new name, which this test checks is a fitting name); a rename leaves this map.
PENDING_RENAMES: dict[str, str] = {}


def module_names() -> dict[str, set[str]]:
    """Every name a test file may be called after -> the dotted modules (or packages) it stands for.

    A module ``t4patch/verify/marlin/shapes.py`` may be named by any tail of its path joined with ``_``:
    ``shapes``, ``marlin_shapes``, ``verify_marlin_shapes``, ``t4patch_verify_marlin_shapes``; the same for
    packages (``t4patch/builder/`` -> ``builder``) and for the maintainer tools (``tools/bench/build_archs.py``).
    """
    names: dict[str, set[str]] = {}
    for root in ("t4patch", "tools"):
        for path in (REPO / root).rglob("*.py"):
            if "__pycache__" in path.parts:
                continue
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            elif parts[-1] == "__main__":
                continue
            for i in range(len(parts)):
                names.setdefault("_".join(parts[i:]), set()).add(".".join(parts))
    return names


def _command_words(call: ast.Call) -> list[str]:
    """The leading string words of a CLI call: ``cli("verify", "attention", ...)`` or ``main(["port", ...])``."""
    args = call.args[0].elts if len(call.args) == 1 and isinstance(call.args[0], ast.List) else call.args
    words = []
    for arg in args[:2]:
        if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
            break
        words.append(arg.value.replace(".", "_").replace("-", "_"))
    return words


def imported_modules(source: str) -> set[str]:
    """Every dotted module ``source`` uses: imports anywhere (top level, in functions, under TYPE_CHECKING;
    ``from a.b import c`` counts as both ``a.b`` and ``a.b.c``, c may be a submodule), and the command modules
    it runs through the CLI (``cli("port", ...)``, the suite's fixture, or ``main(["verify", "marlin", ...])``
    use ``t4patch.commands.port`` / ``t4patch.commands.verify_marlin``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            words = _command_words(node) if name in ("cli", "main") else []
            found.update(f"t4patch.commands.{'_'.join(words[:n])}" for n in range(1, len(words) + 1))
    return found


def covered_module(filename: str, source: str, names: dict[str, set[str]]) -> str | None:
    """The module a unit test file is named after and imports, or None.

    ``test_<name>.py`` or ``test_<name>_<aspect>.py``, where ``<name>`` is a module's name (see
    :func:`module_names`) and the file imports that module or, for a package, one of its modules: the name says
    what is covered and the imports show it is. The longest fitting name wins.
    """
    stem = filename.removeprefix("test_").removesuffix(".py")
    imports = imported_modules(source)
    words = stem.split("_")
    for end in range(len(words), 0, -1):
        for module in sorted(names.get("_".join(words[:end]), ())):
            if any(i == module or i.startswith(module + ".") for i in imports):
                return module
    return None


@pytest.mark.parametrize(
    ("filename", "source", "expected"),
    [
        ("test_marlin_shapes.py", "from t4patch.verify.marlin import shapes\n", "t4patch.verify.marlin.shapes"),
        ("test_builder_plan_truth.py", "from t4patch.builder.plan import plan_build\n", "t4patch.builder.plan"),
        ("test_builder_review.py", "def f():\n    from t4patch.builder.runner import x\n", "t4patch.builder"),
        ("test_build_plan.py", "from t4patch.builder.plan import plan_build\n", None),  # named after no module
        ("test_cuda_arch.py", "import json\n", None),  # named after a module it does not import
        ("test_fatbin.py", "import t4patch.cuda.fatbin as fatbin\n", "t4patch.cuda.fatbin"),
        ("test_port.py", "def test(cli):\n    cli('port', 'x==1', '--json')\n", "t4patch.commands.port"),
        ("test_verify_marlin.py", "cli.main(['verify', 'marlin', '--quick'])\n", "t4patch.commands.verify_marlin"),
    ],
)
def test_the_name_rule_on_planted_files(filename: str, source: str, expected: str | None) -> None:
    names = {"marlin_shapes": {"t4patch.verify.marlin.shapes"}, "builder_plan": {"t4patch.builder.plan"},
             "builder": {"t4patch.builder"}, "build": {"t4patch.commands.build"},
             "cuda_arch": {"t4patch.cuda.arch"}, "fatbin": {"t4patch.cuda.fatbin"},
             "port": {"t4patch.commands.port", "t4patch.patching.port"}, "verify_marlin": {"t4patch.commands.verify_marlin"}}
    assert covered_module(filename, source, names) == expected


def test_every_unit_test_file_is_named_after_the_module_it_covers() -> None:
    names = module_names()
    assert "builder_plan" in names and "data_locations" in names and "bench_build_archs" in names
    files = sorted(p.name for p in UNIT.glob("test_*.py"))
    misnamed = [
        f"tests/unit/{name}" for name in files
        if name not in CROSS_CUTTING and name not in PENDING_RENAMES
        and covered_module(name, (UNIT / name).read_text(encoding="utf-8"), names) is None
    ]
    assert misnamed == [], (
        "unit test files must be called test_<module>[_<aspect>].py after a module they import "
        "(or be listed in CROSS_CUTTING with why):\n" + "\n".join(misnamed)
    )


def test_the_allow_lists_name_real_files_and_fitting_new_names() -> None:
    names = module_names()
    gone = [name for name in [*CROSS_CUTTING, *PENDING_RENAMES] if not (UNIT / name).is_file()]
    assert gone == [], f"listed unit test files that do not exist (remove them from the lists): {gone}"
    unfit = [
        f"{old} -> {new}" for old, new in PENDING_RENAMES.items()
        if covered_module(new, (UNIT / old).read_text(encoding="utf-8"), names) is None
    ]
    assert unfit == [], f"pending renames whose new name names no module the file imports: {unfit}"
