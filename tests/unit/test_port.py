"""`t4patch port` on synthetic wheels: each way a hunk lands (exact, offset, 3-way merge, already upstream) and
each way it does not (a real conflict, a missing file), the draft it writes, and apply refusing that draft.

The OLD release 1.0 of "portengine" has a patch set of two diffs; the NEW release's files are edited copies.
Both wheels are real zip files with a RECORD, put in a wheel cache the test points T4PATCH_WHEEL_CACHE at.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from t4patch.errors import PatchSetError
from t4patch.patching.diffwrite import unified_diff
from t4patch.patching.hunkport import port_file_diff
from t4patch.patching.manifest import load_patch_set
from t4patch.patching.unified_diff import parse_diff
from tests.helpers import make_dist, record_hash, sha

NAME = "portengine"
BODY = [f"x{i} = {i}\n" for i in range(1, 61)]
KERNEL = "".join(["def tile():\n", "    tile = 32\n", "    return tile\n", *BODY])
KERNEL_PATCHED = KERNEL.replace("    tile = 32\n", "    tile = 32\n    if small_gpu():\n        tile = 16\n")
CONFIG = "".join([*BODY[:20], "MIN_CAPABILITY = 80\n", *BODY[20:40]])
CONFIG_PATCHED = CONFIG.replace("MIN_CAPABILITY = 80", "MIN_CAPABILITY = 75")


def make_wheel(cache: Path, version: str, files: dict[str, str]) -> Path:
    cache.mkdir(parents=True, exist_ok=True)
    wheel = cache / f"{NAME}-{version}-py3-none-any.whl"
    dist_info = f"{NAME}-{version}.dist-info"
    rows = []
    with zipfile.ZipFile(wheel, "w") as zf:
        for rel, text in {f"{NAME}/__init__.py": "", **files}.items():
            zf.writestr(rel, text)
            rows.append(f"{rel},{record_hash(text.encode())},{len(text.encode())}")
        metadata = f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {version}\n"
        zf.writestr(f"{dist_info}/METADATA", metadata)
        rows.append(f"{dist_info}/METADATA,{record_hash(metadata.encode())},{len(metadata)}")
        rows.append(f"{dist_info}/RECORD,,")
        zf.writestr(f"{dist_info}/RECORD", "\n".join(rows) + "\n")
    return wheel


def make_old_set(root: Path) -> Path:
    directory = root / NAME / "1.0"
    directory.mkdir(parents=True)
    (directory / "0001-tile.diff").write_text(unified_diff(f"{NAME}/kernel.py", KERNEL.encode(), KERNEL_PATCHED.encode()))
    (directory / "0002-gate.diff").write_text(unified_diff(f"{NAME}/config.py", CONFIG.encode(), CONFIG_PATCHED.encode()))
    (directory / "manifest.toml").write_text(f"""\
# the OLD set's header comment
schema = 1
distribution = "{NAME}"
version = "1.0"
packages = ["{NAME}"]
summary = "synthetic set to port"

[[patch]]
file = "0001-tile.diff"
title = "smaller tile"
fixes = "out of shared memory"
gpus = "cc < 8.0"
references = ["https://example.invalid/issue/1"]

[patch.upstream]
link = "https://example.invalid/pull/2"
relation = "replaces"
forwarded = "no"
why = "upstream's fix is still open"

[[patch]]
file = "0002-gate.diff"
title = "gate 75"
fixes = "refused below 80"
gpus = "cc 7.5"

[[target]]
path = "{NAME}/kernel.py"
pristine_sha256 = "{sha(KERNEL.encode())}"
patched_sha256 = "{sha(KERNEL_PATCHED.encode())}"

[[target]]
path = "{NAME}/config.py"
pristine_sha256 = "{sha(CONFIG.encode())}"
patched_sha256 = "{sha(CONFIG_PATCHED.encode())}"
""")
    load_patch_set(directory)
    return directory


@pytest.fixture
def world(tmp_path, monkeypatch):
    patches, cache = tmp_path / "patches", tmp_path / "wheels"
    make_old_set(patches)
    make_wheel(cache, "1.0", {f"{NAME}/kernel.py": KERNEL, f"{NAME}/config.py": CONFIG})
    monkeypatch.setenv("T4PATCH_PATCHES", str(patches))
    monkeypatch.setenv("T4PATCH_WHEEL_CACHE", str(cache))
    return tmp_path


def port_json(cli, world: Path, new_files: dict[str, str], version: str = "2.0", code: int = 0) -> dict:
    """The port's JSON report; ``code`` 17 (IncompletePortError) where the draft needs a hand edit."""
    make_wheel(world / "wheels", version, new_files)
    result = cli("port", f"{NAME}=={version}", "-o", str(world / "drafts"), "--json")
    assert result.code == code, result.err
    return json.loads(result.out)


