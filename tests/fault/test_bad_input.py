"""The bad-input corpus: every kind of broken input is one documented error line, checked before any write.

Each case breaks one thing in a fresh synthetic install (two targets, as ``tests.helpers`` makes it) or in
its patch set, runs the real CLI, and asserts: the documented exit code (never 70), exactly one error line
naming the problem, no traceback, and not one byte, mode or owner changed
anywhere under the test's directory — the site, its patch sets and a directory *outside* the site that
symlinks point into. docs/reliability.md lists the cases.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from t4patch.cli import main
from t4patch.environment import interpreter
from tests.helpers import (
    CONFIG,
    DIST_INFO,
    KERNEL,
    KERNEL_PATCHED,
    NOBODY,
    SPEC,
    Env,
    make_dist,
    run_as_nobody,
    sha,
    site_args,
    tree,
)


@dataclass(frozen=True)
class Case:
    name: str
    setup: Callable[[Env, Path], list[str]]  # breaks something; returns the command line
    code: int
    says: str  # a fragment the error line must contain


def _diff(env: Env) -> Path:
    return env.patches / "fakeengine" / "1.2.0" / "0001-change-1.diff"


def _manifest(env: Env) -> Path:
    return env.patches / "fakeengine" / "1.2.0" / "manifest.toml"


def _record(env: Env) -> Path:
    return env.site / DIST_INFO / "RECORD"


def _fake_python(tmp: Path, body: str) -> str:
    exe = tmp / "fakepython"
    exe.write_text(f"#!{sys.executable}\n{body}\n")
    exe.chmod(0o755)
    return str(exe)


def _wheel(tmp: Path, members: dict[str, bytes]) -> str:
    path = tmp / "fakeengine-1.2.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return str(path)


def _outside_dir(env: Env, tmp: Path) -> Path:
    outside = tmp / "outside"
    outside.mkdir(exist_ok=True)
    return outside


def _escape_dir(env: Env, tmp: Path) -> list[str]:
    """The package directory holding kernel.py is a symlink to a copy outside the site."""
    outside = _outside_dir(env, tmp) / "fakeengine"
    outside.mkdir()
    for f in (env.site / "fakeengine").iterdir():
        (outside / f.name).write_bytes(f.read_bytes())
    moved = env.site / "fakeengine"
    for f in moved.iterdir():
        f.unlink()
    moved.rmdir()
    moved.symlink_to(outside, target_is_directory=True)
    return ["apply", SPEC, *site_args(env)]


def _write(path: Path, data: bytes) -> None:
    path.write_bytes(data)


def _replace_with_dir(path: Path) -> None:
    path.unlink()
    path.mkdir()


CASES = [
    # ---- patch-set data: exit 7
    Case("diff with non-UTF-8 bytes", lambda e, t: (_write(_diff(e), _diff(e).read_bytes() + b"+\xff\xfe\n"),
                                                   ["apply", SPEC, *site_args(e)])[1], 7, "UTF-8"),
    Case("diff name is a directory", lambda e, t: (_replace_with_dir(_diff(e)), ["apply", SPEC, *site_args(e)])[1],
         7, "0001-change-1.diff"),
    Case("extra patches/<engine>/latest/ (apply)",
         lambda e, t: ((e.patches / "fakeengine" / "latest").mkdir(),
                       _write(e.patches / "fakeengine" / "latest" / "manifest.toml", _manifest(e).read_bytes()),
                       ["apply", SPEC, *site_args(e)])[2], 7, "'latest' is not a PEP 440 version"),
    Case("extra patches/<engine>/latest/ (status)",
         lambda e, t: ((e.patches / "fakeengine" / "latest").mkdir(),
                       _write(e.patches / "fakeengine" / "latest" / "manifest.toml", _manifest(e).read_bytes()),
                       ["status", *site_args(e)])[2], 7, "'latest' is not a PEP 440 version"),
    Case("diff with trailing junk", lambda e, t: (_write(_diff(e), _diff(e).read_bytes() + b"junk\n" * 100_000),
                                                  ["apply", SPEC, *site_args(e)])[1], 7, "not a unified diff"),
    Case("diff with a stray line between hunks",
         lambda e, t: (_write(_diff(e), _diff(e).read_bytes().replace(b"\n@@", b"\nstray\n@@", 1)),
                       ["apply", SPEC, *site_args(e)])[1], 7, "not a unified diff"),
    Case("manifest is a directory", lambda e, t: (_replace_with_dir(_manifest(e)), ["apply", SPEC, *site_args(e)])[1],
         7, "manifest.toml"),
    Case("manifest not UTF-8", lambda e, t: (_write(_manifest(e), b"\xff" + _manifest(e).read_bytes()),
                                             ["apply", SPEC, *site_args(e)])[1], 7, "manifest.toml"),
    Case("manifest not TOML", lambda e, t: (_write(_manifest(e), b"schema = = 1\n"), ["apply", SPEC, *site_args(e)])[1],
         7, "manifest.toml"),
    Case("validate a DIR that is a file", lambda e, t: ["validate", str(_manifest(e))], 7, "manifest.toml"),
    Case("validate a DIR that does not exist", lambda e, t: ["validate", str(t / "nope")], 7, "nope"),
    # ---- the command line: exit 2
    Case("--site-packages ''", lambda e, t: ["apply", SPEC, "--site-packages", ""], 2, "empty value"),
    Case("--site-packages of spaces", lambda e, t: ["status", "--site-packages", "   "], 2, "empty value"),
    Case("--python ''", lambda e, t: ["apply", SPEC, "--python", ""], 2, "empty value"),
    Case("a 10,000-digit version in the spec", lambda e, t: ["apply", "fakeengine==1" + "0" * 10_000, *site_args(e)],
         2, "characters"),
    Case("an engine named twice", lambda e, t: ["apply", SPEC, "fakeengine==1.2.0", *site_args(e)], 2, "named twice"),
    Case("validate --wheel that does not exist", lambda e, t: ["validate", str(_manifest(e).parent), "--wheel",
                                                                str(t / "none.whl")], 2, "nothing there"),
    Case("validate --wheel that is not a zip",
         lambda e, t: (_write(t / "x.whl", b"not a zip"), ["validate", str(_manifest(e).parent), "--wheel",
                                                           str(t / "x.whl")])[1], 2, "not a zip"),
    Case("validate --wheel without RECORD",
         lambda e, t: ["validate", str(_manifest(e).parent), "--wheel",
                       _wheel(t, {"fakeengine/kernel.py": KERNEL.encode()})], 2, "no .dist-info/RECORD"),
    Case("validate --wheel with a non-UTF-8 RECORD",
         lambda e, t: ["validate", str(_manifest(e).parent), "--wheel",
                       _wheel(t, {f"{DIST_INFO}/RECORD": b"\xff\xfe"})], 2, "damaged"),
    Case("validate --wheel whose RECORD lists a missing member",
         lambda e, t: ["validate", str(_manifest(e).parent), "--wheel",
                       _wheel(t, {f"{DIST_INFO}/RECORD": _record(e).read_bytes()})], 2, "does not hold"),
    # ---- the target: exit 3
    Case("--python that hangs", lambda e, t: ["status", "--python", _fake_python(t, "import time; time.sleep(60)")],
         3, "did not"),
    Case("--python printing JSON of the wrong shape",
         lambda e, t: ["status", "--python", _fake_python(t, "print('[1, 2, 3]')")], 3, "reports"),
    Case("--python printing non-UTF-8",
         lambda e, t: ["status", "--python", _fake_python(t, "import sys; sys.stdout.buffer.write(b'\\xff\\xfe\\n')")],
         3, "UTF-8"),
    Case("--python printing no JSON", lambda e, t: ["status", "--python", _fake_python(t, "print('hello')")],
         3, "expected a Python interpreter"),
    Case("--python that fails", lambda e, t: ["status", "--python", _fake_python(t, "raise SystemExit(4)")],
         3, "exited 4"),
    Case("--site-packages is a file", lambda e, t: ["apply", SPEC, "--site-packages", str(_manifest(e))], 3,
         "expected an existing directory"),
    Case("state record path is a directory",
         lambda e, t: ((e.site / DIST_INFO / "t4patch.json").mkdir(), ["apply", SPEC, *site_args(e)])[1], 3,
         "state record"),
    Case("directory symlink out of the site", _escape_dir, 3, "outside the target"),
    Case("symlink loop in a target's directory",
         lambda e, t: (_replace_tree_with_loop(e), ["apply", SPEC, *site_args(e)])[1], 3, "resolve"),
    Case("two dist-infos of one engine",
         lambda e, t: ((e.site / "fakeengine-1.1.0.dist-info").mkdir(),
                       _write(e.site / "fakeengine-1.1.0.dist-info" / "METADATA",
                              b"Metadata-Version: 2.1\nName: fakeengine\nVersion: 1.1.0\n"),
                       ["apply", SPEC, *site_args(e)])[2], 3, "fakeengine-1.1.0.dist-info"),
    Case("METADATA not UTF-8",
         lambda e, t: (_write(e.site / DIST_INFO / "METADATA", b"Metadata-Version: 2.1\nName: fakeengine\n"
                              b"Version: 1.2.0\nSummary: \xff\xfe\n"), ["apply", SPEC, *site_args(e)])[1], 3, "metadata"),
    Case("a corrupt intent journal", lambda e, t: (_write(e.site / ".t4patch-journal.json", b"{not json"),
                                                   ["status", *site_args(e)])[1], 18, "intent journal"),
    Case("an intent journal naming a file outside the site",
         lambda e, t: (_write(e.site / ".t4patch-journal.json", _journal_outside(e, t)), ["apply", SPEC, *site_args(e)])[1],
         18, "outside its site-packages"),
    # ---- the installed files: exit 6
    Case("a target replaced by a directory", lambda e, t: (_replace_with_dir(e.site / "fakeengine" / "config.py"),
                                                           ["apply", SPEC, *site_args(e)])[1], 6, "a directory"),
    Case("a target replaced by a FIFO", lambda e, t: ((e.site / "fakeengine" / "config.py").unlink(),
                                                      os.mkfifo(e.site / "fakeengine" / "config.py"),
                                                      ["apply", SPEC, *site_args(e)])[2], 6, "a named pipe"),
    Case("a target that is a dangling symlink", lambda e, t: ((e.site / "fakeengine" / "config.py").unlink(),
                                                             (e.site / "fakeengine" / "config.py").symlink_to(t / "x"),
                                                             ["apply", SPEC, *site_args(e)])[2], 6, "missing"),
    # ---- the installed build: exit 5
    Case("RECORD missing", lambda e, t: (_record(e).unlink(), ["apply", SPEC, *site_args(e)])[1], 5, "RECORD"),
    Case("RECORD with bad base64 for a target",
         lambda e, t: (_write(_record(e), _record_row(e, "fakeengine/config.py", b"sha256=%%%,9")),
                       ["apply", SPEC, *site_args(e)])[1], 5, "damaged"),
    Case("RECORD with no hash for a target",
         lambda e, t: (_write(_record(e), _record_row(e, "fakeengine/config.py", b",")),
                       ["apply", SPEC, *site_args(e)])[1], 5, "has no sha256"),
    Case("RECORD not UTF-8", lambda e, t: (_write(_record(e), b"\xff\xfe" + _record(e).read_bytes()),
                                           ["apply", SPEC, *site_args(e)])[1], 5, "damaged"),
    Case("RECORD with an unterminated quote", lambda e, t: (_write(_record(e), _record_row(
        e, "fakeengine/config.py", b'"sha256=abc')), ["apply", SPEC, *site_args(e)])[1], 5, "RECORD"),
    Case("RECORD is a directory", lambda e, t: (_record(e).unlink(), _record(e).mkdir(),
                                                ["apply", SPEC, *site_args(e)])[2], 5, "RECORD"),
    Case("invalid Version: in METADATA (apply)",
         lambda e, t: (_write(e.site / DIST_INFO / "METADATA", b"Metadata-Version: 2.1\nName: fakeengine\n"
                              b"Version: not.a version!\n"), ["apply", SPEC, *site_args(e)])[1], 5, "PEP 440"),
    Case("invalid Version: in METADATA (status)",
         lambda e, t: (_write(e.site / DIST_INFO / "METADATA", b"Metadata-Version: 2.1\nName: fakeengine\n"
                              b"Version: not.a version!\n"), ["status", *site_args(e)])[1], 5, "PEP 440"),
    Case("a wrong pristine hash in the manifest",
         lambda e, t: (_write(_manifest(e), _manifest(e).read_bytes().replace(sha(CONFIG.encode()).encode(),
                                                                                b"0" * 64)),
                       ["apply", SPEC, *site_args(e)])[1], 5, "the manifest disagrees"),
]


def _record_row(env: Env, path: str, rest: bytes) -> bytes:
    rows = [row if not row.startswith(path.encode() + b",") else path.encode() + b"," + rest
            for row in _record(env).read_bytes().splitlines()]
    return b"\n".join(rows) + b"\n"


def _replace_tree_with_loop(env: Env) -> None:
    pkg = env.site / "fakeengine"
    for f in pkg.iterdir():
        f.unlink()
    pkg.rmdir()
    pkg.symlink_to(pkg)  # fakeengine -> fakeengine


def _journal_outside(env: Env, tmp: Path) -> bytes:
    outside = _outside_dir(env, tmp) / "victim.py"
    outside.write_text("precious\n")
    token = "0123456789abcdef"
    entry = {"path": str(outside), "old_sha256": sha(b"precious\n"), "new_sha256": None, "staged": None,
             "kept": None, "soft": False, "bytecode": False}
    return json.dumps({"schema": 1, "token": token, "operation": "apply", "patch_sets": ["fakeengine==1.2.0"],
                       "roots": [str(env.site)], "started_at": "2026-12-01T00:00:00+00:00", "pid": 1,
                       "entries": [entry]}).encode()


@pytest.fixture
def quick_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hanging --python is given up on after 1 s instead of 60 (the path taken is the same)."""
    real = interpreter.probe
    monkeypatch.setattr(interpreter, "probe", lambda python, code, timeout=1.0: real(python, code, timeout=1.0))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_one_line_and_writes_nothing(case: Case, env: Env, tmp_path: Path, cli, quick_probe) -> None:
    _outside_dir(env, tmp_path)
    argv = case.setup(env, tmp_path)
    before = tree(tmp_path)
    result = cli(*argv)
    errors = [line for line in result.err.splitlines() if ": error: " in line]
    assert result.code == case.code, result.err
    assert len(errors) == 1 and len(result.err.strip().splitlines()) == 1, result.err
    assert case.says in errors[0], errors[0]
    assert "internal error" not in result.err and "Traceback" not in result.err
    assert tree(tmp_path) == before, "bad input must leave every file, mode and owner as it was"


