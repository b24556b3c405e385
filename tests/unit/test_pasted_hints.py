"""Advice that works when pasted: every suggested command carries the user's --python / --site-packages,
quoted for the shell, and running it (through a real shell) does what the advice says.

The harness :func:`pasted` takes the text a user sees (an advice line, an error's ``next:`` hint), cuts out
the suggested ``t4patch ...`` command exactly as printed, and runs it with ``sh -c`` from another working
directory, so an unquoted path or a dropped targeting option fails here the way it would for the user.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import t4patch.commands.doctor as doctor
from t4patch.cuda.gpu import GpuReport
from t4patch.environment import suggest
from t4patch.environment.target import resolve_target
from t4patch.errors import TargetEnvironmentError
from tests.helpers import T4, make_dist, make_patch_set

AWKWARD = "site dir 'quoted' $HOME"  # a space, quotes and a shell expansion: all must survive a paste


def pasted(text: str, tmp_path: Path, patches: Path) -> subprocess.CompletedProcess[str]:
    """Run the suggested command of ``text`` through ``sh -c`` as pasted, from an unrelated directory."""
    command = text[text.index("t4patch "):].split(" (")[0].rstrip(";. ")
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    shim = bindir / "t4patch"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m t4patch "$@"\n')
    shim.chmod(0o755)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}", T4PATCH_PATCHES=str(patches))
    return subprocess.run(["sh", "-c", command], cwd=elsewhere, env=env, capture_output=True, text=True, check=False)


@pytest.fixture
def awkward_env(tmp_path, monkeypatch):
    site = make_dist(tmp_path / AWKWARD)
    patches = tmp_path / "patches"
    make_patch_set(patches)
    monkeypatch.setenv("T4PATCH_PATCHES", str(patches))
    return site, patches


def test_command_carries_the_targeting_options_quoted(tmp_path):
    site = tmp_path / AWKWARD
    site.mkdir()
    target = resolve_target(None, str(site))
    text = suggest.command(target, "apply", "fakeengine==1.2.0")
    assert shlex.split(text) == ["t4patch", "apply", "fakeengine==1.2.0", "--site-packages", str(site.resolve())]
    assert suggest.command(resolve_target(), "status") == "t4patch status"  # this interpreter: nothing to add
    python = tmp_path / "py thon"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    assert shlex.split(suggest.command(resolve_target(str(python)), "status"))[-2:] == ["--python", str(python)]


def test_doctor_advice_pasted_applies_to_the_same_environment(awkward_env, tmp_path, cli, monkeypatch):
    site, patches = awkward_env
    monkeypatch.setattr(doctor, "detect", lambda: GpuReport((T4,), "580.1", "13.0", ("nvml",)))
    doc = json.loads(cli("doctor", "--json", "--site-packages", str(site)).out)
    advice = next(note for note in doc["advice"] if "is not patched" in note)
    assert "--site-packages" in advice
    proc = pasted(advice, tmp_path, patches)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(cli("doctor", "--json", "--site-packages", str(site)).out)
    assert [row["state"] for row in doc["engines"]] == ["applied"]


def test_the_harness_fails_a_hint_that_drops_the_target(awkward_env, tmp_path):
    """The harness must be able to fail: the old, untargeted hint applies to the default environment."""
    site, patches = awkward_env
    proc = pasted("fakeengine 1.2.0 is not patched: t4patch apply fakeengine==1.2.0", tmp_path, patches)
    assert proc.returncode == 4  # not installed where the pasted command looks


def test_python_that_is_not_python_is_named_without_the_probe(tmp_path):
    with pytest.raises(TargetEnvironmentError) as info:
        resolve_target("/bin/ls")
    message = str(info.value)
    assert "not a Python interpreter" in message or "found a program that is not one" in message
    assert "sysconfig" not in message and "json.dumps" not in message


def test_site_packages_at_a_venv_root_says_which_directory_to_use(tmp_path):
    root = tmp_path / "venv"
    inner = root / "lib" / "python3.11" / "site-packages"
    inner.mkdir(parents=True)
    (root / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (root / "bin").mkdir()
    (root / "bin" / "python").write_text("")
    with pytest.raises(TargetEnvironmentError) as info:
        resolve_target(None, str(root))
    assert info.value.exit_code == 3
    assert str(inner) in info.value.message and f"--site-packages {inner}" in (info.value.hint or "")
    assert f"--python {root / 'bin' / 'python'}" in (info.value.hint or "")
    assert resolve_target(None, str(inner)).search_path == (inner.resolve(),)  # the real one still works


def test_companion_problems_name_the_install_command_for_the_layout(tmp_path):
    from t4patch.engines.requirements import companion_problems
    from t4patch.patching.registry import find_patch_set

    patch_set = find_patch_set("sglang", "0.5.23")  # the shipped set requires vllm==0.33.0 ([[requires]])
    site = tmp_path / AWKWARD
    make_dist(site, name="sglang", version="0.5.23", files={"sglang/__init__.py": ""})
    [problem] = companion_problems(patch_set, resolve_target(None, str(site)))
    assert "needs vllm==0.33.0 beside it" in problem and "not installed" in problem
    command = problem.rsplit(": ", 1)[1]
    assert shlex.split(command) == ["pip", "install", "--upgrade", "--target", str(site.resolve()), "--no-deps",
                                    "vllm==0.33.0"]
    make_dist(site, name="vllm", version="0.32.0", files={"vllm/__init__.py": ""})
    target = resolve_target(None, str(site))
    assert "vllm 0.32.0 is installed" in companion_problems(patch_set, target)[0]


def test_status_check_hint_pasted_applies_to_the_same_environment(awkward_env, tmp_path, cli):
    site, patches = awkward_env
    result = cli("status", "--check", "--site-packages", str(site))
    assert result.code == 9 and "next: t4patch apply" in result.err
    proc = pasted(result.err.split("next: ", 1)[1].strip(), tmp_path, patches)
    assert proc.returncode == 0, proc.stderr
    assert cli("status", "--check", "--site-packages", str(site)).code == 0


def test_status_check_of_an_engine_that_is_not_installed_suggests_commands(awkward_env, tmp_path, cli):
    site, patches = awkward_env
    empty = tmp_path / "empty site"
    empty.mkdir()
    result = cli("status", "fakeengine", "--check", "--site-packages", str(empty))
    assert result.code == 9
    hint = result.err.split("next: ", 1)[1].strip()
    assert "not installed in" not in hint  # a command, not a description
    first, _, second = hint.partition(" && ")
    assert shlex.split(first)[:5] == ["pip", "install", "--upgrade", "--target", str(empty.resolve())]
    assert shlex.split(first)[-1] == "fakeengine==1.2.0"
    assert shlex.split(second) == ["t4patch", "apply", "fakeengine==1.2.0", "--site-packages", str(empty.resolve())]


def _wheel_of(site: Path, out: Path) -> Path:
    import zipfile

    with zipfile.ZipFile(out, "w") as zf:
        for path in sorted(site.rglob("*")):
            if path.is_file():
                zf.write(path, path.relative_to(site).as_posix())
    return out


def test_validate_wheel_without_a_directory_picks_the_matching_set(awkward_env, tmp_path, cli):
    site, patches = awkward_env
    make_patch_set(patches, name="otherengine", version="2.0.0")
    wheel = _wheel_of(site, tmp_path / "fakeengine-1.2.0-py3-none-any.whl")
    result = cli("validate", "--wheel", str(wheel))
    assert result.code == 0, result.err
    assert "fakeengine==1.2.0: valid" in result.out and "otherengine" not in result.out
    other = _wheel_of(site, tmp_path / "fakeengine-9.9.9-py3-none-any.whl")
    refused = cli("validate", "--wheel", str(other))
    assert refused.code == 5 and "fakeengine 9.9.9" in refused.err and "1.2.0" in refused.err


def test_apply_warns_when_the_patch_sets_companion_is_missing(tmp_path, cli, monkeypatch):
    """A set whose [[requires]] companion is absent applies, and says what to install, for that layout."""
    site = make_dist(tmp_path / AWKWARD)
    patches = tmp_path / "patches"
    directory = make_patch_set(patches)
    manifest = directory / "manifest.toml"
    manifest.write_text(manifest.read_text() + '\n[[requires]]\ndistribution = "companionlib"\nversion = "2.0.0"\n'
                        'why = "the patched kernel calls companionlib 2.0.0\'s compiled ops"\n')
    monkeypatch.setenv("T4PATCH_PATCHES", str(patches))
    result = cli("apply", "fakeengine", "--site-packages", str(site))
    assert result.code == 0, result.err
    [line] = [l for l in result.err.splitlines() if l.startswith("warning: ")]
    assert "fakeengine==1.2.0 needs companionlib==2.0.0 beside it but it is not installed" in line
    command = line.rsplit(": ", 1)[1]
    assert shlex.split(command) == ["pip", "install", "--upgrade", "--target", str(site.resolve()), "--no-deps",
                                    "companionlib==2.0.0"]
    doc = json.loads(cli("apply", "fakeengine", "--site-packages", str(site), "--json").out)
    assert len(doc["warnings"]) == 1  # already applied: still warned, the companion is still missing


def test_unsupported_release_advice_is_the_full_install_or_a_port(awkward_env, tmp_path, cli):
    site, patches = awkward_env
    other = make_dist(tmp_path / "other site", version="1.3.0")
    result = cli("apply", "fakeengine", "--site-packages", str(other))
    assert result.code == 5
    hint = result.err.split("next: ", 1)[1]
    assert "pip install fakeengine==1.2.0" in hint and "--no-deps fakeengine" not in hint
    assert "t4patch port fakeengine==1.3.0 --from fakeengine==1.2.0" in hint


def test_apply_where_the_engine_is_not_installed_suggests_the_commands(awkward_env, tmp_path, cli):
    empty = tmp_path / "empty site"
    empty.mkdir()
    result = cli("apply", "fakeengine", "--site-packages", str(empty))
    assert result.code == 4
    hint = result.err.split("next: ", 1)[1]
    install, _, rest = hint.partition(" && ")
    assert shlex.split(install) == ["pip", "install", "--upgrade", "--target", str(empty.resolve()), "fakeengine==1.2.0"]
    apply_command = rest.split(", or ")[0]
    assert shlex.split(apply_command) == ["t4patch", "apply", "fakeengine==1.2.0", "--site-packages", str(empty.resolve())]
