"""The loader refuses bad patch-set data before it can touch a file."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from t4patch.data.locations import data_dir
from t4patch.errors import PatchSetError
from t4patch.patching.manifest import load_patch_set
from t4patch.patching.registry import all_patch_sets
from tests.helpers import CONFIG, CONFIG_PATCHED, KERNEL, KERNEL_PATCHED, make_patch_set, sha


def edit_manifest(directory: Path, old: str, new: str) -> None:
    manifest = directory / "manifest.toml"
    text = manifest.read_text()
    assert old in text
    manifest.write_text(text.replace(old, new))


def test_synthetic_set_loads(tmp_path):
    ps = load_patch_set(make_patch_set(tmp_path))
    assert ps.spec == "fakeengine==1.2.0"
    assert [p.file for p in ps.patches] == ["0001-change-1.diff", "0002-change-2.diff"]
    assert {t.path for t in ps.targets} == {"fakeengine/kernel.py", "fakeengine/config.py"}


@pytest.mark.parametrize(
    "bad_path, complaint",
    [
        ("/etc/passwd", "relative POSIX path"),
        ("fakeengine/../../evil.py", "'..'"),
        ("otherpkg/x.py", "outside the distribution's packages"),
        ("fakeengine\\\\x.py", "relative POSIX path"),
    ],
)
def test_diff_target_paths_are_confined(tmp_path, bad_path, complaint):
    directory = make_patch_set(tmp_path, changes=[(bad_path.replace("\\\\", "\\"), CONFIG, CONFIG_PATCHED)])
    with pytest.raises(PatchSetError, match=complaint if complaint != "'..'" else r"'\.\.'"):
        load_patch_set(directory)


@pytest.mark.parametrize(
    "old, new, complaint",
    [
        ("schema = 1", "schema = 2", "expected schema = 1"),
        ('version = "1.2.0"', 'version = "1.2.1"', "lives in"),
        ('version = "1.2.0"', 'version = "not a version"', "PEP 440"),
        ('packages = ["fakeengine"]', "packages = []", "packages"),
        ('title = "change 1"', 'title = ""', r"patch\[1\]\.title: expected a non-empty string"),
        ('file = "0002-change-2.diff"', 'file = "0003-change-2.diff"', "numbers must run"),
        ('file = "0001-change-1.diff"', 'file = "change-1.diff"', "must look like"),
    ],
)
def test_manifest_fields_are_checked(tmp_path, old, new, complaint):
    directory = make_patch_set(tmp_path)
    edit_manifest(directory, old, new)
    if "0003" in new:
        (directory / "0002-change-2.diff").rename(directory / "0003-change-2.diff")
    if new.startswith('file = "change'):
        (directory / "0001-change-1.diff").rename(directory / "change-1.diff")
    with pytest.raises(PatchSetError, match=complaint):
        load_patch_set(directory)


def test_bad_hash_format_and_equal_hashes(tmp_path):
    directory = make_patch_set(tmp_path)
    text = (directory / "manifest.toml").read_text()
    pristine_line = next(line for line in text.splitlines() if line.startswith("pristine_sha256"))
    edit_manifest(directory, pristine_line, 'pristine_sha256 = "ABC"')
    with pytest.raises(PatchSetError, match="64 lowercase hex"):
        load_patch_set(directory)


def test_untracked_target_and_stray_file(tmp_path):
    directory = make_patch_set(tmp_path)
    (directory / "notes.txt").write_text("stray")
    with pytest.raises(PatchSetError, match="not listed in the manifest"):
        load_patch_set(directory)
    (directory / "notes.txt").unlink()
    text = (directory / "manifest.toml").read_text()
    head, _, _ = text.partition('\n[[target]]\npath = "fakeengine/config.py"')
    (directory / "manifest.toml").write_text(head + "\n")
    with pytest.raises(PatchSetError, match="no \\[\\[target\\]\\] hashes"):
        load_patch_set(directory)


def test_diff_must_only_modify(tmp_path):
    directory = make_patch_set(tmp_path)
    (directory / "0002-change-2.diff").write_text(
        "--- /dev/null\n+++ b/fakeengine/new.py\n@@ -0,0 +1 @@\n+x = 1\n"
    )
    with pytest.raises(PatchSetError, match="only modifications"):
        load_patch_set(directory)


def test_garbage_diff(tmp_path):
    directory = make_patch_set(tmp_path)
    (directory / "0001-change-1.diff").write_text("this is not a diff\n")
    with pytest.raises(PatchSetError, match="no file changes|not a unified diff"):
        load_patch_set(directory)


def test_diff_that_does_not_produce_the_pinned_hash_is_refused_at_apply(env, cli):
    manifest = env.patches / "fakeengine" / "1.2.0" / "manifest.toml"
    text = manifest.read_text()
    from tests.helpers import sha

    manifest.write_text(text.replace(sha(CONFIG_PATCHED.encode()), "0" * 64))
    snapshot = env.snapshot()
    result = cli("apply", "fakeengine", "--site-packages", str(env.site))
    assert result.code == PatchSetError.exit_code and "manifest pins" in result.err
    assert env.snapshot() == snapshot


def test_target_not_in_record_is_refused(env, cli):
    record = env.site / "fakeengine-1.2.0.dist-info" / "RECORD"
    record.write_text("".join(l for l in record.read_text().splitlines(True) if not l.startswith("fakeengine/config.py")))
    result = cli("apply", "fakeengine", "--site-packages", str(env.site))
    assert result.code == PatchSetError.exit_code and "not a file of the installed" in result.err


def test_every_shipped_patch_set_is_valid():
    sets = all_patch_sets()
    assert any(ps.spec == "vllm==0.33.0" for ps in sets)
    for ps in sets:
        for patch in ps.patches:
            assert patch.references, f"{ps.spec} {patch.file}: cite upstream"
            assert "8.0" in patch.gpus or "< 8" in patch.gpus or "7." in patch.gpus, patch.gpus


def test_validate_command(cli, tmp_path):
    result = cli("validate", "--json")
    assert result.code == 0
    import json

    assert any(r["patch_set"] == "vllm==0.33.0" for r in json.loads(result.out)["results"])
    broken = make_patch_set(tmp_path)
    (broken / "0001-change-1.diff").write_text("nope\n")
    bad = cli("validate", str(broken))
    assert bad.code == PatchSetError.exit_code


# ------------------------------------------------------------------ the strict reader, through `t4patch validate`


def copy_shipped_set(tmp_path: Path, spec: str = "vllm/0.33.0") -> Path:
    """A copy of a shipped patch set in tmp (the directory names must stay <distribution>/<version>)."""
    target = tmp_path / spec
    shutil.copytree(data_dir("patches") / spec, target)
    return target


@pytest.mark.parametrize(
    "old, new, key_named",
    [
        # unknown top-level key (the house issue's example: `summry = "x"` used to pass with exit 0)
        ("schema = 1\n", 'schema = 1\nsummry = "x"\n', "summry: unknown key 'summry' (allowed in top level: schema, "),
        # unknown key inside the 1st [[patch]] table (`references` misspelt)
        ("references = [", "referencs = [", "patch[1].referencs: unknown key 'referencs' (allowed in patch[1]: file, "),
        # wrong type
        ('version = "0.33.0"', "version = 0.33", None),
        ('packages = ["vllm"]', 'packages = "vllm"', "packages: expected a non-empty array of non-empty strings, found a string ('vllm')"),
        ("schema = 1\n", 'schema = "1"\n', "schema: expected an integer, found a string ('1')"),
        # missing required key
        ('gpus = "compute capability', '# gpus = "compute capability', "patch[1].gpus: missing required key 'gpus'"),
        ('summary = "', 'notes = "', "unknown key 'notes'"),
    ],
)
def test_validate_refuses_unknown_wrong_and_missing_keys(cli, tmp_path, old, new, key_named):
    directory = copy_shipped_set(tmp_path)
    edit_manifest(directory, old, new)
    before = {p.name: p.read_bytes() for p in directory.iterdir()}
    result = cli("validate", str(directory))
    assert result.code == PatchSetError.exit_code == 7
    assert "\n" not in result.err.strip()
    assert str(directory / "manifest.toml") in result.err
    if key_named is None:  # `version = 0.33` is a float in TOML
        assert "version: expected a non-empty string, found a float (0.33)" in result.err
    else:
        assert key_named in result.err
    assert {p.name: p.read_bytes() for p in directory.iterdir()} == before


def test_validate_refuses_missing_summary_and_names_it(cli, tmp_path):
    directory = copy_shipped_set(tmp_path)
    text = (directory / "manifest.toml").read_text()
    summary_line = next(line for line in text.splitlines() if line.startswith("summary = "))
    edit_manifest(directory, summary_line + "\n", "")
    result = cli("validate", str(directory))
    assert result.code == 7
    assert "summary: missing required key 'summary' (expected a non-empty string)" in result.err


def test_requires_table_is_in_the_schema(cli, tmp_path):
    directory = copy_shipped_set(tmp_path, "sglang/0.5.23")
    assert cli("validate", str(directory)).code == 0
    edit_manifest(directory, 'library = "vllm/', 'librar = "vllm/')
    result = cli("validate", str(directory))
    assert result.code == 7
    assert "requires[1].librar: unknown key 'librar' (allowed in requires[1]: distribution, version, why, library" in result.err
    edit_manifest(directory, 'librar = "vllm/', 'library = "vllm/')
    edit_manifest(directory, 'version = "0.33.0"\nwhy', "version = 33\nwhy")
    result = cli("validate", str(directory))
    assert result.code == 7 and "requires[1].version: expected a non-empty string, found an integer (33)" in result.err


# ------------------------------------------- maintenance metadata (DEP-3 style), optional diffs, drafts


UPSTREAM = (
    '\n[patch.upstream]\nlink = "https://github.com/o/r/pull/1"\nrelation = "replaces"\nforwarded = "no"\n'
    'why = "upstream fix pending"\n'
)


def add_after_first_patch(directory: Path, text: str) -> None:
    edit_manifest(directory, 'references = ["https://example.invalid/1"]\n\n[[patch]]',
                  f'references = ["https://example.invalid/1"]\n{text}\n[[patch]]')


def test_upstream_metadata_loads(tmp_path):
    directory = make_patch_set(tmp_path)
    add_after_first_patch(directory, UPSTREAM)
    up = load_patch_set(directory).patches[0].upstream
    assert up is not None and (up.link, up.relation, up.forwarded) == ("https://github.com/o/r/pull/1", "replaces", "no")
    assert load_patch_set(directory).patches[1].upstream is None


@pytest.mark.parametrize(
    "old, new, complaint",
    [
        ('relation = "replaces"', 'relation = "fixes"', "patch[1].upstream.relation: expected one of mirrors, replaces, related"),
        ('forwarded = "no"', "forwarded = false", "patch[1].upstream.forwarded: expected a non-empty string, found a boolean"),
        ('link = "https://', 'link = "http://', "patch[1].upstream.link: expected an https:// URL"),
        ('why = "upstream fix pending"\n', "", "patch[1].upstream.why: missing required key 'why'"),
        ('forwarded = "no"', 'forwarded = "no"\nbug = "x"', "patch[1].upstream.bug: unknown key 'bug' (allowed in "
         "patch[1].upstream: link, relation, forwarded, why)"),
    ],
)
def test_upstream_metadata_is_checked(tmp_path, cli, old, new, complaint):
    directory = make_patch_set(tmp_path)
    add_after_first_patch(directory, UPSTREAM)
    edit_manifest(directory, old, new)
    result = cli("validate", str(directory))
    assert result.code == 7 and complaint in result.err, result.err


def test_optional_diff_is_off_unless_asked_for(tmp_path):
    directory = make_patch_set(tmp_path)
    edit_manifest(directory, 'title = "change 2"', 'title = "change 2"\noptional = "gate"')
    ps = load_patch_set(directory)
    assert [p.file for p in ps.patches] == ["0001-change-1.diff"]
    assert [t.path for t in ps.targets] == ["fakeengine/kernel.py"]
    assert ps.option_names == ("gate",) and [t.path for t in ps.optional_targets] == ["fakeengine/config.py"]
    assert [p.file for p in ps.all_patches] == ["0001-change-1.diff", "0002-change-2.diff"]
    on = ps.with_options(["gate"])
    assert [p.file for p in on.patches] == ["0001-change-1.diff", "0002-change-2.diff"]
    assert {t.path for t in on.targets} == {"fakeengine/kernel.py", "fakeengine/config.py"}
    assert on.options_on == ("gate",)
    from t4patch.errors import UsageError

    with pytest.raises(UsageError, match="expected an optional diff name \\(gate\\), found nope"):
        ps.with_options(["nope"])


@pytest.mark.parametrize(
    "changes_edit, complaint",
    [
        (("title = \"change 1\"", "title = \"change 1\"\noptional = \"first\""), "numbered after every default diff"),
        (("title = \"change 2\"", "title = \"change 2\"\noptional = \"Bad Name\""), "patch[2].optional: expected a lowercase name"),
    ],
)
def test_optional_diff_rules(tmp_path, changes_edit, complaint):
    directory = make_patch_set(tmp_path, changes=[
        ("fakeengine/kernel.py", KERNEL, KERNEL_PATCHED),
        ("fakeengine/config.py", CONFIG, CONFIG_PATCHED),
        ("fakeengine/other.py", "a = 1\n", "a = 2\n"),
    ])
    edit_manifest(directory, *changes_edit)
    with pytest.raises(PatchSetError, match=re.escape(complaint)):
        load_patch_set(directory)


def test_optional_diff_must_own_its_files(tmp_path):
    directory = make_patch_set(tmp_path, changes=[
        ("fakeengine/config.py", CONFIG, CONFIG.replace("80", "75")),
        ("fakeengine/config.py", CONFIG.replace("80", "75"), CONFIG_PATCHED.replace("80", "75") + "X = 1\n"),
    ])
    # the synthetic helper pins each change separately; one target per file is what the loader wants
    text = (directory / "manifest.toml").read_text()
    head, _, _ = text.partition("\n[[target]]")
    final = CONFIG_PATCHED.replace("80", "75") + "X = 1\n"
    (directory / "manifest.toml").write_text(
        head.replace('title = "change 2"', 'title = "change 2"\noptional = "extra"')
        + f'\n[[target]]\npath = "fakeengine/config.py"\npristine_sha256 = "{sha(CONFIG.encode())}"\n'
        f'patched_sha256 = "{sha(final.encode())}"\n'
    )
    with pytest.raises(PatchSetError, match="must be the only diff of its files"):
        load_patch_set(directory)


def test_every_shipped_set_has_upstream_metadata_and_is_not_a_draft():
    for ps in all_patch_sets():
        assert not ps.draft, f"{ps.spec} is a draft: review it and remove `draft = true` before shipping"
        for patch in ps.all_patches:
            assert patch.upstream is not None, f"{ps.spec} {patch.file}: add [patch.upstream]"
