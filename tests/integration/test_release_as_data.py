"""A new engine release is data only: a new ``patches/<engine>/<version>/`` directory, no Python edited.

The "new release" is built from the real released wheel's files: the members the patch set targets plus the
wheel's own ``.dist-info`` (METADATA and RECORD), re-labelled with a version t4patch has never heard of. The
patch set is a copy of the shipped one with only that version changed, in a copy of the shipped tree that
``T4PATCH_PATCHES`` points at. list, validate, apply, status and revert must then all work on it.
"""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import pytest

from t4patch.data.locations import data_dir
from t4patch.fileio.hashing import sha256_file
from t4patch.patching.registry import find_patch_set
from tests.helpers import wheel_path

pytestmark = pytest.mark.integration

NEW_VERSION = "0.33.1"  # not a release t4patch ships a set for


def _relabel_dist_info(site: Path, old: str, new: str) -> None:
    """Rename ``vllm-OLD.dist-info`` to ``vllm-NEW.dist-info`` and give METADATA and RECORD the new version."""
    old_dir = site / f"vllm-{old}.dist-info"
    new_dir = site / f"vllm-{new}.dist-info"
    old_dir.rename(new_dir)
    metadata = new_dir / "METADATA"
    text = metadata.read_text(encoding="utf-8")
    assert f"\nVersion: {old}\n" in text
    metadata.write_text(text.replace(f"\nVersion: {old}\n", f"\nVersion: {new}\n", 1), encoding="utf-8")
    record = new_dir / "RECORD"
    record.write_text(
        record.read_text(encoding="utf-8").replace(f"vllm-{old}.dist-info/", f"vllm-{new}.dist-info/"),
        encoding="utf-8",
    )


@pytest.fixture(scope="module")
def new_release(tmp_path_factory):
    """(site-packages with vllm NEW_VERSION built from the real 0.33.0 files, patch tree with a NEW_VERSION set)."""
    shipped = find_patch_set("vllm", "0.33.0")
    root = tmp_path_factory.mktemp("new-release")
    site = root / "site"
    with zipfile.ZipFile(wheel_path("vllm", "0.33.0")) as zf:
        members = [t.path for t in shipped.targets]
        members += [n for n in zf.namelist() if n.startswith("vllm-0.33.0.dist-info/")]
        for name in members:
            zf.extract(name, site)
    _relabel_dist_info(site, "0.33.0", NEW_VERSION)

    patches = root / "patches"
    shutil.copytree(data_dir("patches"), patches)
    new_set = patches / "vllm" / NEW_VERSION
    shutil.copytree(patches / "vllm" / "0.33.0", new_set)
    manifest = new_set / "manifest.toml"
    text = manifest.read_text(encoding="utf-8")
    assert 'version = "0.33.0"' in text
    manifest.write_text(text.replace('version = "0.33.0"', f'version = "{NEW_VERSION}"', 1), encoding="utf-8")
    return site, patches, shipped


def test_new_release_works_from_data_alone(new_release, cli, monkeypatch):
    site, patches, shipped = new_release
    monkeypatch.setenv("T4PATCH_PATCHES", str(patches))
    target = ["--site-packages", str(site)]
    spec = f"vllm=={NEW_VERSION}"

    listed = json.loads(cli("list", "--json").out)
    assert spec in {f"{p['distribution']}=={p['version']}" for p in listed["patch_sets"]}
    validated = cli("validate", str(patches / "vllm" / NEW_VERSION))
    assert validated.code == 0 and f"{spec}: valid" in validated.out, validated.err

    before = json.loads(cli("status", "vllm", "--json", *target).out)["engines"][0]
    assert (before["installed_version"], before["patch_set"], before["state"]) == (NEW_VERSION, spec, "not-applied")

    applied = cli("apply", spec, *target)
    assert applied.code == 0, applied.err
    assert cli("status", "vllm", "--check", *target).code == 0
    for t in shipped.targets:
        assert sha256_file(site / t.path) == t.patched_sha256
    record = json.loads((site / f"vllm-{NEW_VERSION}.dist-info" / "t4patch.json").read_text(encoding="utf-8"))
    assert record["patch_set"] == spec

    reverted = cli("revert", "vllm", *target)
    assert reverted.code == 0, reverted.err
    for t in shipped.targets:
        assert sha256_file(site / t.path) == t.pristine_sha256
    assert cli("status", "vllm", "--check", *target).code == 9


def test_the_shipped_tree_does_not_know_the_new_release(new_release, cli, monkeypatch):
    """Without the new directory the same install has no patch set: the directory alone made the difference."""
    site, _, _ = new_release
    monkeypatch.delenv("T4PATCH_PATCHES", raising=False)
    status = json.loads(cli("status", "vllm", "--json", "--site-packages", str(site)).out)["engines"][0]
    assert status["state"] == "no-patch-set"
    assert cli("apply", f"vllm=={NEW_VERSION}", "--site-packages", str(site)).code == 5