def test_the_corpus_has_every_kind_the_issue_counts() -> None:
    assert len(CASES) >= 36 and len({c.name for c in CASES}) == len(CASES)


# ------------------------------------------------------------------------------- writes where they must not go


def test_symlinked_record_temp_is_not_followed(env: Env, tmp_path: Path, cli) -> None:
    """A leftover t4patch.json.tmp that is a symlink (the old fixed temp name) is removed, never written through."""
    victim = _outside_dir(env, tmp_path) / "victim"
    victim.write_text("precious\n")
    (env.site / DIST_INFO / "t4patch.json.tmp").symlink_to(victim)
    (env.site / DIST_INFO / "t4patch.json").symlink_to(victim)  # even the record itself
    result = cli("apply", SPEC, *site_args(env))
    assert result.code == 0, result.err
    assert victim.read_text() == "precious\n"
    assert not (env.site / DIST_INFO / "t4patch.json.tmp").exists()
    record = env.site / DIST_INFO / "t4patch.json"
    assert not record.is_symlink() and json.loads(record.read_text())["patch_set"] == "fakeengine==1.2.0"
    assert cli("revert", SPEC, *site_args(env)).code == 0
    assert victim.read_text() == "precious\n"


def test_file_symlink_target_leaves_the_outside_file_alone(env: Env, tmp_path: Path, cli) -> None:
    outside = _outside_dir(env, tmp_path) / "kernel.py"
    outside.write_text(KERNEL)
    (env.site / "fakeengine" / "kernel.py").unlink()
    (env.site / "fakeengine" / "kernel.py").symlink_to(outside)
    assert cli("apply", SPEC, *site_args(env)).code == 0
    assert outside.read_text() == KERNEL
    assert (env.site / "fakeengine" / "kernel.py").read_text() == KERNEL_PATCHED
    assert cli("revert", SPEC, *site_args(env)).code == 0
    assert outside.read_text() == KERNEL


