"""A build runs exactly the commands its dry run shows, and each command's outcome is a typed StepResult.

The runner is swapped for one that records every command it is handed (and, for the git tests, hands it on to
the real runner), so the comparison is between the dry run's own document (``BuildPlan.to_dict``, what
``t4patch build --dry-run --json`` prints) and what was really executed, argument for argument.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from t4patch.builder.pipeline import execute
from t4patch.builder.plan import RESOLVE_STEP, BuildPlan, PlannedStep, plan_build
from t4patch.builder.runner import LogRunner, StatusPrinter, StepResult
from t4patch.errors import BuildError
from tests.helpers import fake_recipe

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git not on PATH")
PLACEHOLDER = f"<output of {RESOLVE_STEP}>"


class Recording:
    """A stand-in runner: records each command; runs it through the real runner when ``real`` is set."""

    def __init__(self, plan: BuildPlan, *, real: bool, fail: str | None = None, answers: dict[str, str] | None = None):
        self.real = LogRunner(plan.log_path, StatusPrinter(io.StringIO())) if real else None
        self.fail = fail
        self.answers = answers or {}
        self.executed: list[tuple[str, list[str]]] = []

    def run(self, step: PlannedStep, argv: tuple[str, ...], *, index: int, total: int,
            capture: bool = False) -> StepResult:
        self.executed.append((step.name, list(argv)))
        if self.real is not None:
            return self.real.run(step, argv, index=index, total=total, capture=capture)
        code = 3 if step.name == self.fail else 0
        output = self.answers.get(argv[-1]) if capture else None
        return StepResult(step.name, argv, str(step.cwd), dict(step.env), 0.01, code if output or not capture else 1,
                          output=output)


def dry_run_commands(plan: BuildPlan) -> list[tuple[str, list[str]]]:
    """The dry run's command list: every command of every step, from the dry-run document itself."""
    doc = json.loads(json.dumps(plan.to_dict()))
    return [(s["name"], argv) for s in doc["steps"] for argv in s.get("lookup", [s["argv"]])]


def bound(commands: list[tuple[str, list[str]]], commit: str) -> list[tuple[str, list[str]]]:
    return [(name, [commit if a == PLACEHOLDER else a for a in argv]) for name, argv in commands]


def git(cwd: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.invalid", "HOME": str(cwd), "PATH": "/usr/bin:/bin:/usr/local/bin"}
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True, env=env).stdout.strip()


@pytest.fixture()
def upstream(tmp_path: Path) -> tuple[str, str, str]:
    """(file:// URL of a bare repository, the commit tagged v1, the tip of main one commit later)."""
    work = tmp_path / "work"
    work.mkdir()
    git(work, "init", "-q", "-b", "main")
    (work / "a.txt").write_text("one\n")
    git(work, "add", "a.txt")
    git(work, "commit", "-q", "-m", "one")
    tagged = git(work, "rev-parse", "HEAD")
    git(work, "tag", "v1")
    (work / "a.txt").write_text("two\n")
    git(work, "commit", "-q", "-am", "two")
    tip = git(work, "rev-parse", "HEAD")
    git(tmp_path, "clone", "-q", "--bare", str(work), str(tmp_path / "remote.git"))
    return f"file://{tmp_path / 'remote.git'}", tagged, tip


@needs_git
def test_the_run_executes_the_dry_run_commands_exactly(tmp_path: Path, upstream: tuple[str, str, str]) -> None:
    url, tagged, _ = upstream
    plan = plan_build(fake_recipe(tmp_path), ref="v1", repository=url, out=tmp_path / "out")
    shown = dry_run_commands(plan)
    assert [name for name, _ in shown] == ["clone", RESOLVE_STEP, RESOLVE_STEP, "checkout", "configure", "build"]
    assert shown[3][1][-1] == PLACEHOLDER  # the dry run says where the checkout's commit comes from
    runner = Recording(plan, real=True)
    record, _ = execute(plan, [], printer=StatusPrinter(io.StringIO()), runner=runner)
    # The tag is found by the first lookup command, so the second is never run: otherwise identical.
    expected = bound([c for i, c in enumerate(shown) if i != 2], tagged)
    assert runner.executed == expected
    assert [(s["name"], s["argv"]) for s in record["steps"]] == expected  # the record shows what ran
    assert record["source"]["commit"] == tagged and record["source"]["ref_verified"] is True
    lookup = record["steps"][1]
    assert lookup["output"].strip() == tagged and lookup["returncode"] == 0
    start, end = lookup["log_span"]
    assert plan.log_path.read_bytes()[start:end].decode().strip() == tagged  # its output is in its log section


