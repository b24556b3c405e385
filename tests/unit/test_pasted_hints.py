"""Advice that works when pasted: every suggested command starts with the t4patch the user ran (which need not
be on PATH), carries the user's --python / --site-packages, quoted for the shell, and running it through a
real shell does what the advice says (issue 23.3).

Two harnesses. :func:`pasted` (kept for the doctor test) cuts the suggested ``t4patch ...`` out of a line and
runs it with a ``t4patch`` shim on PATH. The stricter one, :class:`Shell`, is a fresh shell where t4patch is
NOT on PATH: t4patch is started as ``<python> -m t4patch`` or as a console script in a directory with a space
and shell characters in its name, off PATH; every hint it prints (errors' ``next:``, apply's notes, status's
optional-diff lines) is cut into its commands (each starts with the program as printed), and each command is
run by ``sh -c`` from another directory, for ``--site-packages`` and ``--python`` targets. A hint part that
holds :data:`t4patch.environment.suggest.PYTHON_PLACEHOLDER` is a documented manual step (fill in the serving
interpreter); the test fills it in and runs it too. No hint may install an engine with its dependencies.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import t4patch.commands.doctor as doctor
from t4patch.cli import COMMANDS
from t4patch.cuda.gpu import GpuReport
from t4patch.environment import suggest
from t4patch.environment.target import resolve_target
from t4patch.errors import TargetEnvironmentError
from tests.helpers import CONFIG, KERNEL, KERNEL_PATCHED, T4, make_dist, make_patch_set, record_hash

REPO = Path(__file__).resolve().parents[2]
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
    assert shlex.split(command) == [sys.executable, "-m", "pip", "install", "--upgrade", "--target",
                                    str(site.resolve()), "--no-deps", "vllm==0.33.0"]
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


def test_status_check_of_an_engine_that_is_not_installed_looks_there_never_installs(awkward_env, tmp_path, cli):
    site, patches = awkward_env
    empty = tmp_path / "empty site"
    empty.mkdir()
    result = cli("status", "fakeengine", "--check", "--site-packages", str(empty))
    assert result.code == 9
    hint = result.err.split("next: ", 1)[1].strip()
    assert "pip" not in hint  # t4patch installs no engine (its dependencies would come with it)
    look, retarget, install = hint.split("; ")
    assert shlex.split(look.split(": ", 1)[1]) == ["t4patch", "status", "--site-packages", str(empty.resolve())]
    assert retarget.endswith(f"t4patch status fakeengine --check --python {suggest.PYTHON_PLACEHOLDER}")
    assert shlex.split(install.rsplit(": ", 1)[1]) == ["t4patch", "apply", "fakeengine==1.2.0", "--site-packages",
                                                      str(empty.resolve())]


def _wheel_of(site: Path, out: Path) -> Path:
    """A wheel of a make_dist() site whose RECORD hashes every member but itself, as every released wheel's does
    (the wheel reader refuses a member RECORD lists without a sha256)."""
    files = {path.relative_to(site).as_posix(): path.read_bytes() for path in sorted(site.rglob("*"))
             if path.is_file() and path.name != "RECORD"}
    (record_name,) = [p.relative_to(site).as_posix() for p in site.rglob("RECORD")]
    rows = [f"{name},{record_hash(data)},{len(data)}" for name, data in files.items()] + [f"{record_name},,"]
    with zipfile.ZipFile(out, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr(record_name, "\n".join(rows) + "\n")
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
    assert shlex.split(command) == [sys.executable, "-m", "pip", "install", "--upgrade", "--target",
                                    str(site.resolve()), "--no-deps", "companionlib==2.0.0"]
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


def test_apply_where_the_engine_is_not_installed_looks_there_never_installs(awkward_env, tmp_path, cli):
    empty = tmp_path / "empty site"
    empty.mkdir()
    result = cli("apply", "fakeengine", "--site-packages", str(empty))
    assert result.code == 4
    hint = result.err.split("next: ", 1)[1].strip()
    assert "pip" not in hint
    look, retarget, install = hint.split("; ")
    assert shlex.split(look.split(": ", 1)[1]) == ["t4patch", "status", "--site-packages", str(empty.resolve())]
    assert retarget.endswith(f"t4patch apply fakeengine==1.2.0 --python {suggest.PYTHON_PLACEHOLDER}")
    assert "install fakeengine==1.2.0 as its docs say" in install


def test_revert_of_an_engine_that_is_not_there_never_suggests_installing_it(tmp_path, cli, monkeypatch):
    """`revert vllm` on an SGLang directory, or with --python forgotten: nothing to revert, and no
    `pip install vllm==0.33.0` (79 requirements and another torch) into the target or t4patch's own venv."""
    monkeypatch.delenv("T4PATCH_PATCHES", raising=False)
    site = make_dist(tmp_path / AWKWARD, name="sglang", version="0.5.23", files={"sglang/__init__.py": ""})
    for target in (["--site-packages", str(site)], []):
        result = cli("revert", "vllm", *target)
        assert result.code == 4, result.err
        assert "nothing to revert there" in result.err and "pip" not in result.err
        hint = result.err.split("next: ", 1)[1].strip()
        assert hint.endswith(f"t4patch revert vllm --python {suggest.PYTHON_PLACEHOLDER}")


