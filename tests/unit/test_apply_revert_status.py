"""apply / status / revert on a synthetic installed engine: the semantics users rely on."""

from __future__ import annotations

import json
import os
from pathlib import Path

from t4patch.errors import (
    ForeignFileError,
    NotAppliedError,
    NotInstalledError,
    UnsupportedVersionError,
)
from tests.helpers import CONFIG, CONFIG_PATCHED, KERNEL, KERNEL_PATCHED, record_hash, sha


def site_args(env):
    return ["--site-packages", str(env.site)]


def test_apply_writes_patched_bytes_and_record(env, cli):
    pyc = env.site / "fakeengine" / "__pycache__" / "kernel.cpython-311.pyc"
    pyc.parent.mkdir()
    pyc.write_bytes(b"stale")
    before_mode = os.stat(env.file("fakeengine/kernel.py")).st_mode

    result = cli("apply", "fakeengine==1.2.0", *site_args(env))

    assert result.code == 0, result.err
    assert "applied, 2 file(s) written" in result.out
    assert env.file("fakeengine/kernel.py").read_text() == KERNEL_PATCHED
    assert env.file("fakeengine/config.py").read_text() == CONFIG_PATCHED
    assert not pyc.exists(), "stale bytecode of a patched module must be removed"
    assert os.stat(env.file("fakeengine/kernel.py")).st_mode == before_mode
    record = json.loads((env.site / "fakeengine-1.2.0.dist-info" / "t4patch.json").read_text())
    assert record["schema"] == 1 and record["patch_set"] == "fakeengine==1.2.0"
    assert {f["path"]: f["patched_sha256"] for f in record["files"]}["fakeengine/config.py"] == sha(
        CONFIG_PATCHED.encode()
    )
    leftovers = [p.name for p in env.site.rglob("*t4patch-tmp*")]
    assert leftovers == []


def test_apply_is_idempotent(env, cli):
    assert cli("apply", "fakeengine", *site_args(env)).code == 0
    snapshot = env.snapshot()
    again = cli("apply", "fakeengine", *site_args(env))
    assert again.code == 0
    assert "already applied, nothing to do" in again.out
    assert env.snapshot() == snapshot


def test_dry_run_prints_diff_and_touches_nothing(env, cli):
    snapshot = env.snapshot()
    result = cli("apply", "fakeengine", "--dry-run", *site_args(env))
    assert result.code == 0
    assert "+    if capability < (8, 0):" in result.out
    assert "-MIN_CAPABILITY = 80" in result.out and "+MIN_CAPABILITY = 75" in result.out
    assert env.snapshot() == snapshot


def test_status_reports_each_state_and_check_exit_codes(env, cli):
    pristine = cli("status", "fakeengine", "--json", *site_args(env))
    doc = json.loads(pristine.out)
    assert doc["schema"] == 1 and doc["command"] == "status"
    assert doc["engines"][0]["state"] == "not-applied"
    assert {f["state"] for f in doc["engines"][0]["files"]} == {"pristine"}

    check = cli("status", "fakeengine", "--check", *site_args(env))
    assert check.code == NotAppliedError.exit_code
    assert "t4patch apply fakeengine==1.2.0" in check.err

    cli("apply", "fakeengine", *site_args(env))
    applied = cli("status", "--check", *site_args(env))
    assert applied.code == 0 and "fakeengine 1.2.0: applied" in applied.out

    env.file("fakeengine/config.py").write_text("edited by hand\n")
    env.file("fakeengine/kernel.py").unlink()
    mixed = json.loads(cli("status", "--json", *site_args(env)).out)["engines"][0]
    assert mixed["state"] == "foreign"
    states = {f["path"]: f["state"] for f in mixed["files"]}
    assert states == {"fakeengine/kernel.py": "missing", "fakeengine/config.py": "foreign"}
    assert cli("status", "--check", *site_args(env)).code == NotAppliedError.exit_code


def test_partial_state_is_finished_by_apply(env, cli):
    env.file("fakeengine/config.py").write_text(CONFIG_PATCHED)
    doc = json.loads(cli("status", "--json", *site_args(env)).out)
    assert doc["engines"][0]["state"] == "partial"
    assert cli("apply", "fakeengine", *site_args(env)).code == 0
    assert env.file("fakeengine/kernel.py").read_text() == KERNEL_PATCHED


