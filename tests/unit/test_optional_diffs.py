"""Optional diffs end to end on the synthetic engine: apply --with, status, status --check --with, revert.

The synthetic set here has the two default diffs of tests/helpers.py plus 0003, an optional diff named
``small-window`` that is the only diff of fakeengine/extra.py. Every test checks bytes on disk and the state
record, not only exit codes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from t4patch.errors import ForeignFileError, NotAppliedError, UsageError
from t4patch.patching.local_version import label_for
from t4patch.patching.manifest import load_patch_set
from t4patch.patching.state import record_document
from tests.helpers import CONFIG, CONFIG_PATCHED, KERNEL, KERNEL_PATCHED, Env, make_dist, make_patch_set, sha

EXTRA = "WINDOW = 4096\n"
EXTRA_PATCHED = "WINDOW = 1024\n"
OPTION = "small-window"
RECORD_FILE = "fakeengine-1.2.0.dist-info/t4patch.json"


@pytest.fixture
def opt_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Env:
    """fakeengine 1.2.0 with a third file, and its set with 0003 optional (``small-window``)."""
    site = make_dist(tmp_path / "site", files={
        "fakeengine/__init__.py": "", "fakeengine/kernel.py": KERNEL, "fakeengine/config.py": CONFIG,
        "fakeengine/extra.py": EXTRA,
    })
    patches = tmp_path / "patches"
    directory = make_patch_set(patches, changes=[("fakeengine/kernel.py", KERNEL, KERNEL_PATCHED),
                                                 ("fakeengine/config.py", CONFIG, CONFIG_PATCHED),
                                                 ("fakeengine/extra.py", EXTRA, EXTRA_PATCHED)])
    manifest = directory / "manifest.toml"
    manifest.write_text(manifest.read_text().replace('file = "0003-change-3.diff"',
                                                     f'file = "0003-change-3.diff"\noptional = "{OPTION}"'))
    monkeypatch.setenv("T4PATCH_PATCHES", str(patches))
    return Env(site, patches)


def at(env: Env) -> list[str]:
    return ["--site-packages", str(env.site)]


def texts(env: Env) -> tuple[str, ...]:
    return tuple(env.file(f"fakeengine/{n}.py").read_text() for n in ("kernel", "config", "extra"))


def record(env: Env) -> dict:
    return json.loads((env.site / RECORD_FILE).read_text())


def status_doc(cli, env: Env) -> dict:
    result = cli("status", "fakeengine", "--json", *at(env))
    assert result.code == 0, result.err
    (engine,) = json.loads(result.out)["engines"]
    return engine


def test_a_plain_apply_leaves_the_option_off(opt_env: Env, cli) -> None:
    result = cli("apply", "fakeengine", *at(opt_env))
    assert result.code == 0, result.err
    assert "fakeengine==1.2.0: applied, 2 file(s) written" in result.out
    assert texts(opt_env) == (KERNEL_PATCHED, CONFIG_PATCHED, EXTRA)
    assert record(opt_env)["options"] == []
    engine = status_doc(cli, opt_env)
    assert engine["state"] == "applied"
    assert [f["path"] for f in engine["files"]] == ["fakeengine/kernel.py", "fakeengine/config.py"]
    (option,) = engine["options"]
    assert option["name"] == OPTION and option["state"] == "not-applied" and option["patch"] == "0003-change-3.diff"
    assert [(f["path"], f["state"]) for f in option["files"]] == [("fakeengine/extra.py", "pristine")]
    text = cli("status", *at(opt_env)).out
    assert (f"optional {OPTION}: not-applied; off, as by default; to turn it on: t4patch apply fakeengine==1.2.0 "
            f"--with {OPTION}") in text
    # options are optional: --check passes on the default set; --check --with requires the option
    assert cli("status", "--check", *at(opt_env)).code == 0
    strict = cli("status", "--check", "--with", OPTION, *at(opt_env))
    assert strict.code == NotAppliedError.exit_code
    assert f"fakeengine (optional {OPTION} not-applied)" in strict.err
    assert f"t4patch apply fakeengine==1.2.0 --with {OPTION}" in strict.err


def test_apply_with_on_an_applied_install_writes_only_the_option_files(opt_env: Env, cli) -> None:
    assert cli("apply", "fakeengine", *at(opt_env)).code == 0
    kernel_inode = opt_env.file("fakeengine/kernel.py").stat().st_ino
    before = opt_env.snapshot()

    result = cli("apply", "fakeengine", "--with", OPTION, *at(opt_env))
    assert result.code == 0, result.err
    assert f"fakeengine==1.2.0 with {OPTION}: applied, 1 file(s) written" in result.out
    after = opt_env.snapshot()
    changed = {p for p in set(before) | set(after) if before.get(p) != after.get(p)}
    assert changed == {"fakeengine/extra.py", RECORD_FILE}
    assert opt_env.file("fakeengine/kernel.py").stat().st_ino == kernel_inode  # not rewritten
    assert texts(opt_env) == (KERNEL_PATCHED, CONFIG_PATCHED, EXTRA_PATCHED)
    doc = record(opt_env)
    assert doc["options"] == [OPTION] and doc["patches"][-1] == "0003-change-3.diff"
    assert {f["path"] for f in doc["files"]} == {"fakeengine/kernel.py", "fakeengine/config.py", "fakeengine/extra.py"}

    engine = status_doc(cli, opt_env)
    assert engine["state"] == "applied" and engine["options"][0]["state"] == "applied"
    text = cli("status", *at(opt_env)).out
    assert f"optional {OPTION}: applied; every file patched" in text
    assert f"record: fakeengine==1.2.0 with {OPTION} applied" in text
    assert cli("status", "--check", "--with", OPTION, *at(opt_env)).code == 0

    again = cli("apply", "fakeengine", "--with", OPTION, *at(opt_env))
    assert again.code == 0 and f"fakeengine==1.2.0 with {OPTION}: already applied, nothing to do" in again.out
    assert opt_env.snapshot() == after


def test_apply_with_on_a_pristine_install_applies_everything_at_once(opt_env: Env, cli) -> None:
    result = cli("apply", "fakeengine==1.2.0", "--with", OPTION, "--json", *at(opt_env))
    assert result.code == 0, result.err
    (entry,) = json.loads(result.out)["results"]
    assert entry["options"] == [OPTION] and entry["options_kept"] == []
    assert [(f["path"], f["action"]) for f in entry["files"]] == [
        ("fakeengine/kernel.py", "write"), ("fakeengine/config.py", "write"), ("fakeengine/extra.py", "write")]
    assert texts(opt_env) == (KERNEL_PATCHED, CONFIG_PATCHED, EXTRA_PATCHED)


def test_a_plain_apply_keeps_an_applied_option_and_says_so(opt_env: Env, cli) -> None:
    assert cli("apply", "fakeengine", "--with", OPTION, *at(opt_env)).code == 0
    everything = opt_env.snapshot()
    noop = cli("apply", "fakeengine", *at(opt_env))
    assert noop.code == 0
    assert f"fakeengine==1.2.0 with {OPTION}: already applied, nothing to do" in noop.out
    assert f"optional {OPTION} was already applied and is left applied" in noop.out
    assert opt_env.snapshot() == everything

    opt_env.file("fakeengine/config.py").write_text(CONFIG)  # e.g. one file reinstalled: the plain apply finishes it
    result = cli("apply", "fakeengine", "--json", *at(opt_env))
    assert result.code == 0, result.err
    (entry,) = json.loads(result.out)["results"]
    assert entry["options"] == [OPTION] and entry["options_kept"] == [OPTION]
    assert [f["path"] for f in entry["files"] if f["action"] == "write"] == ["fakeengine/config.py"]
    assert texts(opt_env) == (KERNEL_PATCHED, CONFIG_PATCHED, EXTRA_PATCHED)
    assert record(opt_env)["options"] == [OPTION]  # the rewritten record still names the option that is on


def test_dry_run_with_prints_only_the_option_diff_and_writes_nothing(opt_env: Env, cli) -> None:
    assert cli("apply", "fakeengine", *at(opt_env)).code == 0
    before = opt_env.snapshot()
    result = cli("apply", "fakeengine", "--with", OPTION, "--dry-run", *at(opt_env))
    assert result.code == 0, result.err
    assert f"fakeengine==1.2.0 with {OPTION}: would apply 1 file(s)" in result.out
    assert "-WINDOW = 4096" in result.out and "+WINDOW = 1024" in result.out
    assert "MIN_CAPABILITY" not in result.out
    assert opt_env.snapshot() == before


def test_revert_takes_back_every_file_t4patch_patched_options_included(opt_env: Env, cli) -> None:
    pristine = opt_env.snapshot()
    assert cli("apply", "fakeengine", "--with", OPTION, *at(opt_env)).code == 0
    result = cli("revert", "fakeengine", *at(opt_env))
    assert result.code == 0, result.err
    assert f"fakeengine==1.2.0 with {OPTION}: reverted, 3 file(s) written" in result.out
    assert opt_env.snapshot() == pristine  # every byte, and the record gone
    engine = status_doc(cli, opt_env)
    assert engine["state"] == "not-applied" and engine["options"][0]["state"] == "not-applied"
    again = cli("revert", "fakeengine", *at(opt_env))
    assert again.code == 0 and "fakeengine==1.2.0: already pristine, nothing to do" in again.out


def test_revert_after_a_plain_apply_leaves_an_untouched_option_file_alone(opt_env: Env, cli) -> None:
    """An option none of whose files is patched is not t4patch's to revert, even if its file was edited."""
    assert cli("apply", "fakeengine", *at(opt_env)).code == 0
    opt_env.file("fakeengine/extra.py").write_text("WINDOW = 7  # edited by hand\n")
    result = cli("revert", "fakeengine", *at(opt_env))
    assert result.code == 0, result.err
    assert "fakeengine==1.2.0: reverted, 2 file(s) written" in result.out
    assert texts(opt_env) == (KERNEL, CONFIG, "WINDOW = 7  # edited by hand\n")
    engine = status_doc(cli, opt_env)
    assert engine["options"][0]["state"] == "foreign"
    strict = cli("status", "--check", "--with", OPTION, *at(opt_env))
    assert strict.code == NotAppliedError.exit_code and "reinstall" in strict.err.lower()