# ------------------------------------------------------------------ a fresh shell where t4patch is not on PATH

EXTRA, EXTRA_PATCHED, OPTION = "WINDOW = 4096\n", "WINDOW = 1024\n", "small-window"
ENGINE_LIBS = ("fakeengine", "vllm", "sglang")  # names no hint may `pip install` without --no-deps


class Shell:
    """t4patch started as the user starts it, off PATH, and a fresh ``sh`` to paste its hints into."""

    def __init__(self, tmp_path: Path, patches: Path, mode: str) -> None:
        self.home = tmp_path / "home"
        self.home.mkdir(exist_ok=True)
        bindir = tmp_path / "t4patch venv $bin"  # a space and a shell expansion in the directory name
        bindir.mkdir(exist_ok=True)
        if mode == "module":
            self.argv = [sys.executable, "-m", "t4patch"]
        else:
            script = bindir / "t4patch"
            script.write_text(f"#!{sys.executable}\nimport sys\nfrom t4patch.cli import main\n"
                              "sys.exit(main())\n")
            script.chmod(0o755)
            self.argv = [str(script)]
        self.elsewhere = tmp_path / "elsewhere"
        self.elsewhere.mkdir(exist_ok=True)
        path = os.pathsep.join(d for d in ("/usr/bin", "/bin") if os.path.isdir(d))
        assert shutil.which("t4patch", path=path) is None, "the fresh shell's PATH must not hold a t4patch"
        self.env = {"PATH": path, "HOME": str(self.home), "PYTHONPATH": str(REPO), "T4PATCH_PATCHES": str(patches),
                    "LANG": "C.UTF-8", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        self.hints: list[str] = []

    def t4patch(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """Run t4patch as the user did (not through PATH)."""
        return subprocess.run([*self.argv, *argv], cwd=self.elsewhere, env=self.env, capture_output=True,
                              text=True, check=False)

    @property
    def program(self) -> str:
        """How the hints must start: the program as printed (quoted for the shell)."""
        return suggest.program_for(self.argv[-1] if len(self.argv) == 1 else str(REPO / "t4patch" / "__main__.py"),
                                   sys.executable)

    def commands(self, text: str) -> list[str]:
        """The commands in a hint: each ``; ``-separated part from the program to its end (a trailing
        parenthesised remark cut off); the program as printed must start every one."""
        self.hints.append(text)
        found = []
        for part in text.split("; "):
            if self.program in part:
                command = part[part.index(self.program):].split(" (", 1)[0].rstrip(".`) ")
                found.append(command)
        assert found, f"no command starting with {self.program!r} in {text!r}"
        assert not re.search(r"(?<![\w/~.-])t4patch (?:" + "|".join(COMMANDS) + ")", text.replace(self.program, "")), \
            f"a bare t4patch command in {text!r}"
        return found

    def paste(self, command: str, python: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
        """``sh -c COMMAND`` from another directory; a manual step's placeholder is filled in with ``python``."""
        if suggest.PYTHON_PLACEHOLDER in command:
            assert python is not None, f"{command!r} is a manual step: the test must fill in the interpreter"
            command = command.replace(suggest.PYTHON_PLACEHOLDER, shlex.quote(str(python)))
        return subprocess.run(["sh", "-c", command], cwd=self.elsewhere, env={**self.env, **env},
                              capture_output=True, text=True, check=False)

    def no_engine_install(self) -> None:
        """No hint seen installs an engine with its dependencies (a companion comes with --no-deps)."""
        for hint in self.hints:
            for part in re.split(r"; | && ", hint):
                if re.search(r"pip install", part):
                    words = shlex.split(part[part.index("pip install"):].split(" (", 1)[0])  # a remark after
                    named = [w for w in words if w.split("=")[0] in ENGINE_LIBS]
                    assert not named or "--no-deps" in words, f"{part!r} installs an engine with its dependencies"


def hint_of(proc: subprocess.CompletedProcess[str]) -> str:
    assert "next: " in proc.stderr, proc.stderr
    return proc.stderr.split("next: ", 1)[1].strip()


def venv_python(root: Path) -> Path:
    """A venv (no pip: nothing here installs into it) whose site-packages the test fills with make_dist."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    return root / "bin" / "python"


def site_of(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                         capture_output=True, text=True, check=True).stdout.strip()
    return Path(out)


@pytest.fixture(params=["module-site-packages", "script-site-packages", "script-python"])
def shell(request, tmp_path):
    """A fresh shell and an engine with an optional diff, targeted by --site-packages or --python."""
    mode, _, kind = request.param.partition("-")
    patches = tmp_path / "patches"
    directory = make_patch_set(patches, changes=[("fakeengine/kernel.py", KERNEL, KERNEL_PATCHED),
                                                 ("fakeengine/config.py", CONFIG, CONFIG.replace("80", "75")),
                                                 ("fakeengine/extra.py", EXTRA, EXTRA_PATCHED)])
    manifest = directory / "manifest.toml"
    manifest.write_text(manifest.read_text().replace('file = "0003-change-3.diff"',
                                                     f'file = "0003-change-3.diff"\noptional = "{OPTION}"'))
    files = {"fakeengine/__init__.py": "", "fakeengine/kernel.py": KERNEL, "fakeengine/config.py": CONFIG,
             "fakeengine/extra.py": EXTRA}
    sh = Shell(tmp_path, patches, mode)
    if kind == "python":
        python = venv_python(tmp_path / f"serve {AWKWARD}")
        site = make_dist(site_of(python), files=files)
        target = ["--python", str(python)]
    else:
        python = None
        site = make_dist(tmp_path / AWKWARD, files=files)
        target = ["--site-packages", str(site)]
    yield sh, target, site, python
    sh.no_engine_install()


def test_hints_start_with_the_program_the_user_ran(shell):
    sh, target, site, python = shell
    proc = sh.t4patch("status", "--check", *target)
    assert proc.returncode == 9
    (command,) = sh.commands(hint_of(proc))
    assert command.startswith(sh.program + " apply fakeengine==1.2.0 ")
    assert sh.paste(command).returncode == 0
    assert sh.t4patch("status", "--check", *target).returncode == 0


def test_optional_diff_lines_and_the_kept_note_keep_the_target(shell):
    sh, target, site, python = shell
    status = sh.t4patch("status", *target).stdout
    (line,) = [l for l in status.splitlines() if l.strip().startswith(f"optional {OPTION}: not-applied")]
    (turn_on,) = sh.commands(line)
    assert sh.paste(turn_on).returncode == 0
    assert (site / "fakeengine/extra.py").read_text() == EXTRA_PATCHED
    # a plain apply keeps the option and says which revert takes it back: that revert, pasted, works
    note = sh.t4patch("apply", "fakeengine", *target)
    assert note.returncode == 0, note.stderr
    (kept,) = [l for l in note.stdout.splitlines() if "left applied" in l]
    (revert,) = sh.commands(kept)
    status = sh.t4patch("status", *target).stdout
    (line,) = [l for l in status.splitlines() if l.strip().startswith(f"optional {OPTION}: applied")]
    assert sh.commands(line) == [revert]
    assert sh.paste(revert).returncode == 0
    assert (site / "fakeengine/extra.py").read_text() == EXTRA
    assert (site / "fakeengine/kernel.py").read_text() == KERNEL


def test_not_installed_hints_work_or_are_the_documented_manual_step(shell, tmp_path):
    sh, target, site, python = shell
    empty = tmp_path / "empty site"
    empty.mkdir()
    wrong = ["--site-packages", str(empty)]
    serving = python or venv_python(tmp_path / "serving venv")
    if python is None:  # the engine must be where the filled-in interpreter looks
        make_dist(site_of(serving), files={"fakeengine/__init__.py": "", "fakeengine/kernel.py": KERNEL,
                                           "fakeengine/config.py": CONFIG, "fakeengine/extra.py": EXTRA})
    for argv, code in ((["apply", "fakeengine"], 4), (["status", "fakeengine", "--check"], 9)):
        proc = sh.t4patch(*argv, *wrong)
        assert proc.returncode == code, proc.stderr
        look, retarget, apply = sh.commands(hint_of(proc))
        assert sh.paste(look).returncode == 0  # shows the empty directory, as the hint says
        assert suggest.PYTHON_PLACEHOLDER in retarget and suggest.PYTHON_PLACEHOLDER not in apply
        assert sh.paste(retarget, serving).returncode in (0, 9)  # ran against the serving environment
    assert sh.t4patch("status", "--check", "--python", str(serving)).returncode == 0  # the filled-in apply ran
    proc = sh.t4patch("revert", "fakeengine", *wrong)
    assert proc.returncode == 4 and "nothing to revert" in proc.stderr
    look, retarget = sh.commands(hint_of(proc))
    assert sh.paste(look).returncode == 0
    assert sh.paste(retarget, serving).returncode == 0
    assert (site_of(serving) / "fakeengine/kernel.py").read_text() == KERNEL


def _companion_wheel(directory: Path) -> Path:
    """A real (tiny) wheel of companionlib 2.0.0 for pip to find offline."""
    directory.mkdir(parents=True, exist_ok=True)
    wheel = directory / "companionlib-2.0.0-py3-none-any.whl"
    files = {"companionlib/__init__.py": "VERSION = '2.0.0'\n",
             "companionlib-2.0.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: companionlib\nVersion: 2.0.0\n",
             "companionlib-2.0.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                   "Tag: py3-none-any\n"}
    record = [f"{name},{record_hash(text.encode())},{len(text.encode())}" for name, text in files.items()]
    files["companionlib-2.0.0.dist-info/RECORD"] = "\n".join([*record, "companionlib-2.0.0.dist-info/RECORD,,"]) + "\n"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return directory


def test_missing_companion_hint_installs_the_companion_alone(tmp_path):
    """status --check on an applied set whose companion is missing: the hint, pasted (pip offline, from a local
    wheel), installs the companion without dependencies and the check passes."""
    patches = tmp_path / "patches"
    manifest = make_patch_set(patches) / "manifest.toml"
    manifest.write_text(manifest.read_text() + '\n[[requires]]\ndistribution = "companionlib"\nversion = "2.0.0"\n'
                        'why = "the patched kernel calls companionlib 2.0.0"\n')
    sh = Shell(tmp_path, patches, "script")
    site = make_dist(tmp_path / AWKWARD)
    target = ["--site-packages", str(site)]
    assert sh.t4patch("apply", "fakeengine", *target).returncode == 0
    proc = sh.t4patch("status", "--check", *target)
    assert proc.returncode == 9 and "needs companionlib==2.0.0 beside it" in proc.stderr
    hint = hint_of(proc)
    sh.hints.append(hint)
    assert "--no-deps companionlib==2.0.0" in hint
    pasted_ = sh.paste(hint, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(_companion_wheel(tmp_path / "wheels")))
    assert pasted_.returncode == 0, pasted_.stderr
    assert sh.t4patch("status", "--check", *target).returncode == 0
    sh.no_engine_install()


def test_program_for_names_the_program_as_run(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    script = tmp_path / "t4patch-venv" / "bin" / "t4patch"
    assert suggest.program_for(str(script), sys.executable) == "~/t4patch-venv/bin/t4patch"
    odd = tmp_path / "my venv" / "bin" / "t4patch"
    assert shlex.split(suggest.program_for(str(odd), sys.executable)) == [str(odd)]
    main = str(REPO / "t4patch" / "__main__.py")
    assert shlex.split(suggest.program_for(main, "/usr/bin/python3")) == ["/usr/bin/python3", "-m", "t4patch"]
    assert suggest.program_for("", sys.executable) == "t4patch"
    suggest.set_program("/opt/t4/bin/t4patch", COMMANDS)
    try:
        text = "run t4patch apply x (`t4patch revert x` undoes it); pip install t4patch; ~/t4patch-venv/bin/t4patch list"
        assert suggest.render(text) == ("run /opt/t4/bin/t4patch apply x (`/opt/t4/bin/t4patch revert x` undoes it); "
                                        "pip install t4patch; ~/t4patch-venv/bin/t4patch list")
        assert suggest.render(suggest.render(text)) == suggest.render(text)  # rendering twice changes nothing
    finally:
        suggest.reset_program()


def _tiny_wheel(directory: Path, name: str, version: str) -> None:
    """A real, minimal wheel of ``name==version`` for pip to find offline (a stand-in index)."""
    directory.mkdir(parents=True, exist_ok=True)
    dist = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": f"VERSION = {version!r}\n",
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = [f"{n},{record_hash(t.encode())},{len(t.encode())}" for n, t in files.items()]
    files[f"{dist}/RECORD"] = "\n".join([*record, f"{dist}/RECORD,,"]) + "\n"
    with zipfile.ZipFile(directory / f"{name}-{version}-py3-none-any.whl", "w") as zf:
        for n, t in files.items():
            zf.writestr(n, t)


def test_doctor_bang_lines_pasted_into_a_fresh_shell(tmp_path, cli, monkeypatch):
    """doctor's `!` lines for an SGLang target directory (vLLM missing, torch missing, SGLang's files not the
    release's): each ends with a command for that directory that runs in a fresh shell (pip offline from a
    stand-in index of tiny wheels), none installs an engine with its dependencies, and the vLLM line is gone
    once its command ran."""
    monkeypatch.delenv("T4PATCH_PATCHES", raising=False)
    monkeypatch.setattr(doctor, "detect", lambda: GpuReport((T4,), "580.1", "13.0", ("nvml",)))
    sh = Shell(tmp_path, tmp_path / "no-patches-dir", "script")
    sh.env.pop("T4PATCH_PATCHES")
    site = make_dist(tmp_path / AWKWARD, name="sglang", version="0.5.23", files={"sglang/__init__.py": ""})
    index = tmp_path / "index"
    for name, version in (("vllm", "0.33.0"), ("sglang", "0.5.23"), ("torch", "2.14.1")):
        _tiny_wheel(index, name, version)
    suggest.set_program(sh.program, COMMANDS)
    try:
        out = cli("doctor", "--site-packages", str(site)).out
    finally:
        suggest.reset_program()
    bangs = [line[2:] for line in out.splitlines() if line.startswith("! ")]
    assert any("vLLM is not installed beside SGLang" in b for b in bangs), out
    ran = 0
    for bang in bangs:
        sh.hints.append(bang)
        command = re.search(r"(\S+ -m pip install .*|" + re.escape(sh.program) + r" .*)$", bang)
        if command is None:  # advice for the serving command line (e.g. --dtype float16), not a shell command
            assert not re.search(r"\bpip install\b|\bt4patch (?:" + "|".join(COMMANDS) + r")\b", bang), bang
            continue
        text = command.group(1).split(" (", 1)[0]
        assert str(site.resolve()) in shlex.split(text), f"{bang!r} does not aim at the target"
        proc = sh.paste(text, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(index), PIP_NO_COMPILE="0")
        assert proc.returncode == 0, (bang, proc.stderr[-2000:])
        ran += 1
    assert ran >= 2
    sh.no_engine_install()
    again = cli("doctor", "--site-packages", str(site)).out
    assert not any("vLLM is not installed beside SGLang" in line for line in again.splitlines())


def test_partial_state_line_pasted_finishes_the_set(shell):
    sh, target, site, python = shell
    assert sh.t4patch("apply", "fakeengine", *target).returncode == 0
    (site / "fakeengine/config.py").write_text(CONFIG)  # one file back to its released bytes, by hand
    status = sh.t4patch("status", *target).stdout
    (line,) = [l for l in status.splitlines() if l.startswith("fakeengine 1.2.0: partial")]
    (finish,) = sh.commands(line)
    assert sh.paste(finish).returncode == 0
    assert sh.t4patch("status", "--check", *target).returncode == 0


def test_a_spec_that_does_not_match_the_install_names_a_list_that_runs(shell):
    sh, target, site, python = shell
    proc = sh.t4patch("apply", "fakeengine==9.9", *target)
    assert proc.returncode == 5, proc.stderr
    (listing,) = sh.commands(hint_of(proc))
    assert listing == f"{sh.program} list"
    ran = sh.paste(listing)
    assert ran.returncode == 0 and "fakeengine==1.2.0" in ran.stdout