def methods(report: dict) -> list[str]:
    return [h["method"] for d in report["diffs"] for f in d["files"] for h in f["hunks"]]


def test_same_files_land_exactly_and_the_draft_is_proven(cli, world):
    report = port_json(cli, world, {f"{NAME}/kernel.py": KERNEL, f"{NAME}/config.py": CONFIG})
    assert methods(report) == ["exact", "exact"] and report["complete"]
    assert report["from"] == f"{NAME}==1.0" and report["to"] == f"{NAME}==2.0"
    assert report["record_checked"] == [f"{NAME}/kernel.py", f"{NAME}/config.py"]
    draft = load_patch_set(Path(report["draft"]))
    assert draft.draft and draft.version == "2.0"
    assert draft.patches[0].upstream is not None and draft.patches[0].upstream.link.endswith("/pull/2")
    assert len(report["proof"]) == 2 and report["compiled"] == report["record_checked"]
    assert "DRAFT" in (Path(report["draft"]) / "manifest.toml").read_text()


def test_shifted_code_lands_at_a_reported_offset(cli, world):
    shifted = "".join(f"# new header {i}\n" for i in range(7)) + KERNEL
    report = port_json(cli, world, {f"{NAME}/kernel.py": shifted, f"{NAME}/config.py": CONFIG})
    hunk = report["diffs"][0]["files"][0]["hunks"][0]
    assert hunk["method"] == "offset" and hunk["offset"] == 7 and hunk["new_line"] == 8
    draft = Path(report["draft"])
    # the regenerated diff states the NEW line, so apply (which never searches) takes it exactly
    (fd,) = parse_diff((draft / "0001-tile.diff").read_text())
    assert fd.hunks[0].source_start == 7  # 3 lines of NEW context: "# new header 6", "def tile():", "tile = 32"


def test_changed_context_lands_by_three_way_merge(cli, world):
    # a context line two lines below the change differs in NEW: exact context fails, a 3-way merge is clean
    changed = KERNEL.replace("x1 = 1\n", "x1 = 100\n")
    report = port_json(cli, world, {f"{NAME}/kernel.py": changed, f"{NAME}/config.py": CONFIG})
    assert methods(report) == ["merge", "exact"] and report["complete"]
    patched = changed.replace("    tile = 32\n", "    tile = 32\n    if small_gpu():\n        tile = 16\n")
    draft = load_patch_set(Path(report["draft"]))
    assert draft.targets[0].patched_sha256 == sha(patched.encode())


def test_a_change_already_upstream_is_detected_and_its_diff_dropped(cli, world):
    report = port_json(cli, world, {f"{NAME}/kernel.py": KERNEL, f"{NAME}/config.py": CONFIG_PATCHED})
    gate = report["diffs"][1]
    assert gate["outcome"] == "upstream" and gate["new_file"] is None and "already upstream" in gate["note"]
    draft = load_patch_set(Path(report["draft"]))
    assert [p.file for p in draft.patches] == ["0001-tile.diff"]
    assert [t.path for t in draft.targets] == [f"{NAME}/kernel.py"]
    assert report["complete"]


def test_a_real_conflict_fails_the_hunk_shows_the_new_code_and_never_fuzzes(cli, world):
    conflicting = KERNEL.replace("    tile = 32\n", "    tile = 64  # NEW changed the very line\n")
    report = port_json(cli, world, {f"{NAME}/kernel.py": conflicting, f"{NAME}/config.py": CONFIG}, code=17)
    tile = report["diffs"][0]
    assert tile["outcome"] == "failed" and tile["new_file"] is None
    hunk = tile["files"][0]["hunks"][0]
    assert hunk["method"] == "failed" and "conflict" in hunk["note"]
    assert any("tile = 64" in line for line in hunk["around"])
    assert not report["complete"]
    draft = load_patch_set(Path(report["draft"]))  # what landed is still a proven draft
    assert [p.file for p in draft.patches] == ["0001-gate.diff"]


