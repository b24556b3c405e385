"""A journal is input, not a command (issue 22): planted journals of every kind are refused and touch nothing.

Recovery runs before every command aimed at an environment, ``status`` included, so anyone who can write in a
site-packages directory could otherwise make another user's ``t4patch status`` rename, install or delete
files. Each case plants a journal (or breaks one thing the issue's "smaller" list names) in a fresh synthetic
install, runs the real CLI, and checks real state: the exit code, exactly one error line naming the journal
and what is wrong, no traceback, and the kind, bytes, mode and owner of every file under the test's directory
(the site, the patch sets, and an ``outside`` directory holding a sentinel) the same before and after. Each
case here failed on main before this work (a9da0aa; docs/reliability.md lists how).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from t4patch.cli import main
from t4patch.fileio import atomic
from t4patch.patching import journal as jr
from tests.helpers import (
    CONFIG,
    CONFIG_PATCHED,
    DIST_INFO,
    KERNEL,
    KERNEL_PATCHED,
    SPEC,
    Env,
    make_dist,
    run_as_nobody,
    sha,
    site_args,
    tree,
)

REPO = Path(__file__).resolve().parents[2]
TOKEN = "0123456789abcdef"
JOURNAL_REFUSED = 18
PRECIOUS = b"precious: not t4patch's\n"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory outside the site with a sentinel file in it (symlinks and paths below point here)."""
    directory = tmp_path / "outside"
    directory.mkdir()
    (directory / "sentinel").write_bytes(PRECIOUS)
    return directory


def entry(path: Path, old: str | None, new: str | None, *, staged: Path | None = None, kept: Path | None = None,
          soft: bool = False, bytecode: bool = False) -> dict[str, Any]:
    return {"path": str(path), "old_sha256": old, "new_sha256": new, "staged": str(staged) if staged else None,
            "kept": str(kept) if kept else None, "soft": soft, "bytecode": bytecode}


def new_of(path: Path) -> Path:
    return jr.stand_in(path, TOKEN, jr.NEW_SUFFIX)


def old_of(path: Path) -> Path:
    return jr.stand_in(path, TOKEN, jr.OLD_SUFFIX)


def plant(env: Env, entries: list[dict[str, Any]], roots: list[Path] | None = None,
          patch_sets: list[str] | None = None) -> Path:
    """Write a journal of t4patch's schema into the site, as anyone who can write there could."""
    path = env.site / jr.JOURNAL_NAME
    path.write_text(json.dumps({
        "schema": 1, "kind": "t4patch intent journal", "token": TOKEN, "operation": "apply",
        "patch_sets": patch_sets or ["fakeengine==1.2.0"], "roots": [str(r) for r in (roots or [env.site])],
        "started_at": "2026-12-01T00:00:00+00:00", "pid": 4242, "entries": entries,
    }))
    return path


def started(env: Env) -> dict[str, Any]:
    """An entry that makes the journal look like a commit that had begun renaming: config.py holds the bytes
    the journal calls new (a recovery then finishes the rest)."""
    config = env.file("fakeengine/config.py")
    return entry(config, sha(b"not the config"), sha(config.read_bytes()))


def refused(cli, env: Env, tmp_path: Path, journal: Path, says: str, command: tuple[str, ...] = ("status",)) -> str:
    """Run ``command`` on the site: exit 18, one line naming ``journal`` and ``says``, nothing changed."""
    before = tree(tmp_path)
    result = cli(*command, *site_args(env))
    assert "Traceback" not in result.err and "internal error" not in result.err, result.err
    assert result.code == JOURNAL_REFUSED, result.err
    lines = result.err.strip().splitlines()
    assert len(lines) == 1, result.err
    assert str(journal) in lines[0] and says in lines[0], lines[0]
    assert "nothing was changed" in lines[0] and f"mv {journal} " in lines[0], lines[0]
    assert tree(tmp_path) == before, "a refused journal must leave every file, mode and owner as it was"
    return lines[0]


# ------------------------------------------------------------------------------------------ roots and sites


def test_root_elsewhere_is_refused(env: Env, tmp_path: Path, outside: Path, cli) -> None:
    """A journal whose one root is a directory above the site (so 'inside its root' means anywhere)."""
    journal = plant(env, [entry(outside / "sentinel", sha(PRECIOUS), None), started(env)], roots=[tmp_path])
    refused(cli, env, tmp_path, journal, "a journal for another directory")