def test_apply_with_refuses_a_foreign_option_file_and_writes_nothing(opt_env: Env, cli) -> None:
    opt_env.file("fakeengine/extra.py").write_text("WINDOW = 7\n")
    before = opt_env.snapshot()
    result = cli("apply", "fakeengine", "--with", OPTION, *at(opt_env))
    assert result.code == ForeignFileError.exit_code
    assert "extra.py was changed by something other than t4patch" in result.err
    assert opt_env.snapshot() == before  # all or nothing: the default files were not written either
    plain = cli("apply", "fakeengine", *at(opt_env))  # the default set does not touch that file
    assert plain.code == 0 and texts(opt_env)[:2] == (KERNEL_PATCHED, CONFIG_PATCHED)


def test_an_unknown_with_name_is_a_one_line_usage_error(opt_env: Env, cli) -> None:
    before = opt_env.snapshot()
    for argv in (("apply", "fakeengine", "--with", "small-windw"),
                 ("apply", "fakeengine", "--with", OPTION, "--with", "nope", "--dry-run")):
        result = cli(*argv, *at(opt_env))
        assert result.code == UsageError.exit_code
        (line,) = result.err.strip().splitlines()
        assert f"fakeengine==1.2.0: {OPTION}" in line and "t4patch list" in line and "Traceback" not in line
    assert opt_env.snapshot() == before
    status = cli("status", "--check", "--with", "nope", *at(opt_env))
    assert status.code == UsageError.exit_code and f"fakeengine==1.2.0: {OPTION}" in status.err
    no_check = cli("status", "--with", OPTION, *at(opt_env))
    assert no_check.code == UsageError.exit_code and "expected --check" in no_check.err