def test_revert_restores_pristine_bytes(env, cli):
    original = env.snapshot()
    assert cli("apply", "fakeengine", *site_args(env)).code == 0
    result = cli("revert", "fakeengine", *site_args(env))
    assert result.code == 0 and "reverted, 2 file(s)" in result.out
    assert env.snapshot() == original
    assert "already pristine" in cli("revert", "fakeengine", *site_args(env)).out


def test_revert_dry_run_shows_reverse_diff(env, cli):
    cli("apply", "fakeengine", *site_args(env))
    snapshot = env.snapshot()
    result = cli("revert", "fakeengine", "--dry-run", *site_args(env))
    assert result.code == 0 and "-MIN_CAPABILITY = 75" in result.out and "+MIN_CAPABILITY = 80" in result.out
    assert env.snapshot() == snapshot


def test_foreign_file_refuses_everything_and_writes_nothing(env, cli):
    env.file("fakeengine/config.py").write_text(CONFIG + "# local edit\n")
    snapshot = env.snapshot()
    result = cli("apply", "fakeengine", *site_args(env))
    assert result.code == ForeignFileError.exit_code
    assert len(result.err.strip().splitlines()) == 1, "one line, no traceback"
    assert "fakeengine/config.py" in result.err
    assert f"pip install --upgrade --target {env.site} --force-reinstall --no-deps fakeengine==1.2.0" in result.err
    assert sha(CONFIG.encode()) in result.err, "the message says what was expected"
    assert env.snapshot() == snapshot, "kernel.py (pristine) must not be patched when config.py is foreign"
    assert env.file("fakeengine/kernel.py").read_text() == KERNEL


def test_foreign_file_refuses_revert(env, cli):
    cli("apply", "fakeengine", *site_args(env))
    env.file("fakeengine/kernel.py").write_text("something else\n")
    assert cli("revert", "fakeengine", *site_args(env)).code == ForeignFileError.exit_code
    assert env.file("fakeengine/config.py").read_text() == CONFIG_PATCHED


def test_version_mismatch_with_spec(env, cli):
    result = cli("apply", "fakeengine==2.0", *site_args(env))
    assert result.code == UnsupportedVersionError.exit_code
    assert "fakeengine 1.2.0 is installed" in result.err


def test_installed_version_without_patch_set_lists_supported(tmp_path, monkeypatch, cli):
    from tests.helpers import make_dist, make_patch_set

    site = make_dist(tmp_path / "site", version="1.3.0")
    patches = tmp_path / "patches"
    make_patch_set(patches)
    monkeypatch.setenv("T4PATCH_PATCHES", str(patches))
    result = cli("apply", "fakeengine", "--site-packages", str(site))
    assert result.code == UnsupportedVersionError.exit_code
    assert "1.3.0 is installed" in result.err and "1.2.0" in result.err
    status = json.loads(cli("status", "--json", "--site-packages", str(site)).out)
    assert status["engines"][0]["state"] == "no-patch-set"


def test_not_installed_and_unknown_engine(env, tmp_path, cli):
    empty = tmp_path / "empty"
    empty.mkdir()
    result = cli("apply", "fakeengine", "--site-packages", str(empty))
    assert result.code == NotInstalledError.exit_code and "not installed" in result.err
    unknown = cli("apply", "notanengine", *site_args(env))
    assert unknown.code == NotInstalledError.exit_code and "fakeengine" in unknown.err


def test_record_hash_mismatch_is_refused(env, cli):
    """A different build of the same version (RECORD hash differs from the manifest) is not patched."""
    record = env.site / "fakeengine-1.2.0.dist-info" / "RECORD"
    text = record.read_text().splitlines()
    other = record_hash(b"another build of config.py\n")
    text = [line if not line.startswith("fakeengine/config.py,") else f"fakeengine/config.py,{other},10" for line in text]
    record.write_text("\n".join(text) + "\n")
    snapshot = env.snapshot()
    result = cli("apply", "fakeengine", *site_args(env))
    assert result.code == UnsupportedVersionError.exit_code
    assert "RECORD disagrees" in result.err and "the file and the manifest agree" in result.err
    assert env.snapshot() == snapshot