def test_second_root_is_refused_and_not_recovered(env: Env, tmp_path: Path, outside: Path, cli) -> None:
    """The issue's case: other roots a journal names were locked and recovered too (the sentinel was deleted)."""
    journal = plant(env, [entry(outside / "sentinel", sha(PRECIOUS), None), started(env)],
                    roots=[env.site, outside])
    refused(cli, env, tmp_path, journal, "a journal naming 2 site-packages")
    assert (outside / "sentinel").read_bytes() == PRECIOUS


def test_journal_naming_another_site_is_refused(env: Env, tmp_path: Path, cli) -> None:
    """A journal that names another real site-packages (with the engine installed there, half patched)."""
    other = make_dist(tmp_path / "other-site")
    kernel = other / "fakeengine" / "kernel.py"
    new_of(kernel).write_text(KERNEL_PATCHED)
    (other / "fakeengine" / "config.py").write_text(CONFIG_PATCHED)
    journal = plant(env, [
        entry(kernel, sha(KERNEL.encode()), sha(KERNEL_PATCHED.encode()), staged=new_of(kernel), kept=old_of(kernel)),
        entry(other / "fakeengine" / "config.py", sha(CONFIG.encode()), sha(CONFIG_PATCHED.encode())),
    ], roots=[other])
    refused(cli, env, tmp_path, journal, f"({other}, not the {env.site} it was found in)")


# ------------------------------------------------------------------------------------------ paths out of the site


def test_path_escaping_with_dotdot_is_refused(env: Env, tmp_path: Path, outside: Path, cli) -> None:
    escaping = env.site / "fakeengine" / ".." / ".." / "outside" / "sentinel"
    journal = plant(env, [entry(escaping, sha(PRECIOUS), None), started(env)])
    refused(cli, env, tmp_path, journal, "a path outside its site-packages")


@pytest.mark.parametrize("body", [b"[" * 100_000 + b"]" * 100_000, b'{"schema": 1, "pid": 1e400}',
                                  b'{"schema": 1, "token": "0123456789abcdef", "roots": [], "entries": {}, '
                                  b'"operation": "apply", "patch_sets": [], "started_at": "", "pid": 1e400}'],
                         ids=["nested 100,000 deep", "no keys", "a pid of 1e400"])
def test_malformed_journal_is_refused_not_an_internal_error(env: Env, tmp_path: Path, cli, body: bytes) -> None:
    journal = env.site / jr.JOURNAL_NAME
    journal.write_bytes(body)
    refused(cli, env, tmp_path, journal, "expected an intent journal")


def test_path_with_a_nul_byte_is_refused(env: Env, tmp_path: Path, cli) -> None:
    """A NUL in a file name makes every os call raise ValueError: refused as a path, never an internal error."""
    journal = plant(env, [entry(env.file("fakeengine/kernel.py\0x"), sha(KERNEL.encode()), None), started(env)])
    refused(cli, env, tmp_path, journal, "a path with a NUL byte")


def test_stand_in_that_is_a_file_symlink_out_of_the_site_is_refused(env: Env, tmp_path: Path, outside: Path,
                                                                    cli) -> None:
    """kept -> a file outside with the pristine bytes: an undo would install a link to a file anyone with
    write access there can change later (today's code renamed the link over kernel.py)."""
    kernel = env.file("fakeengine/kernel.py")
    (outside / "kernel.py").write_text(KERNEL)
    kernel.write_text("# changed by someone\n")
    old_of(kernel).symlink_to(outside / "kernel.py")
    config = env.file("fakeengine/config.py")
    journal = plant(env, [
        entry(config, sha(CONFIG.encode()), sha(CONFIG_PATCHED.encode()), staged=new_of(config), kept=old_of(config)),
        entry(kernel, sha(KERNEL.encode()), sha(KERNEL_PATCHED.encode()), staged=new_of(kernel), kept=old_of(kernel)),
    ])
    refused(cli, env, tmp_path, journal, "a symlink to")
    assert not kernel.is_symlink()


