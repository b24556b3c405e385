"""The optional diff ``decode-sliding-window`` of SGLang end to end on the real released wheels.

apply --with on a pristine install and on one with the default set applied (then only the option's files are
written), status in text and --json, status --check with and without --with, a plain apply keeping it, revert
giving back every RECORD sha256; and ``t4patch wheel --with``: another label than the plain wheel, and an
install from it (pip --no-deps --target) that status reports as applied with the option on. The apply/status/
revert tests run for every shipped SGLang set (0.5.21, 0.5.22, 0.5.23), the wheel test for 0.5.23.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from t4patch.environment.target import resolve_target
from t4patch.fileio.hashing import sha256_file
from t4patch.patching.registry import all_patch_sets, find_patch_set
from t4patch.patching.wheel import build_patched_wheel
from tests.helpers import (
    companions_standin,
    extracted_wheel,
    install_wheel_to,
    progress,
    site_from_extracted,
    wheel_path,
)

pytestmark = pytest.mark.integration

ENGINE, VERSION, OPTION = "sglang", "0.5.23", "decode-sliding-window"
SPEC = f"{ENGINE}=={VERSION}"
RELEASES = [ps.version for ps in all_patch_sets() if ps.distribution == ENGINE and OPTION in ps.option_names]


def test_every_shipped_sglang_set_carries_the_option() -> None:
    assert VERSION in RELEASES and len(RELEASES) == 3, RELEASES


@pytest.fixture(params=RELEASES)
def ps(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("T4PATCH_PATCHES", raising=False)  # the shipped sets
    return find_patch_set(ENGINE, request.param)


@pytest.fixture
def site(ps, tmp_path: Path) -> Path:
    tree = extracted_wheel(wheel_path(ENGINE, ps.version))
    site = site_from_extracted(tree, tmp_path / "site", [t.path for t in ps.targets + ps.optional_targets])
    return companions_standin(site, ps)  # status --check requires the set's companions


def record_mismatches(site: Path) -> list[str]:
    """Files present in ``site`` whose sha256 is not the one the wheel's RECORD lists."""
    dist = resolve_target(site_packages=str(site)).find(ENGINE)
    assert dist is not None
    return sorted(rel for rel, digest in dist.record().items()
                  if digest is not None and not rel.startswith("../") and (site / rel).exists()
                  and sha256_file(site / rel) != digest)


def engine_doc(cli, site: Path, *extra: str) -> dict:
    result = cli("status", ENGINE, "--json", *extra, "--site-packages", str(site))
    (engine,) = json.loads(result.out)["engines"]
    return engine


def test_apply_with_status_check_and_revert_on_the_real_wheel(ps, site: Path, cli) -> None:
    at, spec = ["--site-packages", str(site)], ps.spec
    option_paths = [t.path for t in ps.optional_targets]
    assert record_mismatches(site) == []

    assert cli("apply", spec, *at).code == 0
    assert cli("status", "--check", *at).code == 0  # the default set is what --check needs
    off = engine_doc(cli, site)
    assert off["state"] == "applied" and [(o["name"], o["state"]) for o in off["options"]] == [(OPTION, "not-applied")]
    assert cli("status", "--check", "--with", OPTION, *at).code == 9

    default_bytes = {t.path: (site / t.path).read_bytes() for t in ps.targets}
    dry = cli("apply", spec, "--with", OPTION, "--dry-run", *at)
    assert dry.code == 0 and dry.out.count("+++ b/") == len(option_paths)
    result = cli("apply", spec, "--with", OPTION, *at)
    assert result.code == 0, result.err
    assert f"{spec} with {OPTION}: applied, {len(option_paths)} file(s) written" in result.out
    assert {t.path: (site / t.path).read_bytes() for t in ps.targets} == default_bytes  # untouched
    for target in ps.targets + ps.optional_targets:
        assert sha256_file(site / target.path) == target.patched_sha256, target.path
    assert record_mismatches(site) == sorted(t.path for t in ps.targets + ps.optional_targets)

    on = engine_doc(cli, site, "--check", "--with", OPTION)
    assert on["state"] == "applied"
    (option,) = on["options"]
    assert option["state"] == "applied" and [f["path"] for f in option["files"]] == option_paths
    assert on["record"]["options"] == [OPTION]
    text = cli("status", ENGINE, *at).out
    assert f"optional {OPTION}: applied" in text and f"record: {spec} with {OPTION} applied" in text

    plain = cli("apply", ENGINE, *at)
    assert plain.code == 0 and f"optional {OPTION} was already applied and is left applied" in plain.out

    reverted = cli("revert", ENGINE, *at)
    assert reverted.code == 0, reverted.err
    assert f"{len(ps.targets) + len(option_paths)} file(s) written" in reverted.out
    assert record_mismatches(site) == [], "revert must give back every RECORD sha256, the option's files included"
    assert engine_doc(cli, site)["options"][0]["state"] == "not-applied"
    assert cli("status", "--check", *at).code == 9


def test_apply_with_on_a_pristine_real_install_then_revert(ps, site: Path, cli) -> None:
    at, spec = ["--site-packages", str(site)], ps.spec
    result = cli("apply", spec, "--with", OPTION, *at)
    assert result.code == 0, result.err
    assert f"{len(ps.targets) + len(ps.optional_targets)} file(s) written" in result.out
    assert cli("status", "--check", "--with", OPTION, *at).code == 0
    assert cli("revert", ENGINE, *at).code == 0
    assert record_mismatches(site) == []


@pytest.mark.parametrize("ps", [VERSION], indirect=True)
def test_wheel_with_the_option_installs_as_applied(ps, tmp_path: Path, cli) -> None:
    release = wheel_path(ENGINE, VERSION)
    progress(f"t4patch wheel {SPEC} and {SPEC} --with {OPTION} ...")
    plain = build_patched_wheel(SPEC, out_dir=tmp_path / "plain", from_wheel=release)
    chosen = build_patched_wheel(SPEC, out_dir=tmp_path / "with", from_wheel=release, options=(OPTION,))
    assert chosen.options == (OPTION,) and chosen.label != plain.label and chosen.version != plain.version
    with zipfile.ZipFile(chosen.path) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/t4patch.json")]
        assert json.loads(zf.read(name))["options"] == [OPTION]

    site = companions_standin(install_wheel_to(tmp_path / "site", chosen.path), ps)
    at = ["--site-packages", str(site)]
    doc = engine_doc(cli, site, "--check", "--with", OPTION)
    assert doc["installed_version"] == chosen.version and doc["state"] == "applied"
    assert [(o["name"], o["state"]) for o in doc["options"]] == [(OPTION, "applied")]
    assert doc["record"]["options"] == [OPTION]
    assert cli("status", "--check", "--with", OPTION, *at).code == 0
    assert "already applied" in cli("apply", ENGINE, *at).out

    reverted = cli("revert", ENGINE, *at)
    assert reverted.code == 0, reverted.err
    for target in ps.targets + ps.optional_targets:
        assert sha256_file(site / target.path) == target.pristine_sha256, target.path
