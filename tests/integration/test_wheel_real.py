"""`t4patch wheel` on the real released wheel of every shipped patch set (vLLM 0.33.0, SGLang 0.5.23, ...).

One build per patch set per session (the vLLM wheel is 330 MB: about 15 s to build, 20 s to install on the
2-core box), installed once with ``pip install --no-deps --target``; the tests share it and the revert test
runs last. Done-when of issue 16: byte-identical twice, installs, ``importlib.metadata`` shows the local
label, every installed file hashes to RECORD, the patched files equal the manifest's patched sha256,
``status --check`` passes, ``revert`` gives back the released bytes, and a changed byte is refused.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from t4patch.environment.target import resolve_target
from t4patch.errors import UsageError
from t4patch.fileio.hashing import sha256_bytes, sha256_file
from t4patch.fileio.wheeltools import Member, copied, write_archive
from t4patch.patching.manifest import PatchSet
from t4patch.patching.registry import all_patch_sets
from t4patch.patching.wheel import PatchedWheel, build_patched_wheel
from tests.helpers import companions_standin, install_wheel_to, progress, wheel_path

pytestmark = pytest.mark.integration
SCRIPT = Path(__file__).resolve().parents[2] / "docs" / "examples" / "fleet" / "install-patched-wheels.sh"

PATCH_SETS = all_patch_sets()


@dataclass(frozen=True)
class Built:
    patch_set: PatchSet
    release: Path
    result: PatchedWheel
    site: Path


DOCKERFILE = SCRIPT.parent / "Dockerfile"


def dockerfile_specs() -> list[str]:
    """The specs of the example Dockerfile's last (most complete) install-patched-wheels line."""
    lines = re.findall(r"install-patched-wheels /wheels ((?:\S+==\S+ ?)+)", DOCKERFILE.read_text())
    return lines[-1].split()


_BUILT: dict[str, PatchedWheel] = {}  # one build per patch set per session, all in one wheels/ directory


def patched_wheel(ps: PatchSet, wheels: Path) -> PatchedWheel:
    if ps.spec not in _BUILT:
        release = wheel_path(ps.distribution, ps.version)
        progress(f"t4patch wheel {ps.spec} from {release.name} ...")
        _BUILT[ps.spec] = build_patched_wheel(ps.spec, out_dir=wheels, from_wheel=release)
        progress(f"t4patch wheel {ps.spec}: {_BUILT[ps.spec].path.name}")
    return _BUILT[ps.spec]


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("wheels")


@pytest.fixture(scope="module", params=PATCH_SETS, ids=[ps.spec for ps in PATCH_SETS])
def built(request: pytest.FixtureRequest, wheels: Path, tmp_path_factory: pytest.TempPathFactory) -> Built:
    ps = request.param
    result = patched_wheel(ps, wheels)
    site = install_wheel_to(tmp_path_factory.mktemp(f"{ps.distribution}-node") / "site", result.path)
    companions_standin(site, ps)  # status --check requires the set's companions
    return Built(ps, wheel_path(ps.distribution, ps.version), result, site)


def test_twice_gives_identical_bytes(built: Built, tmp_path: Path) -> None:
    progress(f"second build of {built.patch_set.spec} ...")
    again = build_patched_wheel(built.patch_set.spec, out_dir=tmp_path, from_wheel=built.release)
    assert again.path.name == built.result.path.name
    assert again.sha256 == built.result.sha256 == sha256_file(again.path)
    assert (tmp_path / "SHA256SUMS").read_text() == f"{again.sha256}  {again.path.name}\n"
    assert f"{again.sha256}  {again.path.name}\n" in (built.result.sums).read_text()


def test_the_install_is_the_release_plus_the_patch_set(built: Built) -> None:
    ps, site = built.patch_set, built.site
    (dist,) = [d for d in importlib.metadata.distributions(path=[str(site)]) if d.metadata["Name"] == ps.distribution]
    assert dist.version == built.result.version == f"{ps.version}+{built.result.label}"
    installed = resolve_target(site_packages=str(site)).find(ps.distribution)
    assert installed is not None
    bad = [rel for rel, digest in installed.record().items()
           if digest is not None and not rel.startswith("../") and sha256_file(site / rel) != digest]
    assert bad == []  # every installed file hashes to RECORD
    for target in ps.targets:
        assert sha256_file(site / target.path) == target.patched_sha256
    with zipfile.ZipFile(built.release) as release, zipfile.ZipFile(built.result.path) as patched:
        assert patched.read(f"{installed.dist_info.name}/WHEEL") == release.read(
            f"{ps.distribution}-{ps.version}.dist-info/WHEEL")  # the tags, byte for byte
        untouched = [i for i in release.infolist() if not i.is_dir() and ".dist-info/" not in i.filename
                     and i.filename not in {t.path for t in ps.targets}]
        assert all(patched.getinfo(i.filename).CRC == i.CRC for i in untouched)


