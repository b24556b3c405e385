"""The README must stay true: CI runs exactly its test command, and its tables match the code."""

from __future__ import annotations

import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]


def readme_section(title: str) -> str:
    text = (REPO / "README.md").read_text()
    assert f"\n## {title}\n" in text, f"README has no '## {title}' section"
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def readme_commands() -> list[str]:
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", readme_section("Quick start"), re.S)]


def ci_commands() -> list[str]:
    """The command lines of .ci/run (comments, blank lines and echo lines left out)."""
    lines = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    return [line for line in lines if line and not line.startswith(("#", "echo "))]


def test_quick_start_is_two_commands() -> None:
    commands = readme_commands()
    assert len(commands) == 2
    assert all("\n" not in c for c in commands)
    assert "t4patch apply vllm==0.33.0" in commands[0] and "status --check" in commands[0]
    assert "pytest" in commands[1]


def test_ci_runs_the_readme_test_command_last() -> None:
    commands = ci_commands()
    assert commands[-1] == readme_commands()[1]


def test_ci_runs_ruff_and_mypy_before_the_tests() -> None:
    commands = ci_commands()
    tests = commands.index(readme_commands()[1])
    ruff = [i for i, c in enumerate(commands) if c.startswith(".venv/bin/ruff check") and "t4patch" in c and "tests" in c]
    mypy = [i for i, c in enumerate(commands) if c == ".venv/bin/mypy"]
    assert ruff and ruff[0] < tests, commands
    assert mypy and mypy[0] < tests, commands
    # both tools are installed by .ci/run itself, pinned, before they run
    for tool, first in (("ruff", ruff[0]), ("mypy", mypy[0])):
        installs = [c for c in commands[:first] if "pip install" in c and re.search(rf"\b{tool}==\d", c)]
        assert installs, f".ci/run does not install a pinned {tool} before running it"


def test_exit_code_table_matches_errors() -> None:
    from t4patch.errors import EXIT_CODES

    text = (REPO / "README.md").read_text()
    for name, code in EXIT_CODES.items():
        assert re.search(rf"\| {code} \| `{name}` \|", text), f"README exit-code table misses {name} = {code}"


def _package_map_rows() -> list[str]:
    return [line for line in readme_section("Package map").splitlines() if line.startswith("| `t4patch")]


def test_package_map_names_every_package() -> None:
    rows = _package_map_rows()
    packages = sorted(
        ".".join(p.parent.relative_to(REPO).parts)
        for p in (REPO / "t4patch").rglob("__init__.py")
        if "__pycache__" not in p.parts
    )
    assert "t4patch.patching" in packages

    def listed(package: str) -> bool:
        parent, _, last = package.rpartition(".")
        return any(f"`{package}`" in row or (parent and f"`{parent}`" in row and f"`{last}`" in row) for row in rows)

    assert [p for p in packages if not listed(p)] == [], "packages missing from the README package map"


def test_package_map_marks_the_tools_outside_the_package_not_shipped() -> None:
    """The wheel ships the whole package (no exclude), and the map names every maintainer tool package of tools/
    in one row that says they are not shipped."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "exclude" not in pyproject["tool"]["hatch"]["build"]["targets"]["wheel"], "the wheel excludes part of t4patch"
    tools = sorted(
        ".".join(p.parent.relative_to(REPO).parts)
        for p in (REPO / "tools").rglob("*/__init__.py")
        if "__pycache__" not in p.parts
    )
    assert "tools.research" in tools and "tools.bench" in tools, tools
    rows = [line for line in readme_section("Package map").splitlines() if line.startswith("| `tools")]
    assert len(rows) == 1 and "not shipped" in rows[0], rows
    assert [t for t in tools if f"`{t}`" not in rows[0]] == [], "tools packages missing from the README package map"


def test_ci_runs_the_quick_start_first_with_the_bundled_pip() -> None:
    """The quick start's first command runs verbatim, and nothing in .ci/run upgrades pip (CI must hit what a
    newcomer with the pip that `python3 -m venv` bundles hits)."""
    commands = ci_commands()
    assert readme_commands()[0] in commands
    assert commands.index(readme_commands()[0]) < commands.index(readme_commands()[1])
    upgrades = [c for c in commands if re.search(r"pip install\b.*(--upgrade|-U)\b.*\bpip\b", c)]
    assert not upgrades, upgrades