def test_a_file_missing_in_new_is_reported(cli, world):
    report = port_json(cli, world, {f"{NAME}/config.py": CONFIG}, code=17)
    assert report["missing_files"] == [f"{NAME}/kernel.py"]
    assert report["diffs"][0]["outcome"] == "failed"
    assert "not in" in report["diffs"][0]["files"][0]["hunks"][0]["note"]
    again = cli("port", f"{NAME}==2.0", "-o", str(world / "drafts"))
    assert again.code == 17 and "MISSING in NEW" in again.out and "INCOMPLETE" in again.out


def test_apply_refuses_a_draft_until_the_mark_is_removed(cli, world, monkeypatch):
    report = port_json(cli, world, {f"{NAME}/kernel.py": KERNEL, f"{NAME}/config.py": CONFIG})
    drafts = world / "drafts"
    site = make_dist(world / "site", NAME, "2.0", {f"{NAME}/__init__.py": "", f"{NAME}/kernel.py": KERNEL,
                                                  f"{NAME}/config.py": CONFIG})
    before = (site / NAME / "kernel.py").read_bytes()
    refused = cli("--patches", str(drafts), "apply", f"{NAME}==2.0", "--site-packages", str(site))
    assert refused.code == PatchSetError.exit_code == 7
    assert "is a draft written by `t4patch port`" in refused.err and "draft = true" in refused.err
    assert (site / NAME / "kernel.py").read_bytes() == before
    assert cli("--patches", str(drafts), "validate", report["draft"]).code == 0  # a draft is valid data
    manifest = Path(report["draft"]) / "manifest.toml"
    manifest.write_text(manifest.read_text().replace("draft = true\n", ""))
    applied = cli("--patches", str(drafts), "apply", f"{NAME}==2.0", "--site-packages", str(site))
    assert applied.code == 0, applied.err
    assert sha((site / NAME / "kernel.py").read_bytes()) == sha(KERNEL_PATCHED.encode())
    # and port never writes over a reviewed set
    again = cli("--patches", str(world / "patches"), "port", f"{NAME}==2.0", "-o", str(drafts))
    assert again.code == 2 and "reviewed patch set" in again.err


def test_port_refuses_a_range_and_a_foreign_from(cli, world):
    assert cli("port", f"{NAME}>=2.0").code == 2
    bad = cli("port", f"{NAME}==2.0", "--from", "other==1.0")
    assert bad.code == 2 and "expected a release of portengine" in bad.err


def test_hunks_land_in_order_and_never_overlap():
    # two hunks whose old lines also occur elsewhere: each lands at its own nearest place, in order
    old = "".join(["a\n", "b\n", "c\n", *BODY[:10], "a\n", "b\n", "c\n"])  # any text: not compiled here
    new_text = old.replace("b\n", "B\n")
    (fd,) = parse_diff(unified_diff("p/x.py", old.encode(), new_text.encode(), context=1))
    result = port_file_diff(fd, old.encode(), ("zz\n" + old).encode())
    assert [h.method for h in result.hunks] == ["offset", "offset"]
    assert result.after == ("zz\n" + new_text).encode()


def test_a_patched_file_that_does_not_compile_is_reported(cli, world):
    # every hunk lands, but the result does not parse (here NEW itself breaks a line far from the hunk): the
    # report says so and calls the draft incomplete instead of calling it ported
    broken = KERNEL.replace("x30 = 30\n", "x30 = (\n")
    report = port_json(cli, world, {f"{NAME}/kernel.py": broken, f"{NAME}/config.py": CONFIG}, code=17)
    assert methods(report) == ["exact", "exact"]
    assert report["compile_errors"] and report["compile_errors"][0].startswith(f"{NAME}/kernel.py:")
    assert report["compiled"] == [f"{NAME}/config.py"] and not report["complete"]


def test_a_release_without_a_set_names_the_nearest_and_the_port_command(cli, world):
    site = make_dist(world / "site", NAME, "1.5", {f"{NAME}/__init__.py": "", f"{NAME}/kernel.py": KERNEL,
                                                  f"{NAME}/config.py": CONFIG})
    result = cli("apply", NAME, "--site-packages", str(site))
    assert result.code == 5
    assert "has patch sets for portengine 1.0 only (nearest: 1.0)" in result.err
    assert f"t4patch port {NAME}==1.5 --from {NAME}==1.0" in result.err