def test_directory_symlink_on_the_way_is_refused(env: Env, tmp_path: Path, outside: Path, cli) -> None:
    """site/fakeengine/sub -> outside: a textual 'inside' check passed and the sentinel was deleted through it."""
    env.file("fakeengine/sub").symlink_to(outside, target_is_directory=True)
    journal = plant(env, [entry(env.file("fakeengine/sub/sentinel"), sha(PRECIOUS), None), started(env)])
    refused(cli, env, tmp_path, journal, "a directory symlink on the way")
    assert (outside / "sentinel").read_bytes() == PRECIOUS


def test_pycache_symlink_out_of_the_site_is_refused(env: Env, tmp_path: Path, outside: Path, cli) -> None:
    """A pinned module finishing with bytecode removal, its __pycache__ a link out: outside .pyc files stay."""
    (outside / "kernel.cpython-311.pyc").write_bytes(b"someone else's bytecode")
    env.file("fakeengine/__pycache__").symlink_to(outside, target_is_directory=True)
    kernel = env.file("fakeengine/kernel.py")
    config = env.file("fakeengine/config.py")
    config.write_text(CONFIG_PATCHED)
    new_of(kernel).write_text(KERNEL_PATCHED)
    journal = plant(env, [
        entry(kernel, sha(KERNEL.encode()), sha(KERNEL_PATCHED.encode()), staged=new_of(kernel), kept=old_of(kernel),
              bytecode=True),
        entry(config, sha(CONFIG.encode()), sha(CONFIG_PATCHED.encode()), staged=new_of(config), kept=old_of(config)),
    ])
    refused(cli, env, tmp_path, journal, "__pycache__, a directory symlink")
    assert (outside / "kernel.cpython-311.pyc").read_bytes() == b"someone else's bytecode"


def test_commit_leaves_bytecode_behind_a_pycache_symlink_out_of_the_site(env: Env, outside: Path, cli) -> None:
    """The commit removes stale bytecode too: never through a __pycache__ that leads out of the site."""
    (outside / "kernel.cpython-311.pyc").write_bytes(b"someone else's bytecode")
    env.file("fakeengine/__pycache__").symlink_to(outside, target_is_directory=True)
    assert cli("apply", SPEC, *site_args(env)).code == 0
    assert cli("revert", SPEC, *site_args(env)).code == 0
    assert (outside / "kernel.cpython-311.pyc").read_bytes() == b"someone else's bytecode"


# ------------------------------------------------------------------------------------------ files and bytes


def test_unpinned_file_such_as_record_is_refused(env: Env, tmp_path: Path, cli) -> None:
    """Deleting RECORD (not a [[target]] of any set): today's code removed it."""
    record = env.file(f"{DIST_INFO}/RECORD")
    journal = plant(env, [entry(record, sha(record.read_bytes()), None), started(env)])
    refused(cli, env, tmp_path, journal, "a delete of")
    assert record.exists()


def test_unpinned_file_replaced_from_a_stand_in_is_refused(env: Env, tmp_path: Path, cli) -> None:
    """__init__.py (a file of the engine no set pins) given new bytes from a planted stand-in."""
    init = env.file("fakeengine/__init__.py")
    new_of(init).write_text("import os; os.system('id')\n")
    journal = plant(env, [entry(init, sha(init.read_bytes()), sha(new_of(init).read_bytes()), staged=new_of(init),
                                kept=old_of(init)), started(env)])
    refused(cli, env, tmp_path, journal, "a file no patch set it names pins")


def test_pinned_target_with_bytes_matching_neither_hash_is_refused(env: Env, tmp_path: Path, cli) -> None:
    """kernel.py is pinned, but the journal's new sha256 is of other bytes: today's code installed them."""
    kernel = env.file("fakeengine/kernel.py")
    config = env.file("fakeengine/config.py")
    evil = b"import os; os.system('id')\n"
    new_of(kernel).write_bytes(evil)
    config.write_text(CONFIG_PATCHED)  # the set looks half applied
    journal = plant(env, [
        entry(kernel, sha(KERNEL.encode()), sha(evil), staged=new_of(kernel), kept=old_of(kernel)),
        entry(config, sha(CONFIG.encode()), sha(CONFIG_PATCHED.encode()), staged=new_of(config), kept=old_of(config)),
    ])
    refused(cli, env, tmp_path, journal, "recovery would install or keep bytes of neither")
    assert kernel.read_text() == KERNEL


