"""``status --check`` means what the docs say it means, on the real released wheels (issue 23.2).

The documented SGLang setup (docs/engines/sglang.md: SGLang, vLLM 0.33.0 beside it with --no-deps, the SGLang
set applied) must pass its documented ``status --check``; vLLM is there only as the companion SGLang's set
requires ([[requires]]), unpatched, and a bare check must not ask for vLLM's own set. With the companion missing,
at another release or without its compiled library, the same check must fail (exit 9) and say what to install,
without vLLM's dependencies. Naming vLLM (``status vllm --check``) still checks vLLM's own set. The trees are the
real wheels' files (python files plus, for vLLM, the one compiled library the patched SGLang loads, copied from
the wheel); the SGLang set is applied by t4patch itself.
"""

from __future__ import annotations

import json
import shlex
import shutil
import zipfile
from pathlib import Path

import pytest

from t4patch.patching.registry import find_patch_set
from tests.helpers import extracted_wheel, site_from_extracted, wheel_path

pytestmark = pytest.mark.integration

SGLANG = find_patch_set("sglang", "0.5.23")
(COMPANION,) = SGLANG.requires  # vllm==0.33.0 with vllm/_C_stable_libtorch.abi3.so
VLLM = find_patch_set("vllm", COMPANION.version)


def add_vllm(site: Path, version: str, *, library: bool = True) -> None:
    """vLLM ``version``'s released files into ``site`` (as ``pip install --no-deps --target`` would lay them)."""
    tree = extracted_wheel(wheel_path("vllm", version))
    for entry in tree.iterdir():
        if entry.name == ".complete":
            continue
        if entry.is_dir():
            shutil.copytree(entry, site / entry.name, copy_function=shutil.copy2)
        else:
            shutil.copy2(entry, site / entry.name)
    if library and COMPANION.library:
        with zipfile.ZipFile(wheel_path("vllm", version)) as zf:
            (site / COMPANION.library).write_bytes(zf.read(COMPANION.library))


@pytest.fixture(scope="module")
def sglang_tree() -> Path:
    return extracted_wheel(wheel_path("sglang", SGLANG.version))


def sglang_site(tree: Path, site: Path) -> Path:
    return site_from_extracted(tree, site, [t.path for t in SGLANG.targets + SGLANG.optional_targets])


@pytest.fixture
def documented(sglang_tree, tmp_path, cli, monkeypatch) -> Path:
    """docs/engines/sglang.md's setup: SGLang, vLLM 0.33.0 beside it (--no-deps), the SGLang set applied."""
    monkeypatch.delenv("T4PATCH_PATCHES", raising=False)
    site = sglang_site(sglang_tree, tmp_path / "site")
    add_vllm(site, COMPANION.version)
    result = cli("apply", SGLANG.spec, "--site-packages", str(site))
    assert result.code == 0, result.err
    assert "warning" not in result.err  # the companion is there: apply has nothing to warn about
    return site


def test_the_documented_setup_passes_its_documented_check(documented, cli) -> None:
    result = cli("status", "--check", "--site-packages", str(documented))
    assert result.code == 0, result.err
    assert f"installed as the companion of {SGLANG.spec}" in result.out
    doc = json.loads(cli("status", "--json", "--site-packages", str(documented)).out)
    assert {e["engine"]: e["state"] for e in doc["engines"]} == {"sglang": "applied", "vllm": "not-applied"}
    assert cli("status", "sglang", "--check", "--site-packages", str(documented)).code == 0


def test_naming_the_companion_still_checks_its_own_set(documented, cli) -> None:
    result = cli("status", "vllm", "--check", "--site-packages", str(documented))
    assert result.code == 9 and "vllm (not-applied)" in result.err
    assert f"next: t4patch apply {VLLM.spec} --site-packages" in result.err


def test_a_patched_companion_is_checked_too(documented, cli) -> None:
    assert cli("apply", VLLM.spec, "--site-packages", str(documented)).code == 0
    assert cli("status", "--check", "--site-packages", str(documented)).code == 0
    # half of it taken back by hand: no longer "installed only as a companion", so a bare check fails
    first = documented / VLLM.targets[0].path
    tree = extracted_wheel(wheel_path("vllm", VLLM.version))
    first.unlink()
    shutil.copy2(tree / VLLM.targets[0].path, first)
    result = cli("status", "--check", "--site-packages", str(documented))
    assert result.code == 9 and "vllm (partial)" in result.err


def _hint(err: str) -> str:
    return err.split("next: ", 1)[1].strip()


def test_missing_companion_fails_the_check(sglang_tree, tmp_path, cli, monkeypatch) -> None:
    monkeypatch.delenv("T4PATCH_PATCHES", raising=False)
    site = sglang_site(sglang_tree, tmp_path / "site")
    applied = cli("apply", SGLANG.spec, "--site-packages", str(site))
    assert applied.code == 0 and f"needs {COMPANION.spec} beside it" in applied.err
    result = cli("status", "--check", "--site-packages", str(site))
    assert result.code == 9, result.out
    assert f"sglang (needs {COMPANION.spec} beside it but it is not installed in" in result.err
    command = shlex.split(_hint(result.err))
    assert command[-2:] == ["--no-deps", COMPANION.spec]  # the companion alone, never vLLM's 79 requirements
    assert command[command.index("--target") + 1] == str(site.resolve())
    assert cli("status", "sglang", "--check", "--site-packages", str(site)).code == 9


def test_companion_at_another_release_fails_the_check(sglang_tree, tmp_path, cli, monkeypatch) -> None:
    monkeypatch.delenv("T4PATCH_PATCHES", raising=False)
    site = sglang_site(sglang_tree, tmp_path / "site")
    add_vllm(site, "0.32.0")
    assert cli("apply", SGLANG.spec, "--site-packages", str(site)).code == 0
    result = cli("status", "--check", "--site-packages", str(site))
    assert result.code == 9
    assert f"needs {COMPANION.spec} beside it but vllm 0.32.0 is installed" in result.err
    # vLLM 0.32.0 is not SGLang's companion: it is an engine of its own here and is checked as one
    assert "vllm (not-applied)" in result.err
    assert shlex.split(_hint(result.err).split("; ")[0])[-2:] == ["--no-deps", COMPANION.spec]


def test_companion_without_its_compiled_library_fails_the_check(sglang_tree, tmp_path, cli, monkeypatch) -> None:
    monkeypatch.delenv("T4PATCH_PATCHES", raising=False)
    site = sglang_site(sglang_tree, tmp_path / "site")
    add_vllm(site, COMPANION.version, library=False)
    assert cli("apply", SGLANG.spec, "--site-packages", str(site)).code == 0
    result = cli("status", "--check", "--site-packages", str(site))
    assert result.code == 9 and f"{COMPANION.library} is missing" in result.err
    assert "--force-reinstall --no-deps vllm==0.33.0" in _hint(result.err)


def test_unpatched_sglang_beside_its_companion_fails_on_sglang_alone(sglang_tree, tmp_path, cli,
                                                                    monkeypatch) -> None:
    monkeypatch.delenv("T4PATCH_PATCHES", raising=False)
    site = sglang_site(sglang_tree, tmp_path / "site")
    add_vllm(site, COMPANION.version)
    result = cli("status", "--check", "--site-packages", str(site))
    assert result.code == 9
    assert "sglang (not-applied)" in result.err and "vllm (" not in result.err
    assert _hint(result.err) == f"t4patch apply {SGLANG.spec} --site-packages {shlex.quote(str(site.resolve()))}"
