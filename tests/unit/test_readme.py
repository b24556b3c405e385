"""The README's quick start must stay true: CI runs exactly its test command."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    quick = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", quick, re.S)]


def test_quick_start_is_two_commands():
    commands = readme_commands()
    assert len(commands) == 2
    assert all("\n" not in c for c in commands)
    assert "t4patch apply vllm==0.33.0" in commands[0] and "status --check" in commands[0]
    assert "pytest" in commands[1]


def test_ci_runs_the_readme_test_command():
    ci_lines = (REPO / ".ci" / "run").read_text().splitlines()
    assert readme_commands()[1] in ci_lines


def test_exit_code_table_matches_errors():
    from t4patch.errors import EXIT_CODES

    text = (REPO / "README.md").read_text()
    for name, code in EXIT_CODES.items():
        assert re.search(rf"\| {code} \| `{name}` \|", text), f"README exit-code table misses {name} = {code}"