def test_owner_group_and_mode_are_kept(env: Env, cli) -> None:
    """Root applying into a tree owned by another user leaves every file (and the record) owned by that user."""
    if os.geteuid() != 0:
        pytest.skip("needs root to give files to another user")
    for path in [env.site, *env.site.rglob("*")]:
        os.lchown(path, NOBODY, NOBODY)
    (env.site / "fakeengine" / "kernel.py").chmod(0o640)
    assert cli("apply", SPEC, *site_args(env)).code == 0
    for path in [*env.site.rglob("*")]:
        info = path.lstat()
        assert (info.st_uid, info.st_gid) == (NOBODY, NOBODY), path
    assert stat.S_IMODE((env.site / "fakeengine" / "kernel.py").stat().st_mode) == 0o640
    assert cli("revert", SPEC, *site_args(env)).code == 0
    assert all(p.lstat().st_uid == NOBODY for p in env.site.rglob("*"))


def test_pyc_of_restored_files_are_kept(env: Env, cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replace that fails midway (chattr +i on the second file) leaves the first file's bytecode in place."""
    cache = env.site / "fakeengine" / "__pycache__"
    cache.mkdir()
    pycs = [cache / "kernel.cpython-311.pyc", cache / "config.cpython-311.pyc"]
    for pyc in pycs:
        pyc.write_bytes(b"bytecode")
    real = os.replace

    def immutable(src, dst, **kwargs):
        if str(dst).endswith("config.py"):
            raise PermissionError(1, "Operation not permitted", str(dst))
        return real(src, dst, **kwargs)

    monkeypatch.setattr(os, "replace", immutable)
    result = cli("apply", SPEC, *site_args(env))
    assert result.code == 3 and "put back" in result.err
    assert all(p.read_bytes() == b"bytecode" for p in pycs)
    assert (env.site / "fakeengine" / "kernel.py").read_text() == KERNEL


def test_chattr_immutable_file_mid_set(env: Env, tmp_path: Path, cli) -> None:
    """A real `chattr +i` on the second file: exit 3, the first file is put back, its bytecode is kept."""
    import shutil
    import subprocess

    target = env.site / "fakeengine" / "config.py"
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(target)]).returncode != 0:
        pytest.skip("chattr +i is not available on this filesystem")
    try:
        cache = env.site / "fakeengine" / "__pycache__"
        cache.mkdir()
        (cache / "kernel.cpython-311.pyc").write_bytes(b"bytecode")
        before = tree(env.site)
        result = cli("apply", SPEC, *site_args(env))
        assert result.code == 3 and "Operation not permitted" in result.err and "put back" in result.err, result.err
        assert len(result.err.strip().splitlines()) == 1
        assert tree(env.site) == before
    finally:
        subprocess.run(["chattr", "-i", str(target)], check=False)