def test_status_check_then_revert_gives_the_released_bytes(built: Built, cli) -> None:  # type: ignore[no-untyped-def]
    ps, site = built.patch_set, built.site
    check = cli("status", "--check", ps.distribution, "--site-packages", str(site))
    assert check.code == 0 and ": applied" in check.out, check.out + check.err
    revert = cli("revert", ps.distribution, "--site-packages", str(site))
    assert revert.code == 0, revert.err
    with zipfile.ZipFile(built.release) as release:
        for target in ps.targets:
            assert (site / target.path).read_bytes() == release.read(target.path)
    assert cli("status", "--check", ps.distribution, "--site-packages", str(site)).code == 9


def test_a_changed_byte_is_refused_and_nothing_written(built: Built, tmp_path: Path) -> None:
    """The release with one byte of one untouched member changed (its RECORD left as released)."""
    ps = built.patch_set
    changed = tmp_path / built.release.name
    targets = {t.path for t in ps.targets}
    with zipfile.ZipFile(built.release) as zf, built.release.open("rb") as raw, changed.open("wb") as out:
        victim = next(i for i in zf.infolist() if i.filename.endswith(".py") and i.filename not in targets
                      and i.file_size > 100)
        data = bytearray(zf.read(victim))
        data[len(data) // 2] ^= 0x01

        def members():  # type: ignore[no-untyped-def]
            for info in zf.infolist():
                yield (Member.new(info.filename, bytes(data), like=info, date_time=info.date_time)
                       if info is victim else copied(raw, info))

        write_archive(out, members())
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with pytest.raises(UsageError) as info:
        build_patched_wheel(ps.spec, out_dir=out_dir, from_wheel=changed)
    message = str(info.value)
    assert f"{victim.filename} hashing to {sha256_bytes(bytes(data))}" in message and "\n" not in message
    assert list(out_dir.iterdir()) == []


def test_the_fleet_example_installs_into_a_fresh_venv(wheels: Path, tmp_path: Path) -> None:
    """docs/examples/fleet/install-patched-wheels.sh, as the example Dockerfile's SGLang image runs it, minus the
    dependency step (no index here): its patched wheels (SGLang with vLLM beside it) into a fresh venv with
    --no-deps, then `t4patch status --check` through --python."""
    specs = dockerfile_specs()
    by_spec = {ps.spec: ps for ps in PATCH_SETS}
    for spec in specs:
        patched_wheel(by_spec[spec], wheels)
    venv = tmp_path / "serve"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    progress(f"install-patched-wheels {' '.join(specs)} into a fresh venv ...")
    proc = subprocess.run(["sh", str(SCRIPT), str(wheels), *specs], capture_output=True, text=True,
                          # The image byte-compiles vLLM's modules; the test need not. pip reads a "no-" option's
                          # environment value inverted: PIP_NO_COMPILE=0 is --no-compile (checked with pip 26.3).
                          env={**os.environ, "PIP_NO_COMPILE": "0", "PYTHON": str(venv / "bin" / "python"),
                               "T4PATCH": str(Path(sys.executable).parent / "t4patch")})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert all(f"{by_spec[spec].distribution} {_BUILT[spec].version}: applied" in proc.stdout for spec in specs), (
        proc.stdout)


OPTIONAL = [ps for ps in PATCH_SETS if ps.option_names]


@pytest.mark.skipif(not OPTIONAL, reason="no shipped patch set has optional diffs")
@pytest.mark.parametrize("ps", OPTIONAL, ids=[ps.spec for ps in OPTIONAL])
def test_with_every_optional_diff(ps: PatchSet, wheels: Path, tmp_path: Path) -> None:
    """--with NAME on the real wheel: the optional diffs' files are patched too, under a label of their own."""
    release = wheel_path(ps.distribution, ps.version)
    progress(f"t4patch wheel {ps.spec} --with {' '.join(ps.option_names)} ...")
    result = build_patched_wheel(ps.spec, out_dir=tmp_path, from_wheel=release, options=ps.option_names)
    assert result.options == tuple(sorted(ps.option_names))
    assert result.label != patched_wheel(ps, wheels).label  # the default set's wheel (shared, built once)
    with zipfile.ZipFile(result.path) as zf:
        for target in ps.with_options(ps.option_names).targets:
            assert sha256_bytes(zf.read(target.path)) == target.patched_sha256