def test_delete_of_a_file_t4patch_did_not_create_is_refused(env: Env, tmp_path: Path, cli) -> None:
    """A package file no set pins, deleted by a 'finish'."""
    init = env.file("fakeengine/__init__.py")
    journal = plant(env, [entry(init, sha(init.read_bytes()), None), started(env)])
    refused(cli, env, tmp_path, journal, "a file t4patch did not create")
    assert init.exists()


def test_state_record_entry_holding_someone_elses_file_is_refused(env: Env, tmp_path: Path, cli) -> None:
    """t4patch.json's name, but not t4patch's record: an undo would delete it."""
    record = env.file(f"{DIST_INFO}/t4patch.json")
    record.write_bytes(PRECIOUS)
    config = env.file("fakeengine/config.py")
    journal = plant(env, [
        entry(config, sha(CONFIG.encode()), sha(CONFIG_PATCHED.encode()), staged=new_of(config), kept=old_of(config)),
        entry(record, None, sha(b"{}"), staged=new_of(record), soft=True),
    ])
    refused(cli, env, tmp_path, journal, "recovery moves or removes only t4patch's own record")
    assert record.read_bytes() == PRECIOUS


def test_state_record_entry_outside_the_dist_info_is_refused(env: Env, tmp_path: Path, cli) -> None:
    """The record's 'soft' entry naming another file (soft entries never blocked, so anything could go)."""
    init = env.file("fakeengine/__init__.py")
    journal = plant(env, [entry(init, sha(init.read_bytes()), None, soft=True), started(env)])
    refused(cli, env, tmp_path, journal, "given as the state record")


def test_journal_of_a_set_the_tree_does_not_have_is_refused(env: Env, tmp_path: Path, cli) -> None:
    journal = plant(env, [started(env)], patch_sets=["fakeengine==9.9.9"])
    refused(cli, env, tmp_path, journal, "which the patch-set tree in use does not have")


def test_journal_naming_more_sets_than_a_commit_does_is_refused(env: Env, tmp_path: Path, cli) -> None:
    """Each named set is looked up in the tree: a journal naming thousands would stall every command."""
    journal = plant(env, [started(env)], patch_sets=[f"fakeengine==1.{i}.0" for i in range(1000)])
    refused(cli, env, tmp_path, journal, "a journal that names 1000 patch sets")


def test_every_command_aimed_at_the_site_refuses_it(env: Env, tmp_path: Path, outside: Path, cli) -> None:
    """apply, revert and a dry run recover first too: each refuses the planted journal the same way."""
    env.file("fakeengine/sub").symlink_to(outside, target_is_directory=True)
    journal = plant(env, [entry(env.file("fakeengine/sub/sentinel"), sha(PRECIOUS), None), started(env)])
    for command in (("apply", SPEC), ("revert", SPEC), ("apply", SPEC, "--dry-run")):
        refused(cli, env, tmp_path, journal, "a directory symlink on the way", command)


def test_giant_journal_is_refused_unread(env: Env, tmp_path: Path, cli) -> None:
    """A planted journal of 64 MiB (sparse: no disk used) is refused by its size, never read into memory."""
    journal = env.site / jr.JOURNAL_NAME
    with open(journal, "wb") as handle:
        handle.truncate(64 << 20)
    refused(cli, env, tmp_path, journal, "more than a journal of any shipped set holds")


# ------------------------------------------------------------------------------------------ recovery still works


