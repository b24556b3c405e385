"""Review findings on `t4patch build` / `verify build`, each pinned by a test that failed before the fix.

Git cases use a local bare repository as the remote (no network): a reused clone must build the remote's
current branch (not a stale local one) and only from the requested repository; non-default branches and
missing refs give the clear errors.
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from t4patch.builder.pipeline import execute
from t4patch.builder.plan import plan_build
from t4patch.builder.recipe import load_recipe
from t4patch.builder.runner import StatusPrinter
from t4patch.builder.source import tree_sha256
from t4patch.cuda.arch import parse_arch
from t4patch.errors import BuildError, UsageError
from t4patch.verify.artifacts.check import check_file
from tests.helpers import fake_recipe as _recipe

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git not on PATH")


class Upstream:
    """A work tree pushed to a bare repository that plays the remote."""

    def __init__(self, tmp: Path, name: str = "upstream") -> None:
        self.tmp, self.work, self.bare = tmp, tmp / name, tmp / f"{name}.git"
        self.work.mkdir()
        self.git("init", "-q", "-b", "main")
        self.commit("a.txt", "one\n")
        self.git("clone", "-q", "--bare", str(self.work), str(self.bare), cwd=tmp)
        self.git("remote", "add", "origin", str(self.bare))

    @property
    def url(self) -> str:
        return f"file://{self.bare}"

    def git(self, *args: str, cwd: Path | None = None) -> str:
        env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
               "GIT_COMMITTER_EMAIL": "t@example.invalid", "HOME": str(self.tmp), "PATH": "/usr/bin:/bin:/usr/local/bin"}
        return subprocess.run(["git", *args], cwd=cwd or self.work, check=True, capture_output=True, text=True,
                              env=env).stdout.strip()

    def commit(self, name: str, text: str) -> str:
        (self.work / name).write_text(text)
        self.git("add", name)
        self.git("commit", "-q", "-m", text.strip())
        return self.git("rev-parse", "HEAD")

    def push(self, *refs: str) -> None:
        self.git("push", "-q", "--force", "origin", *refs)


def _build(tmp: Path, **kw):
    plan = plan_build(_recipe(tmp), **kw)
    record, _ = execute(plan, [], printer=StatusPrinter(io.StringIO()))
    return plan, record


# 1 + 3: a moved branch on reuse, a non-default branch, a missing ref ------------------------------------------

@needs_git
def test_reused_clone_builds_the_moved_branch(tmp_path: Path) -> None:
    up = Upstream(tmp_path)
    out = tmp_path / "out"
    _, first = _build(tmp_path, ref="main", repository=up.url, out=out)
    second = up.commit("a.txt", "two\n")
    up.push("main")
    plan, record = _build(tmp_path, ref="main", repository=up.url, out=out)
    assert [s.name for s in plan.steps[:3]] == ["fetch", "resolve-ref", "checkout"]
    assert record["source"]["commit"] == second != first["source"]["commit"]
    assert record["source"]["ref_verified"] is True
    assert (out / "src" / "a.txt").read_text() == "two\n"
    checkout = next(s for s in record["steps"] if s["name"] == "checkout")
    assert checkout["argv"][-1] == second  # the resolved commit is what git checked out


@needs_git
def test_non_default_branch(tmp_path: Path) -> None:
    up = Upstream(tmp_path)
    up.git("checkout", "-q", "-b", "feature/x")
    tip = up.commit("b.txt", "branch\n")
    up.push("feature/x")
    up.git("checkout", "-q", "main")
    _, record = _build(tmp_path, ref="feature/x", repository=up.url, out=tmp_path / "out")
    assert record["source"]["commit"] == tip and record["status"] == "ok"
    # and again into the same OUT (reuse), after the branch moved
    up.git("checkout", "-q", "feature/x")
    tip2 = up.commit("b.txt", "branch 2\n")
    up.push("feature/x")
    _, record = _build(tmp_path, ref="feature/x", repository=up.url, out=tmp_path / "out")
    assert record["source"]["commit"] == tip2


@needs_git
def test_missing_ref_is_a_clear_error(tmp_path: Path) -> None:
    up = Upstream(tmp_path)
    for ref in ("nope", "deadbeef1"):
        plan = plan_build(_recipe(tmp_path), ref=ref, repository=up.url, out=tmp_path / f"out-{ref}")
        with pytest.raises(BuildError, match=f"ref '{ref}' does not name a commit"):
            execute(plan, [], printer=StatusPrinter(io.StringIO()))
        record = json.loads(plan.record_path.read_text())
        assert record["status"] == "failed" and "does not name a commit" in record["error"]


# 2: a reused clone of another repository ------------------------------------------------------------------

@needs_git
def test_reused_clone_of_another_repository_is_refused(tmp_path: Path) -> None:
    one, two = Upstream(tmp_path, "one"), Upstream(tmp_path, "two")
    out = tmp_path / "out"
    _build(tmp_path, ref="main", repository=one.url, out=out)
    plan = plan_build(_recipe(tmp_path), ref="main", repository=two.url, out=out)
    with pytest.raises(UsageError, match="is a clone of .*one.git, not of the requested .*two.git") as info:
        execute(plan, [], printer=StatusPrinter(io.StringIO()))
    assert info.value.exit_code == 2 and "remove" in info.value.hint and "--repo" in info.value.hint
    _build(tmp_path, ref="main", repository=one.url + "/", out=out)  # the same repository still reuses


# 4, 8: option validation in plan_build ---------------------------------------------------------------------

@pytest.mark.parametrize("ref", ["--orphan=x", "-b", "a b", "v1..v2", ".hidden", "HEAD^{tree}", ""])
def test_bad_refs_are_usage_errors(tmp_path: Path, ref: str) -> None:
    with pytest.raises(UsageError, match="--ref") as info:
        plan_build(load_recipe("llama.cpp"), ref=ref, out=tmp_path / "o")
    assert info.value.exit_code == 2


def test_source_must_exist_and_excludes_repo(tmp_path: Path) -> None:
    recipe = load_recipe("llama.cpp")
    with pytest.raises(UsageError, match="expected an existing llama.cpp source directory, found nothing"):
        plan_build(recipe, source_dir=tmp_path / "nonexist")
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match="found a file"):
        plan_build(recipe, source_dir=tmp_path / "file")
    with pytest.raises(UsageError, match="--repo and --source exclude each other"):
        plan_build(recipe, source_dir=tmp_path, repository="file:///x")


# 5: the source identity is taken before the build and without an --out inside the source ---------------------

def test_source_digest_excludes_out_inside_source(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "main.c").write_text("int main(void){return 0;}\n")
    before, count = tree_sha256(src)
    plan = plan_build(_recipe(tmp_path), source_dir=src, out=src / "myout", jobs=1)
    record, _ = execute(plan, [], printer=StatusPrinter(io.StringIO()))
    assert record["source"]["tree_sha256"] == before and record["source"]["files"] == count == 1


# 6, 13: artifact messages and cuobjdump parsing ----------------------------------------------------------------

def test_newer_ptx_is_not_called_jit_compilable(tmp_path: Path) -> None:
    from tests.helpers import cubin as _cubin
    from tests.helpers import fatbin_container as _container
    from tests.helpers import fatbin_entry as _entry

    lib = tmp_path / "lib.fatbin"  # SASS for sm_86, PTX for compute_80: nothing a T4 can run
    lib.write_bytes(_container(_entry(2, 86, _cubin(86)), _entry(1, 80, b".version 8.0\n.target sm_80\n")))
    result = check_file(lib, parse_arch("75"), cuobjdump=None)
    (problem,) = result.problems
    assert "cannot run on sm_75" in problem and "JIT-compiled" not in problem, problem


def test_cuobjdump_arch_comes_from_the_suffix_only(tmp_path: Path) -> None:
    """An artifact named like an architecture adds none: only the listed entry's suffix counts."""
    from t4patch.cuda.cuobjdump import list_code

    tool = tmp_path / "cuobjdump"
    tool.write_text('#!/bin/sh\ncase "$1" in\n'
                    '  --list-elf) echo "ELF file    1: libsm_80_helpers.1.sm_75.cubin"; '
                    'echo "ELF file    2: libsm_80_helpers.2.sm_75.cubin" ;;\n'
                    '  --list-ptx) echo "PTX file    1: x.2.sm_86a.ptx" ;;\nesac\n')
    tool.chmod(0o755)
    listing = list_code(tmp_path / "libsm_80_helpers.so", tool=str(tool))
    assert listing is not None and listing.sass == ["sm_75"] and listing.ptx == ["compute_86"]
    assert listing.cubins_for(parse_arch("sm_75")) == 2 and listing.cubins_for(parse_arch("sm_80")) == 0
    tool.write_text("#!/bin/sh\necho 'cuobjdump fatal : Could not open input file' >&2\nexit 1\n")
    assert list_code(tmp_path / "missing.so", tool=str(tool)) is None  # no answer, not an error


