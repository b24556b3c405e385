"""Hostile inputs to the commands that read wheels and write products: wheels that are not the release, output
directories that are not t4patch's to use, and the exit codes and labels those commands report (issue 22 items
2-4, issue 23 item 4).

Every case runs the real CLI on a synthetic release ("fakeengine" 1.2.0, the ``env`` fixture's patch set, and a
1.3.0 release to port to) and checks real state: the exit code the README documents (never 70), one error line
and no traceback, and every byte, mode and owner under the test's directory as it was (the patch-set tree, the
wheels, the output directory and what lies beside it). docs/fleet.md and the README ("Wheels that are not the
release") list the cases.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
import tracemalloc
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from t4patch.cli import main
from tests.helpers import CONFIG, KERNEL, Env, make_dist, record_hash, run_as_nobody, tree

NAME = "fakeengine"


# ------------------------------------------------------------------------------------------------ helpers


def release_files(version: str, **extra: bytes) -> dict[str, bytes]:
    dist_info = f"{NAME}-{version}.dist-info"
    return {
        f"{NAME}/__init__.py": b"",
        f"{NAME}/kernel.py": KERNEL.encode(),
        f"{NAME}/config.py": CONFIG.encode(),
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {version}\n".encode(),
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        **extra,
    }


def write_wheel(path: Path, files: dict[str, bytes], *, version: str, record: dict[str, bytes] | None = None,
                record_text: bytes | None = None) -> Path:
    """A wheel holding ``files`` whose RECORD lists ``record`` (default: the files), or is ``record_text``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    dist_info = f"{NAME}-{version}.dist-info"
    rows = [f"{rel},{record_hash(data)},{len(data)}" for rel, data in (record if record is not None else files).items()]
    rows.append(f"{dist_info}/RECORD,,")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for rel, data in files.items():
            info = zipfile.ZipInfo(rel, date_time=(2026, 1, 2, 3, 4, 6))
            info.external_attr = 0o100644 << 16
            zf.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
        zf.writestr(zipfile.ZipInfo(f"{dist_info}/RECORD", date_time=(2026, 1, 2, 3, 4, 8)),
                    record_text if record_text is not None else ("\n".join(rows) + "\n").encode())
    return path


def wheel_name(version: str) -> str:
    return f"{NAME}-{version}-py3-none-any.whl"


def good_wheel(directory: Path, version: str = "1.2.0") -> Path:
    return write_wheel(directory / wheel_name(version), release_files(version), version=version)