def test_a_legitimate_journal_is_still_finished(env: Env, tmp_path: Path, cli) -> None:
    """The same checks pass a journal as a killed commit leaves it: pinned hashes, t4patch's stand-ins, its
    record staged; status finishes it and the set is whole."""
    kernel, config = env.file("fakeengine/kernel.py"), env.file("fakeengine/config.py")
    record = env.file(f"{DIST_INFO}/t4patch.json")
    assert cli("apply", SPEC, *site_args(env)).code == 0
    record_bytes = record.read_bytes()
    assert cli("revert", SPEC, *site_args(env)).code == 0
    os.link(kernel, old_of(kernel))
    new_of(kernel).write_text(KERNEL_PATCHED)
    os.replace(new_of(kernel), kernel)  # renamed already
    new_of(config).write_text(CONFIG_PATCHED)  # staged, not yet renamed
    os.link(config, old_of(config))
    new_of(record).write_bytes(record_bytes)
    plant(env, [
        {**entry(kernel, sha(KERNEL.encode()), sha(KERNEL_PATCHED.encode()), staged=new_of(kernel),
                 kept=old_of(kernel), bytecode=True), "patch_set": "fakeengine==1.2.0"},
        {**entry(config, sha(CONFIG.encode()), sha(CONFIG_PATCHED.encode()), staged=new_of(config),
                 kept=old_of(config)), "patch_set": "fakeengine==1.2.0"},
        {**entry(record, None, sha(record_bytes), staged=new_of(record), soft=True), "patch_set": "fakeengine==1.2.0"},
    ])
    result = cli("status", *site_args(env))
    assert result.code == 0, result.err
    assert "finished it" in result.err
    assert kernel.read_text() == KERNEL_PATCHED and config.read_text() == CONFIG_PATCHED
    assert record.read_bytes() == record_bytes
    assert not any(".t4patch-" in p.name for p in env.site.rglob("*"))


POOL: list[Any] = [None, 0, -1, 2**70, float("inf"), True, "", "x" * 5000, [], {}, [None], {"a": 1}, "/", "..",
                   "\0", "fakeengine==1.2.0", "0" * 64, "0123456789abcdef"]


def test_mutated_journals_never_end_in_an_internal_error(env: Env, tmp_path: Path, outside: Path, cli) -> None:
    """300 seeded mutations of a legitimate journal (a field replaced by a hostile value, or dropped): exit 0,
    3 or 18, never 70; the sentinel outside never touched; a refusal changes nothing; a success leaves every
    target with pinned bytes and no journal or temp file behind."""
    import random
    import shutil

    kernel, config = env.file("fakeengine/kernel.py"), env.file("fakeengine/config.py")
    pool = [*POOL, str(outside / "sentinel"), str(outside), str(env.site), str(env.file("fakeengine/__init__.py")),
            sha(PRECIOUS), sha(KERNEL.encode()), sha(CONFIG_PATCHED.encode())]
    pristine = tmp_path / "pristine-site"
    shutil.copytree(env.site, pristine, symlinks=True)
    rng = random.Random(22)
    codes: dict[int, int] = {}
    for trial in range(300):
        shutil.rmtree(env.site)
        shutil.copytree(pristine, env.site, symlinks=True)
        os.link(kernel, old_of(kernel))
        new_of(kernel).write_text(KERNEL_PATCHED)
        os.replace(new_of(kernel), kernel)
        new_of(config).write_text(CONFIG_PATCHED)
        os.link(config, old_of(config))
        entries = [
            {**entry(kernel, sha(KERNEL.encode()), sha(KERNEL_PATCHED.encode()), staged=new_of(kernel),
                     kept=old_of(kernel), bytecode=True), "patch_set": "fakeengine==1.2.0"},
            {**entry(config, sha(CONFIG.encode()), sha(CONFIG_PATCHED.encode()), staged=new_of(config),
                     kept=old_of(config)), "patch_set": "fakeengine==1.2.0"},
        ]
        journal = plant(env, entries)
        doc = json.loads(journal.read_text())
        for _ in range(rng.randint(1, 3)):
            holder: dict[str, Any] = doc if rng.random() < 0.3 else rng.choice(doc["entries"]) \
                if isinstance(doc.get("entries"), list) and doc["entries"] and all(
                    isinstance(e, dict) for e in doc["entries"]) else doc
            key = rng.choice(sorted(holder))
            if rng.random() < 0.15:
                del holder[key]
            else:
                holder[key] = rng.choice(pool)
        journal.write_text(json.dumps(doc))
        before = tree(tmp_path)
        result = cli("status", *site_args(env))
        codes[result.code] = codes.get(result.code, 0) + 1
        where = f"trial {trial}: {json.dumps(doc)[:600]}: {result.err}"
        assert result.code in (0, 3, 18), where
        assert "Traceback" not in result.err and "internal error" not in result.err, where
        assert (outside / "sentinel").read_bytes() == PRECIOUS and sorted(os.listdir(outside)) == ["sentinel"], where
        if result.code != 0:
            assert tree(tmp_path) == before, where
        else:  # recovery renamed only pinned bytes into place (a journal naming one file leaves the other)
            assert sha(kernel.read_bytes()) in (sha(KERNEL.encode()), sha(KERNEL_PATCHED.encode())), where
            assert sha(config.read_bytes()) in (sha(CONFIG.encode()), sha(CONFIG_PATCHED.encode())), where
            assert not os.path.lexists(journal) and not any(".t4patch-" in n.name for n in env.site.rglob("*")), where
    assert codes.get(18, 0) > 100, codes  # most mutations are refused; some (a date, a pid) still recover