# 7: verify build on a directory without binaries ---------------------------------------------------------------

def _verify(argv: list[str]):
    from t4patch.commands import verify_build

    parser = argparse.ArgumentParser()
    verify_build.configure_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["build", *argv])
    return args.func(args)


def test_verify_build_without_binaries_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("text")
    for target in (tmp_path, tmp_path / "notes.txt"):
        with pytest.raises(UsageError, match="no ELF/.a/.fatbin files under") as info:
            _verify([str(target), "--no-cuobjdump"])
        assert info.value.exit_code == 2 and "t4patch build llama.cpp --arch 75" in info.value.hint
    from t4patch.builder.record import BuildRecord

    record = BuildRecord(t4patch="0", command="t4patch build mistral.rs", recipe="mistral.rs", recipe_sha256=None,
                         arch="75", cuda=True, features=[], with_tests=False, ptx_only=False, jobs=1, out=str(tmp_path),
                         build_dir=str(tmp_path / "target"), log=str(tmp_path / "build.log"), requested={}, env={},
                         flags={}, tools={}, host={}, started="2026-12-01T00:00:00+00:00", status="ok")
    (tmp_path / "build-record.json").write_text(json.dumps(record.to_dict()))
    with pytest.raises(UsageError) as info:
        _verify([str(tmp_path), "--no-cuobjdump"])
    assert "t4patch build mistral.rs --arch 75" in info.value.hint


# 12: the dry-run rerun hint keeps --dry-run / --json -----------------------------------------------------------

def test_command_line_keeps_dry_run_and_json() -> None:
    from t4patch.commands import build

    parser = argparse.ArgumentParser()
    build.configure_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["build", "llama.cpp", "--dry-run", "--json", "--ref", "b1"])
    assert build._command_line(args) == "t4patch build llama.cpp --ref b1 --dry-run --json"