def test_unreadable_target_as_an_unprivileged_user(shared_env: Env, tmp_path: Path) -> None:
    """PermissionError reading a target (a real one: a child running as nobody) is exit 3 in status and apply."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run a child as another user")
    env = shared_env
    for path in [env.site, *env.site.rglob("*")]:
        os.lchown(path, NOBODY, NOBODY)
    secret = env.site / "fakeengine" / "config.py"
    os.chown(secret, 0, 0)
    secret.chmod(0o600)
    # Everything the commands import is imported here first: the child, as nobody, cannot read this
    # interpreter's own files (they live under /root).
    import contextlib
    import io
    import shutil

    warm = tmp_path / "warm"
    shutil.copytree(env.site, warm, symlinks=True)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        for command in (["status"], ["apply", SPEC]):
            assert main([*command, "--site-packages", str(warm)]) == 0
    before = tree(env.site)
    stderr = tmp_path / "stderr"
    for command in (["status"], ["apply", SPEC]):
        code = run_as_nobody([*command, "--site-packages", str(env.site)], stderr)
        text = stderr.read_text()
        assert code == 3, text
        assert text.count("\n") == 1 and "Permission denied" in text and str(secret) in text, text
    assert tree(env.site) == before


def test_unreadable_patch_tree_as_an_unprivileged_user(shared_env: Env, tmp_path: Path) -> None:
    """T4PATCH_PATCHES naming a tree this user may not read: exit 7, one line, even for help-text building."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run a child as another user")
    shared_env.patches.chmod(0o700)
    stderr = tmp_path / "stderr"
    code = run_as_nobody(["status", "--site-packages", str(shared_env.site)], stderr)
    text = stderr.read_text()
    assert code == 7 and text.count("\n") == 1 and "cannot read the patch-set tree" in text, text


