"""The optional diff ``decode-sliding-window`` of SGLang 0.5.23 end to end on the real released wheel.

apply --with on a pristine install and on one with the default set applied (then only the option's files are
written), status in text and --json, status --check with and without --with, a plain apply keeping it, revert
giving back every RECORD sha256; and ``t4patch wheel --with``: another label than the plain wheel, and an
install from it (pip --no-deps --target) that status reports as applied with the option on.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from t4patch.environment.target import resolve_target
from t4patch.fileio.hashing import sha256_file
from t4patch.patching.registry import find_patch_set
from t4patch.patching.wheel import build_patched_wheel
from tests.helpers import extracted_wheel, install_wheel_to, progress, site_from_extracted, wheel_path

pytestmark = pytest.mark.integration

ENGINE, VERSION, OPTION = "sglang", "0.5.23", "decode-sliding-window"
SPEC = f"{ENGINE}=={VERSION}"


@pytest.fixture
def ps(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.delenv("T4PATCH_PATCHES", raising=False)  # the shipped sets
    patch_set = find_patch_set(ENGINE, VERSION)
    assert OPTION in patch_set.option_names
    return patch_set


@pytest.fixture
def site(ps, tmp_path: Path) -> Path:  # type: ignore[no-untyped-def]
    tree = extracted_wheel(wheel_path(ENGINE, VERSION))
    return site_from_extracted(tree, tmp_path / "site", [t.path for t in ps.targets + ps.optional_targets])


def record_mismatches(site: Path) -> list[str]:
    """Files present in ``site`` whose sha256 is not the one the wheel's RECORD lists."""
    dist = resolve_target(site_packages=str(site)).find(ENGINE)
    assert dist is not None
    return sorted(rel for rel, digest in dist.record().items()
                  if digest is not None and not rel.startswith("../") and (site / rel).exists()
                  and sha256_file(site / rel) != digest)


def engine_doc(cli, site: Path, *extra: str) -> dict:  # type: ignore[no-untyped-def, type-arg]
    result = cli("status", ENGINE, "--json", *extra, "--site-packages", str(site))
    (engine,) = json.loads(result.out)["engines"]
    return engine


def test_apply_with_status_check_and_revert_on_the_real_wheel(ps, site: Path, cli) -> None:  # type: ignore[no-untyped-def]
    at = ["--site-packages", str(site)]
    option_paths = [t.path for t in ps.optional_targets]
    assert record_mismatches(site) == []

    assert cli("apply", SPEC, *at).code == 0
    assert cli("status", "--check", *at).code == 0  # the default set is what --check needs
    off = engine_doc(cli, site)
    assert off["state"] == "applied" and [(o["name"], o["state"]) for o in off["options"]] == [(OPTION, "not-applied")]
    assert cli("status", "--check", "--with", OPTION, *at).code == 9

    default_bytes = {t.path: (site / t.path).read_bytes() for t in ps.targets}
    dry = cli("apply", SPEC, "--with", OPTION, "--dry-run", *at)
    assert dry.code == 0 and dry.out.count("+++ b/") == len(option_paths)
    result = cli("apply", SPEC, "--with", OPTION, *at)
    assert result.code == 0, result.err
    assert f"{SPEC} with {OPTION}: applied, {len(option_paths)} file(s) written" in result.out
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
    assert f"optional {OPTION}: applied" in text and f"record: {SPEC} with {OPTION} applied" in text

    plain = cli("apply", ENGINE, *at)
    assert plain.code == 0 and f"optional {OPTION} was already applied and is left applied" in plain.out

    reverted = cli("revert", ENGINE, *at)
    assert reverted.code == 0, reverted.err
    assert f"{len(ps.targets) + len(option_paths)} file(s) written" in reverted.out
    assert record_mismatches(site) == [], "revert must give back every RECORD sha256, the option's files included"
    assert engine_doc(cli, site)["options"][0]["state"] == "not-applied"
    assert cli("status", "--check", *at).code == 9


def test_apply_with_on_a_pristine_real_install_then_revert(ps, site: Path, cli) -> None:  # type: ignore[no-untyped-def]
    at = ["--site-packages", str(site)]
    result = cli("apply", SPEC, "--with", OPTION, *at)
    assert result.code == 0, result.err
    assert f"{len(ps.targets) + len(ps.optional_targets)} file(s) written" in result.out
    assert cli("status", "--check", "--with", OPTION, *at).code == 0
    assert cli("revert", ENGINE, *at).code == 0
    assert record_mismatches(site) == []


def test_wheel_with_the_option_installs_as_applied(ps, tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    release = wheel_path(ENGINE, VERSION)
    progress(f"t4patch wheel {SPEC} and {SPEC} --with {OPTION} ...")
    plain = build_patched_wheel(SPEC, out_dir=tmp_path / "plain", from_wheel=release)
    chosen = build_patched_wheel(SPEC, out_dir=tmp_path / "with", from_wheel=release, options=(OPTION,))
    assert chosen.options == (OPTION,) and chosen.label != plain.label and chosen.version != plain.version
    with zipfile.ZipFile(chosen.path) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/t4patch.json")]
        assert json.loads(zf.read(name))["options"] == [OPTION]

    site = install_wheel_to(tmp_path / "site", chosen.path)
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