def test_each_site_packages_gets_a_journal_naming_only_itself(tmp_path: Path) -> None:
    """A commit across two site-packages writes into each a journal of that directory alone."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    entries = [jr.Entry(a / "x.py", None, sha(b"x"), None, None, patch_set="one==1"),
               jr.Entry(b / "y.py", None, sha(b"y"), None, None, patch_set="two==2")]
    journal = jr.Journal.create("apply", ["one==1", "two==2"], [a, b], entries, TOKEN)
    journal.write()
    for root, name, spec in ((a, "x.py", "one==1"), (b, "y.py", "two==2")):
        doc = json.loads((root / jr.JOURNAL_NAME).read_text())
        assert doc["roots"] == [str(root)] and doc["patch_sets"] == [spec]
        assert [e["path"] for e in doc["entries"]] == [str(root / name)]
    journal.remove()
    assert not (a / jr.JOURNAL_NAME).exists() and not (b / jr.JOURNAL_NAME).exists()


# ------------------------------------------------------------------------------------------ the smaller points


def test_dist_info_symlinked_out_of_the_site_gets_no_record(env: Env, tmp_path: Path, outside: Path, cli) -> None:
    """The state record's directory is checked as target directories are: exit 3, nothing written anywhere."""
    real = outside / DIST_INFO
    env.file(DIST_INFO).rename(real)
    env.file(DIST_INFO).symlink_to(real, target_is_directory=True)
    before = tree(tmp_path)
    result = cli("apply", SPEC, *site_args(env))
    assert result.code == 3, result.err
    assert len(result.err.strip().splitlines()) == 1 and "lies outside the target" in result.err, result.err
    assert tree(tmp_path) == before and not (real / "t4patch.json").exists()


@pytest.mark.parametrize("errno_name", ["ENOSPC", "EIO"])
def test_failed_journal_fsync_leaves_no_journal(env: Env, tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch,
                                                errno_name: str) -> None:
    """ENOSPC/EIO at the directory fsync after the journal's rename: 'nothing was changed' and no journal left."""
    import errno

    real = atomic.fsync_dir

    def failing(directory: Path) -> None:
        if (directory / jr.JOURNAL_NAME).exists():
            raise OSError(getattr(errno, errno_name), os.strerror(getattr(errno, errno_name)), str(directory))
        real(directory)

    monkeypatch.setattr(atomic, "fsync_dir", failing)
    before = tree(tmp_path)
    result = cli("apply", SPEC, *site_args(env))
    assert result.code == 3 and "nothing was changed" in result.err, result.err
    assert len(result.err.strip().splitlines()) == 1, result.err
    assert not os.path.lexists(env.site / jr.JOURNAL_NAME)
    assert tree(tmp_path) == before


def test_dangling_manifest_symlink_is_a_data_error(env: Env, tmp_path: Path, cli) -> None:
    """That release's set must not silently disappear ('has patch sets for ... only'): exit 7 naming the file."""
    manifest = env.patches / "fakeengine" / "1.2.0" / "manifest.toml"
    manifest.unlink()
    manifest.symlink_to(tmp_path / "nowhere.toml")
    for command in (("status",), ("apply", SPEC)):
        before = tree(tmp_path)
        result = cli(*command, *site_args(env))
        assert result.code == 7, result.err
        assert len(result.err.strip().splitlines()) == 1 and str(manifest) in result.err, result.err
        assert "does not exist" in result.err
        assert tree(tmp_path) == before
    result = cli("list")
    assert result.code == 7 and str(manifest) in result.err, result.err