def hostile_wheel(kind: str, directory: Path, version: str) -> Path:
    """A wheel named as the release ``version`` that is not that release, in one way (``kind``)."""
    path = directory / wheel_name(version)
    files = release_files(version)
    dist_info = f"{NAME}-{version}.dist-info"
    if kind == "not-a-zip":
        directory.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"PK\x03\x04 this is not a zip archive" * 10)
    elif kind == "no-record":
        directory.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(path, "w") as zf:
            for rel, data in files.items():
                zf.writestr(rel, data)
    elif kind == "record-not-utf8":
        write_wheel(path, files, version=version, record_text=b"\xff\xfe\x00garbage")
    elif kind == "record-malformed":
        write_wheel(path, files, version=version, record_text=f"{NAME}/kernel.py,sha256=abc\n".encode())
    elif kind == "hash-mismatch":  # one byte of an untouched member changed, RECORD as released
        write_wheel(path, {**files, f"{NAME}/__init__.py": b"#"}, version=version, record=files)
    elif kind == "listed-absent":
        write_wheel(path, {k: v for k, v in files.items() if not k.endswith("__init__.py")}, version=version,
                    record=files)
    elif kind == "unlisted":
        write_wheel(path, {**files, f"{NAME}/planted.py": b"import os\n"}, version=version, record=files)
    elif kind == "renamed-release":  # another release's wheel, whole and consistent, under this file name
        other = "1.1.0"
        write_wheel(path, release_files(other), version=other)
    elif kind == "metadata-lies":  # dist-info says the version, METADATA another
        lying = {**files, f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {NAME}\nVersion: 1.1.0\n".encode()}
        write_wheel(path, lying, version=version)
    elif kind == "unsafe-path":
        write_wheel(path, {**files, "../escape.py": b"x = 1\n"}, version=version)
    else:
        raise AssertionError(kind)
    return path


HOSTILE = {
    "not-a-zip": "not a zip archive",
    "no-record": "no .dist-info/RECORD",
    "record-not-utf8": "damaged",
    "record-malformed": "damaged",
    "hash-mismatch": "hashing to",
    "listed-absent": "which the archive does not hold",
    "unlisted": "which its RECORD does not list",
    "renamed-release": "1.1.0",
    "metadata-lies": "METADATA",
    "unsafe-path": "unsafe path",
}


def run_cli(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture
def world(env: Env, tmp_path: Path) -> Path:
    """tmp_path holding the env's site and patch set, OLD's (1.2.0) and NEW's (1.3.0) good wheels in wheels/."""
    good_wheel(tmp_path / "wheels", "1.2.0")
    good_wheel(tmp_path / "wheels", "1.3.0")
    return tmp_path


def command(which: str, world: Path, wheel: Path, out: Path) -> list[str]:
    """The command line of ``which`` reading ``wheel`` (NEW's wheel for port) and writing to ``out``."""
    if which == "validate":
        return ["validate", str(world / "patches" / NAME / "1.2.0"), "--wheel", str(wheel)]
    if which == "wheel":
        return ["wheel", f"{NAME}==1.2.0", "--from-wheel", str(wheel), "-o", str(out)]
    return ["port", f"{NAME}==1.3.0", "--from", f"{NAME}==1.2.0", "--wheel", str(wheel), "--from-wheel",
            str(world / "wheels" / wheel_name("1.2.0")), "-o", str(out)]


# ------------------------------------------------------------------------------------- hostile wheels


@pytest.mark.parametrize("which", ["validate", "wheel", "port"])
@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_a_wheel_that_is_not_the_release_is_exit_2_in_every_command(world: Path, capsys: pytest.CaptureFixture[str],
                                                                   kind: str, which: str) -> None:
    """The same fault gets the same exit code (2) and one line in validate, wheel and port; nothing is written."""
    version = "1.3.0" if which == "port" else "1.2.0"
    bad = hostile_wheel(kind, world / "bad", version)
    out = world / "out"
    before = tree(world)
    code, _out, err = run_cli(capsys, command(which, world, bad, out))
    line = one_line(err)
    assert code == 2, (code, line)
    assert HOSTILE[kind] in line and str(bad) in line, line
    assert tree(world) == before  # not one byte changed, no output directory made
    assert not out.exists()


def test_port_refuses_another_release_renamed_to_new(world: Path, capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """1.1.0 renamed to 1.3.0's file name in the wheel cache: port does not draft it as 1.3.0."""
    cache = world / "cache"
    good_wheel(cache, "1.2.0")
    hostile_wheel("renamed-release", cache, "1.3.0")
    monkeypatch.setenv("T4PATCH_WHEEL_CACHE", str(cache))
    code, out, err = run_cli(capsys, ["port", f"{NAME}==1.3.0", "-o", str(world / "drafts")])
    assert code == 2 and "fakeengine-1.1.0.dist-info" in one_line(err) and out == ""
    assert not (world / "drafts").exists()


def test_hashing_is_streamed_so_memory_does_not_grow_with_a_member(env: Env, tmp_path: Path) -> None:
    """A 48 MiB member (zeros: a small file, a big member) costs chunks, not its size: the wheel build's Python
    allocations stay under 12 MiB (reading it whole costs 48 MiB and more)."""
    from t4patch.patching.wheel import build_patched_wheel

    big = bytes(48 * 2**20)
    wheel = write_wheel(tmp_path / "in" / wheel_name("1.2.0"),
                        release_files("1.2.0", **{f"{NAME}/weights.bin": big}), version="1.2.0")
    del big
    tracemalloc.start()
    try:
        result = build_patched_wheel(f"{NAME}==1.2.0", out_dir=tmp_path / "out", from_wheel=wheel)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.path.is_file()
    assert peak < 12 * 2**20, f"peak Python allocation {peak / 2**20:.1f} MiB"
    with zipfile.ZipFile(result.path) as zf:
        assert zf.getinfo(f"{NAME}/weights.bin").file_size == 48 * 2**20


# -------------------------------------------------------------------------------- hostile output dirs


def _file(path: Path) -> None:
    path.write_text("my notes\n")


def _dangling(path: Path) -> None:
    path.symlink_to(path.parent / "nowhere")


def _link_to_dir(path: Path) -> None:
    (path.parent / "real").mkdir()
    (path.parent / "real" / "mine.txt").write_text("mine\n")
    path.symlink_to(path.parent / "real", target_is_directory=True)


def _through_file(path: Path) -> Path:
    (path.parent / "afile").write_text("x\n")
    return path.parent / "afile" / "sub"


OUT_CASES: dict[str, tuple[Callable[[Path], object], str]] = {
    "a file": (_file, "found a file"),
    "a dangling symlink": (_dangling, "symlink"),
    "a symlink to a directory": (_link_to_dir, "symlink"),
    "a path through a file": (_through_file, "through"),
}


@pytest.mark.parametrize("which", ["wheel", "port"])
@pytest.mark.parametrize("case", sorted(OUT_CASES))
def test_an_output_that_is_not_a_directory_is_refused_in_one_line(world: Path, capsys: pytest.CaptureFixture[str],
                                                                  case: str, which: str) -> None:
    setup, says = OUT_CASES[case]
    place = world / "outs"
    place.mkdir()
    out = place / "out"
    changed = setup(out)
    if isinstance(changed, Path):
        out = changed
    before = tree(world)
    code, _o, err = run_cli(capsys, command(which, world, world / "wheels" / wheel_name(
        "1.3.0" if which == "port" else "1.2.0"), out))
    line = one_line(err)
    assert code == 2 and says in line, (code, line)
    assert tree(world) == before


@pytest.mark.parametrize("which", ["wheel", "port"])
def test_an_output_inside_the_patch_set_tree_is_refused(world: Path, capsys: pytest.CaptureFixture[str],
                                                         which: str) -> None:
    """-o inside the tree `list` reads (here --patches / T4PATCH_PATCHES) would change what every command sees."""
    for out in (world / "patches", world / "patches" / NAME, world / "patches" / "drafts"):
        before = tree(world)
        code, _o, err = run_cli(capsys, command(which, world, world / "wheels" / wheel_name(
            "1.3.0" if which == "port" else "1.2.0"), out))
        assert code == 2 and "patch-set tree" in one_line(err), err
        assert tree(world) == before
    code, out_text, _e = run_cli(capsys, ["list", "--json"])
    assert code == 0 and "1.3.0" not in out_text


@pytest.mark.parametrize("which", ["wheel", "port"])
def test_an_output_inside_the_shipped_patch_set_tree_is_refused(world: Path, capsys: pytest.CaptureFixture[str],
                                                                which: str) -> None:
    """-o in the shipped tree (this checkout's patches/, which list reads without --patches) is refused too.
    (Skipped where the output checks do not exist, so an older t4patch never writes into the repository.)"""
    pytest.importorskip("t4patch.patching.output_dir")
    from t4patch.data.locations import shipped_dirs

    shipped = next((d for d in shipped_dirs("patches") if d.is_dir()), None)
    if shipped is None:
        pytest.skip("no shipped patch-set tree here")
    for out in (shipped, shipped / "h4b-hostile-output-test"):
        before = tree(shipped) if out == shipped else None
        code, _o, err = run_cli(capsys, command(which, world, world / "wheels" / wheel_name(
            "1.3.0" if which == "port" else "1.2.0"), out))
        assert code == 2 and "patch-set tree" in one_line(err), err
        assert not (shipped / "h4b-hostile-output-test").exists()
        if before is not None:
            assert tree(shipped) == before


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a child as another user")
@pytest.mark.parametrize("which", ["wheel", "port"])
def test_an_output_this_user_may_not_write_is_refused_as_nobody(env: Env, which: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A real unprivileged user (a forked child as nobody) and a directory only root may write: exit 2, one line."""
    import t4patch.commands.port
    import t4patch.patching.wheel

    assert t4patch.commands.port and t4patch.patching.wheel  # imported before the child drops its rights

    where = Path(tempfile.mkdtemp(prefix="t4patch-hostile-"))
    try:
        where.chmod(0o755)
        patches = where / "patches"
        import shutil

        shutil.copytree(env.patches, patches)
        for version in ("1.2.0", "1.3.0"):
            good_wheel(where / "wheels", version)
        (where / "out").mkdir()
        for path in [where, *where.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        before = tree(where)
        stderr = where / "stderr"
        argv = command(which, where, where / "wheels" / wheel_name("1.3.0" if which == "port" else "1.2.0"),
                       where / "out")
        monkeypatch.setenv("T4PATCH_PATCHES", str(patches))
        code = run_as_nobody(argv, stderr)
        err = stderr.read_text()
        stderr.unlink()
        assert code == 2 and "may not write" in one_line(err), err
        assert tree(where) == before
    finally:
        import shutil

        shutil.rmtree(where, ignore_errors=True)


def _built_name(world: Path) -> str:
    from t4patch.patching.wheel import build_patched_wheel

    return build_patched_wheel(f"{NAME}==1.2.0", out_dir=world / "scratch-build",
                               from_wheel=world / "wheels" / wheel_name("1.2.0")).path.name


def test_wheel_never_replaces_what_it_did_not_write(world: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A directory of the output's name, a file of its name with other bytes, a SHA256SUMS that is someone's own:
    each is kept byte for byte and the run is exit 2; the same build's bytes already there are kept (exit 0)."""
    name = _built_name(world)
    release = world / "wheels" / wheel_name("1.2.0")
    argv = ["wheel", f"{NAME}==1.2.0", "--from-wheel", str(release), "-o", str(world / "out")]
    out = world / "out"
    out.mkdir()
    for setup, says in (
        (lambda: (out / name).mkdir(), "a directory named"),
        (lambda: (out / name).write_bytes(b"someone's wheel"), "which t4patch did not make"),
        (lambda: (out / "SHA256SUMS").write_text("these are my notes\n"), "not t4patch's"),
        (lambda: (out / "SHA256SUMS").symlink_to(world / "elsewhere"), "symlink"),
    ):
        for child in out.iterdir():
            if child.is_dir() and not child.is_symlink():
                child.rmdir()
            else:
                child.unlink()
        setup()
        before = tree(world)
        code, _o, err = run_cli(capsys, argv)
        assert code == 2 and says in one_line(err), err
        assert tree(world) == before
    for child in out.iterdir():
        child.unlink()
    assert run_cli(capsys, argv)[0] == 0
    first = tree(out)
    code, text, _e = run_cli(capsys, argv)  # the same build again: byte-identical, kept
    assert code == 0 and "already there" in text and tree(out) == first


def test_port_never_deletes_a_directory_it_did_not_write(world: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The draft's place holding the user's own files (or an earlier draft plus a user's file) is kept whole;
    an earlier draft t4patch wrote is replaced."""
    argv = command("port", world, world / "wheels" / wheel_name("1.3.0"), world / "drafts")
    place = world / "drafts" / NAME / "1.3.0"
    place.mkdir(parents=True)
    (place / "notes.txt").write_text("my review notes\n")
    before = tree(world)
    code, _o, err = run_cli(capsys, argv)
    assert code == 2 and "not an earlier draft" in one_line(err), err
    assert tree(world) == before
    (place / "notes.txt").unlink()
    place.rmdir()
    assert run_cli(capsys, argv)[0] == 0  # the first draft
    (place / "notes.txt").write_text("added while reviewing\n")
    before = tree(world)
    code, _o, err = run_cli(capsys, argv)
    assert code == 2 and tree(world) == before
    (place / "notes.txt").unlink()
    first = (place / "manifest.toml").read_bytes()
    code, _o, err = run_cli(capsys, argv)  # an earlier draft alone: replaced
    assert code == 0, err
    assert (place / "manifest.toml").read_bytes() == first
    assert not [p for p in place.parent.iterdir() if p.name.startswith(".t4patch")]  # no staging left


def test_outputs_are_0644_under_umask_022(world: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """As pip leaves files: another user can pip install the wheel and sha256sum --check the sums."""
    old = os.umask(0o022)
    try:
        assert run_cli(capsys, command("wheel", world, world / "wheels" / wheel_name("1.2.0"), world / "out"))[0] == 0
        assert run_cli(capsys, command("port", world, world / "wheels" / wheel_name("1.3.0"), world / "drafts"))[0] == 0
    finally:
        os.umask(old)
    for path in (world / "out").iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path
    for path in [world / "drafts", *(world / "drafts").rglob("*")]:
        assert stat.S_IMODE(path.stat().st_mode) == (0o755 if path.is_dir() else 0o644), path


# ---------------------------------------------------------------------------------- exit codes and words


def _conflicting_new(world: Path) -> Path:
    kernel = KERNEL.replace("    tile = 32\n", "    tile = 64  # NEW changed the very line\n")
    return write_wheel(world / "new" / wheel_name("1.3.0"), {**release_files("1.3.0"),
                                                             f"{NAME}/kernel.py": kernel.encode()}, version="1.3.0")


def test_an_incomplete_port_is_exit_17_and_validate_says_draft(world: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _e = run_cli(capsys, command("port", world, _conflicting_new(world), world / "drafts"))
    assert code == 17 and "INCOMPLETE" in out
    draft = world / "drafts" / NAME / "1.3.0"
    assert (draft / "manifest.toml").is_file()  # what landed is still written, for the hand edit
    code, out, _e = run_cli(capsys, ["validate", str(draft)])
    assert code == 0 and "DRAFT" in out and "not reviewed" in out
    code, out, _e = run_cli(capsys, ["validate", str(world / "patches" / NAME / "1.2.0")])
    assert code == 0 and "DRAFT" not in out


def test_a_draft_is_refused_with_one_message_by_apply_and_wheel(world: Path, env: Env,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(capsys, command("port", world, world / "wheels" / wheel_name("1.3.0"), world / "drafts"))[0] == 0
    site = make_dist(world / "site13", version="1.3.0")
    drafts = str(world / "drafts")
    before = tree(world)
    applied = run_cli(capsys, ["--patches", drafts, "apply", f"{NAME}==1.3.0", "--site-packages", str(site)])
    wheeled = run_cli(capsys, ["--patches", drafts, "wheel", f"{NAME}==1.3.0", "--from-wheel",
                               str(world / "wheels" / wheel_name("1.3.0")), "-o", str(world / "out")])
    assert applied[0] == wheeled[0] == 7
    assert one_line(applied[2]).split(": error: ", 1)[1] == one_line(wheeled[2]).split(": error: ", 1)[1]
    assert tree(world) == before


@pytest.mark.parametrize("which", ["wheel", "port"])
def test_one_exact_release_spec(world: Path, capsys: pytest.CaptureFixture[str], which: str) -> None:
    """`===` is an exact release in both commands; a local version, a range or a wildcard is refused in both."""
    argv = command(which, world, world / "wheels" / wheel_name("1.3.0" if which == "port" else "1.2.0"),
                   world / "out")
    version = "1.3.0" if which == "port" else "1.2.0"
    exact = [a.replace(f"=={version}", f"==={version}") if a == f"{NAME}=={version}" else a for a in argv]
    assert run_cli(capsys, exact)[0] == 0
    for spec in (f"{NAME}=={version}+cu121", f"{NAME}>={version}", f"{NAME}==1.*"):
        bad = [spec if a == f"{NAME}=={version}" else a for a in argv]
        code, _o, err = run_cli(capsys, bad)
        assert code == 2 and "expected" in one_line(err), err


def test_wheel_of_a_release_without_a_set_says_nothing_of_an_install(world: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, _o, err = run_cli(capsys, ["wheel", f"{NAME}==9.9.9", "-o", str(world / "out")])
    line = one_line(err)
    assert code == 5 and "installed" not in line and "t4patch wheel fakeengine==1.2.0" in line, line
    assert not (world / "out").exists()


# -------------------------------------------------------------------------- plain and optional in one place

EXTRA = b"WINDOW = 4096\n"
EXTRA_PATCHED = "WINDOW = 1024\n"


def _tool(name: str) -> str | None:
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.is_file() else None


@pytest.mark.parametrize("client", ["pip", "uv"])
def test_a_directory_with_the_plain_and_the_optional_wheel_installs_the_plain_one(
        env: Env, tmp_path: Path, capsys: pytest.CaptureFixture[str], client: str) -> None:
    """docs/fleet.md's install line (--no-index --find-links DIR ENGINE==RELEASE) over a directory holding both
    wheels installs the plain one, with pip and with uv; the optional one only by its full label."""
    from tests.helpers import make_patch_set, unified

    patches = tmp_path / "patches-opt"
    directory = make_patch_set(patches, changes=[(f"{NAME}/kernel.py", KERNEL, KERNEL.replace("32", "16")),
                                                 (f"{NAME}/extra.py", EXTRA.decode(), EXTRA_PATCHED)])
    manifest = directory / "manifest.toml"
    manifest.write_text(manifest.read_text().replace('file = "0002-change-2.diff"',
                                                     'file = "0002-change-2.diff"\noptional = "small-window"'))
    assert unified  # the helper made the diffs
    release = write_wheel(tmp_path / "in" / wheel_name("1.2.0"),
                          release_files("1.2.0", **{f"{NAME}/extra.py": EXTRA}), version="1.2.0")
    wheels = tmp_path / "wheels"
    base = ["--patches", str(patches), "wheel", f"{NAME}==1.2.0", "--from-wheel", str(release), "-o", str(wheels)]
    assert run_cli(capsys, base)[0] == 0
    assert run_cli(capsys, [*base, "--with", "small-window"])[0] == 0
    built = sorted(p.name for p in wheels.glob("*.whl"))
    plain = next(n for n in built if ".with." not in n)
    optional = next(n for n in built if ".with.small.window." in n)
    from t4patch import __version__

    assert f"+t4patch.{__version__}.h" in plain and f"+t4patch.with.small.window.{__version__}.h" in optional
    if client == "pip":
        argv = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    else:
        uv = _tool("uv")
        if uv is None:
            pytest.skip("uv is not installed beside this interpreter (the test extra has it)")
        argv = [uv, "pip", "install", "-q", "--python", sys.executable]
    for spec, expect in ((f"{NAME}==1.2.0", plain), (f"{NAME}=={optional.split('-')[1]}", optional)):
        target = tmp_path / f"{client}-{len(spec)}"
        proc = subprocess.run([*argv, "--no-deps", "--no-index", "--find-links", str(wheels), "--target",
                               str(target), spec], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        (meta,) = target.glob(f"{NAME}-*.dist-info")
        assert meta.name == f"{NAME}-{expect.split('-')[1]}.dist-info", (meta.name, expect)
        patched = (target / NAME / "extra.py").read_text()
        assert patched == (EXTRA_PATCHED if expect == optional else EXTRA.decode())