def test_wrong_pristine_hash_in_the_manifest_is_blamed_on_the_manifest(env, cli):
    """RECORD and the installed file agree; the manifest pins another pristine hash: the message says so."""
    manifest = env.patches / "fakeengine" / "1.2.0" / "manifest.toml"
    manifest.write_text(manifest.read_text().replace(sha(CONFIG.encode()), "0" * 64))
    snapshot = env.snapshot()
    result = cli("apply", "fakeengine", *site_args(env))
    assert result.code == UnsupportedVersionError.exit_code
    assert "as its RECORD says" in result.err and "the manifest disagrees" in result.err
    assert len(result.err.strip().splitlines()) == 1
    assert env.snapshot() == snapshot


def test_bad_spec_is_a_usage_error(env, cli):
    result = cli("apply", "fake engine ==", *site_args(env))
    assert result.code == 2 and "not an engine spec" in result.err


def test_json_errors_are_documents_too(env, cli):
    result = cli("apply", "fakeengine==9", "--json", *site_args(env))
    assert result.code == UnsupportedVersionError.exit_code
    error = json.loads(result.out)["error"]
    assert error["type"] == "UnsupportedVersionError" and error["exit_code"] == 5
    assert "fakeengine 1.2.0 is installed" in error["message"] and error["hint"]
    # a command that already wrote its report (status --check) does not get a second document
    check = cli("status", "fakeengine", "--check", "--json", *site_args(env))
    assert check.code == NotAppliedError.exit_code
    assert json.loads(check.out)["engines"][0]["state"] == "not-applied"


def test_write_failure_midway_restores_everything(env, cli, monkeypatch):
    """The second rename of the set fails (disk full): the first file is put back, nothing is left behind."""
    real = os.replace
    calls = []

    def flaky(src, dst, **kwargs):
        if str(src).endswith(".t4patch-new"):
            calls.append(dst)
            if len(calls) == 2:
                raise OSError(28, "No space left on device", str(dst))
        real(src, dst, **kwargs)

    monkeypatch.setattr(os, "replace", flaky)
    snapshot = env.snapshot()
    result = cli("apply", "fakeengine", *site_args(env))
    assert result.code == 3, result.err
    assert "No space left on device" in result.err and "put back" in result.err
    assert "after 1 of 2 file(s) were replaced" in result.err
    assert env.snapshot() == snapshot


def test_unwritable_package_dir_is_refused_before_writing(env, cli, monkeypatch):
    import os

    import t4patch.patching.execute as execute

    pkg = env.site / "fakeengine"
    real_access = os.access
    # Permission bits do not stop root (CI runs as root), so the check itself is what is tested here.
    monkeypatch.setattr(execute.os, "access", lambda p, mode: False if Path(p) == pkg else real_access(p, mode))
    snapshot = env.snapshot()
    result = cli("apply", "fakeengine", *site_args(env))
    assert result.code == 3 and "nothing was written" in result.err and str(pkg) in result.err
    assert env.snapshot() == snapshot


def test_only_plans_made_under_the_lock_can_be_written(env):
    """The core's API: a plan made outside the lock (a dry run's) cannot be committed, nor one whose lock ended."""
    import pytest

    from t4patch.environment.target import resolve_target
    from t4patch.patching.execute import commit, locked
    from t4patch.patching.plan import make_plan
    from t4patch.patching.selection import select

    selection = select("fakeengine", resolve_target(site_packages=str(env.site)))
    snapshot = env.snapshot()
    unlocked = make_plan(selection.patch_set, selection.distribution, "apply")
    with locked([selection.distribution.root]) as lease:
        with pytest.raises(RuntimeError, match="not made under this lease"):
            commit(lease, [unlocked])
        planned = lease.plan(selection.patch_set, selection.distribution, "apply")
    assert env.snapshot() == snapshot
    with pytest.raises(RuntimeError, match="not made under this lease"):
        commit(lease, [planned])
    with pytest.raises(RuntimeError, match="lease has ended"):
        lease.plan(selection.patch_set, selection.distribution, "apply")
    assert env.snapshot() == snapshot