@needs_git
def test_a_branch_runs_the_lookup_commands_in_the_shown_order(tmp_path: Path, upstream: tuple[str, str, str]) -> None:
    url, _, tip = upstream
    plan = plan_build(fake_recipe(tmp_path), ref="main", repository=url, out=tmp_path / "out")
    shown = dry_run_commands(plan)
    runner = Recording(plan, real=True)
    record, _ = execute(plan, [], printer=StatusPrinter(io.StringIO()), runner=runner)
    assert runner.executed == bound(shown, tip)  # tag lookup (fails), origin branch lookup (answers), ...
    assert [s["returncode"] for s in record["steps"][1:3]] == [1, 0]
    assert record["durations"][RESOLVE_STEP] >= 0 and record["source"]["commit"] == tip
    # A reused clone: fetch instead of clone, the same lookup and checkout, again exactly as shown.
    again = plan_build(fake_recipe(tmp_path), ref="v1", repository=url, out=tmp_path / "out")
    runner = Recording(again, real=True)
    record, _ = execute(again, [], printer=StatusPrinter(io.StringIO()), runner=runner)
    assert runner.executed[0][0] == "fetch"
    assert runner.executed == bound([c for i, c in enumerate(dry_run_commands(again)) if i != 2],
                                    record["source"]["commit"])


def test_a_failed_step_is_a_typed_result_in_the_record(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    plan = plan_build(fake_recipe(tmp_path), source_dir=src, out=tmp_path / "out")
    runner = Recording(plan, real=False, fail="configure")
    with pytest.raises(BuildError) as info:
        execute(plan, [], printer=StatusPrinter(io.StringIO()), runner=runner)
    assert "step 'configure' failed (exit 3)" in str(info.value)
    assert not hasattr(info.value, "step_result")  # the timing is in the record, not stuck onto the error
    assert runner.executed == dry_run_commands(plan)[:1]  # nothing after the failed step ran
    record = json.loads(plan.record_path.read_text())
    assert record["status"] == "failed"
    (step,) = record["steps"]
    assert step["name"] == "configure" and step["returncode"] == 3 and step["argv"] == runner.executed[0][1]
    assert record["durations"]["configure"] == 0.01


def test_a_ref_no_lookup_answers_fails_before_the_checkout(tmp_path: Path) -> None:
    plan = plan_build(fake_recipe(tmp_path), ref="v9", repository="file:///nowhere.git", out=tmp_path / "out")
    runner = Recording(plan, real=False)  # every lookup command exits 1
    with pytest.raises(BuildError, match="ref 'v9' does not name a commit"):
        execute(plan, [], printer=StatusPrinter(io.StringIO()), runner=runner)
    assert [name for name, _ in runner.executed] == ["clone", RESOLVE_STEP, RESOLVE_STEP]


def test_an_abbreviated_hash_must_name_that_commit(tmp_path: Path) -> None:
    """The hash lookup's answer is refused unless it starts with the requested abbreviation."""
    plan = plan_build(fake_recipe(tmp_path), ref="abcdef1", repository="file:///nowhere.git", out=tmp_path / "out")
    lookup = plan.steps[1].lookup
    assert lookup[-1][-1] == "abcdef1^{commit}"
    runner = Recording(plan, real=False, answers={"abcdef1^{commit}": "1234567" + "0" * 33 + "\n"})
    with pytest.raises(BuildError, match="does not name a commit"):
        execute(plan, [], printer=StatusPrinter(io.StringIO()), runner=runner)


def test_dry_run_text_shows_the_lookup_and_where_the_checkout_commit_comes_from(tmp_path: Path) -> None:
    plan = plan_build(fake_recipe(tmp_path), ref="v1", repository="file:///mirror.git", out=tmp_path / "out")
    text = plan.render()
    assert f"[2/5] {RESOLVE_STEP}: " in text and " || " in text and "refs/tags/v1^{commit}" in text
    assert "[3/5] checkout: " in text and PLACEHOLDER in text


@needs_git
def test_the_lookup_shell_line_runs_as_shown(tmp_path: Path, upstream: tuple[str, str, str]) -> None:
    """The dry run's shell line of resolve-ref, pasted into sh after the clone, prints the commit the run uses."""
    url, tagged, _ = upstream
    plan = plan_build(fake_recipe(tmp_path), ref="v1", repository=url, out=tmp_path / "out")
    plan.steps[0].cwd.mkdir(parents=True)  # as the runner does
    subprocess.run(plan.steps[0].bind({}), cwd=plan.steps[0].cwd, check=True, capture_output=True)
    line = plan.steps[1].shell()
    assert line.count("GIT_TERMINAL_PROMPT=0") == len(plan.steps[1].lookup)
    assert subprocess.run(["sh", "-c", line], capture_output=True, text=True).stdout.strip() == tagged