def test_with_applies_to_the_selected_sets_that_have_the_option(opt_env: Env, cli) -> None:
    """Two engines, one of whose sets has the option: --with turns it on there; naming only the other is an error."""
    make_dist(opt_env.site, name="otherengine")
    make_patch_set(opt_env.patches, name="otherengine")
    alone = cli("apply", "otherengine", "--with", OPTION, *at(opt_env))
    assert alone.code == UsageError.exit_code and "otherengine==1.2.0: none" in alone.err
    assert not (opt_env.site / "otherengine-1.2.0.dist-info" / "t4patch.json").exists()

    both = cli("apply", "otherengine", "fakeengine", "--with", OPTION, *at(opt_env))
    assert both.code == 0, both.err
    assert "otherengine==1.2.0: applied, 2 file(s) written" in both.out
    assert f"fakeengine==1.2.0 with {OPTION}: applied, 3 file(s) written" in both.out
    assert cli("status", "--check", "--with", OPTION, *at(opt_env)).code == 0


def test_the_record_and_the_wheel_label_name_the_options(opt_env: Env) -> None:
    """What `t4patch wheel --with` builds on: the state record lists the options, and the label's N differs."""
    ps = load_patch_set(opt_env.patches / "fakeengine" / "1.2.0")
    plain = record_document(ps, applied_at="2026-01-01T00:00:00+00:00")
    chosen_set = ps.with_options([OPTION])
    chosen = record_document(chosen_set, applied_at="2026-01-01T00:00:00+00:00")
    assert json.loads(plain)["options"] == [] and json.loads(chosen)["options"] == [OPTION]
    assert label_for(ps, plain) != label_for(chosen_set, chosen)
    assert {f["path"]: f["patched_sha256"] for f in json.loads(chosen)["files"]}["fakeengine/extra.py"] == sha(
        EXTRA_PATCHED.encode())