def test_two_dist_infos_are_named_by_status(env: Env, cli) -> None:
    other = make_dist(env.site.parent / "other", version="1.1.0")
    (other / "fakeengine-1.1.0.dist-info").rename(env.site / "fakeengine-1.1.0.dist-info")
    doc = json.loads(cli("status", "--json", *site_args(env)).out)["engines"][0]
    assert doc["state"] == "foreign" and "fakeengine-1.1.0.dist-info" in doc["detail"]
    assert DIST_INFO in doc["detail"]


@pytest.mark.integration
def test_directory_symlink_out_of_the_real_sglang_tree(tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's case on the real SGLang 0.5.23 wheel: sglang/kernels/ops/attention is a symlink to a directory
    outside the site. apply refuses (exit 3) and neither the outside files nor any file of the site change."""
    import shutil

    from t4patch.patching.registry import find_patch_set
    from tests.helpers import extracted_wheel, site_from_extracted, wheel_path

    monkeypatch.delenv("T4PATCH_PATCHES", raising=False)
    patch_set = find_patch_set("sglang", "0.5.23")
    site = site_from_extracted(extracted_wheel(wheel_path("sglang", "0.5.23")), tmp_path / "site",
                               [t.path for t in patch_set.targets])
    attention = site / "sglang" / "kernels" / "ops" / "attention"
    outside = tmp_path / "outside" / "attention"
    shutil.copytree(attention, outside)
    shutil.rmtree(attention)
    attention.symlink_to(outside, target_is_directory=True)
    before = tree(tmp_path)
    result = cli("apply", "sglang", "--site-packages", str(site))
    assert result.code == 3 and "outside the target" in result.err and str(outside) in result.err, result.err
    assert len(result.err.strip().splitlines()) == 1
    assert tree(tmp_path) == before
    status = cli("status", "sglang", "--site-packages", str(site))
    assert status.code == 3 and "outside the target" in status.err