@pytest.mark.parametrize("unreadable", ["manifest", "version directory"])
def test_unreadable_manifest_is_a_data_error(shared_env: Env, tmp_path: Path, unreadable: str) -> None:
    """A manifest (or its release's directory) this user may not read: exit 7 naming it, as a child running as
    nobody sees it, never a release that is not there."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run a child as another user")
    manifest = shared_env.patches / "fakeengine" / "1.2.0" / "manifest.toml"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        # warm: the child imports nothing new (the interpreter's own files may be unreadable to nobody)
        assert main(["status", "--site-packages", str(shared_env.site)]) == 0
    (manifest if unreadable == "manifest" else manifest.parent).chmod(0)
    stderr = tmp_path / "stderr"
    code = run_as_nobody(["status", "--site-packages", str(shared_env.site)], stderr)
    text = stderr.read_text()
    assert code == 7 and text.count("\n") == 1 and str(manifest) in text, text


def test_missing_temp_files_are_named_not_called_foreign(env: Env, tmp_path: Path, cli) -> None:
    """A killed commit's journal whose temp files someone removed: the set is mixed (kernel new, config old)
    and can be neither finished nor undone; the refusal names the journal and the missing temp files."""
    kernel, config = env.file("fakeengine/kernel.py"), env.file("fakeengine/config.py")
    kernel.write_text(KERNEL_PATCHED)
    journal = plant(env, [
        {**entry(kernel, sha(KERNEL.encode()), sha(KERNEL_PATCHED.encode()), staged=new_of(kernel),
                 kept=old_of(kernel)), "patch_set": "fakeengine==1.2.0"},
        {**entry(config, sha(CONFIG.encode()), sha(CONFIG_PATCHED.encode()), staged=new_of(config),
                 kept=old_of(config)), "patch_set": "fakeengine==1.2.0"},
    ])
    before = tree(tmp_path)
    result = cli("status", *site_args(env))
    assert result.code == 3, result.err
    line = result.err.strip()
    assert len(line.splitlines()) == 1 and str(journal) in line, line
    assert "missing" in line and str(new_of(config)) in line and str(old_of(kernel)) in line, line
    assert "match neither" not in line and "no file is foreign" in line, line
    assert "--force-reinstall --no-deps fakeengine==1.2.0" in line, line
    assert tree(tmp_path) == before


def test_file_changed_since_the_crash_is_named(env: Env, tmp_path: Path, cli) -> None:
    """A journal whose file someone changed after the kill (neither hash, no stand-in holds either): exit 3
    naming the file and what it hashes to, the reinstall command, and nothing touched."""
    kernel, config = env.file("fakeengine/kernel.py"), env.file("fakeengine/config.py")
    kernel.write_text("# edited after the crash\n")
    journal = plant(env, [
        {**entry(kernel, sha(KERNEL.encode()), sha(KERNEL_PATCHED.encode()), staged=new_of(kernel),
                 kept=old_of(kernel)), "patch_set": "fakeengine==1.2.0"},
        {**entry(config, sha(CONFIG.encode()), sha(CONFIG_PATCHED.encode()), staged=new_of(config),
                 kept=old_of(config)), "patch_set": "fakeengine==1.2.0"},
    ])
    before = tree(tmp_path)
    result = cli("status", *site_args(env))
    line = result.err.strip()
    assert result.code == 3 and len(line.splitlines()) == 1 and str(journal) in line, line
    assert f"{kernel} ({sha(kernel.read_bytes())})" in line and "changed since that run died" in line, line
    assert "--force-reinstall --no-deps fakeengine==1.2.0" in line, line
    assert tree(tmp_path) == before


def test_ctrl_c_during_start_up_is_one_line(env: Env) -> None:
    """SIGINT while the parser imports the command modules: exit 130, one line, no KeyboardInterrupt traceback."""
    code = (
        "import importlib, os, signal, sys\n"
        "from t4patch import cli\n"
        "real = importlib.import_module\n"
        "def interrupted(name, *a):\n"
        "    if name.startswith('t4patch.commands.'):\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "    return real(name, *a)\n"
        "cli.importlib.import_module = interrupted\n"
        f"sys.exit(cli.main(['status', '--site-packages', {str(env.site)!r}]))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 130, result.stderr
    assert result.stderr == "t4patch: interrupted\n", result.stderr
