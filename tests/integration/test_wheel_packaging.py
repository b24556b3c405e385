"""The built t4patch wheel carries all of its data and none of the checkout-only code, and works from there.

One wheel is built from the checkout (``pip wheel``, hatchling from PyPI) and installed with its dependencies into a
fresh venv; every check reads that wheel or runs that venv from a directory outside the checkout, so nothing can
fall back to the repository's own data trees (``patches/``, ``recipes/``, ``hardware/``, ``engine-data/``, ``cases/``).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import venv
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import progress, run_with_progress

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
DATA_TREES = ("patches", "recipes", "hardware", "engine-data", "cases")  # repository root -> t4patch/_data/<tree> in the wheel
NOT_SHIPPED = ("t4patch/engines/research", "t4patch/bench")  # pyproject's wheel exclude: run from a checkout only


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _checkout_files(root: Path) -> dict[str, str]:
    """Every file under ``root`` (relative path -> sha256), bytecode caches left out."""
    return {
        p.relative_to(root).as_posix(): _digest(p.read_bytes())
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }


@dataclass(frozen=True)
class Installed:
    wheel: Path
    python: Path
    script: Path
    workdir: Path  # outside the checkout
    env: dict[str, str]

    def run(self, *argv: str | Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(a) for a in argv], capture_output=True, text=True, cwd=self.workdir, env=self.env)

    def python_json(self, code: str) -> object:
        result = self.run(self.python, "-c", code)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    base = tmp_path_factory.mktemp("wheel")
    dist = base / "dist"
    run_with_progress(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "--disable-pip-version-check", "-w", str(dist),
         str(REPO)],
        "building the t4patch wheel",
    )
    (wheel,) = dist.glob("t4patch-*.whl")
    env_dir = base / "venv"
    progress(f"creating a venv in {env_dir}")
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    run_with_progress(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel)],
        f"installing {wheel.name} with its dependencies",
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("T4PATCH_") and k != "PYTHONPATH"}
    workdir = base / "work"
    workdir.mkdir()
    return Installed(wheel, python, env_dir / "bin" / "t4patch", workdir, env)


def test_wheel_ships_every_file_of_each_data_tree(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as zf:
        names = set(zf.namelist())
        for tree in DATA_TREES:
            expected = _checkout_files(REPO / tree)
            assert expected, f"{tree}/ is empty in the checkout"
            prefix = f"t4patch/_data/{tree}/"
            shipped = {n[len(prefix):]: _digest(zf.read(n)) for n in names if n.startswith(prefix) and not n.endswith("/")}
            assert sorted(set(expected) - set(shipped)) == [], f"{tree}/ files missing from the wheel"
            assert sorted(set(shipped) - set(expected)) == [], f"{tree}/ files in the wheel but not in the checkout"
            changed = sorted(rel for rel in expected if shipped[rel] != expected[rel])
            assert changed == [], f"{tree}/ files whose shipped bytes differ from the checkout"


def test_wheel_ships_the_package_without_research_and_bench(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as zf:
        names = zf.namelist()
    assert [n for n in names if n.startswith("tests/")] == [], "the test suite ships in the wheel"
    shipped = {n for n in names if n.startswith("t4patch/") and n.endswith(".py")}
    for excluded in NOT_SHIPPED:
        assert list((REPO / excluded).glob("*.py")), f"{excluded}/ has no modules: this check would be vacuous"
        assert sorted(n for n in shipped if n.startswith(excluded + "/")) == [], f"{excluded}/ ships in the wheel"
    modules = {
        p.relative_to(REPO).as_posix()
        for p in (REPO / "t4patch").rglob("*.py")
        if "__pycache__" not in p.parts and not p.relative_to(REPO).as_posix().startswith(NOT_SHIPPED)
    }
    assert sorted(modules - shipped) == [], "modules of the checkout missing from the wheel"
    assert sorted(shipped - modules) == [], "modules in the wheel that the checkout does not have"


def test_installed_wheel_finds_its_data_outside_the_checkout(installed: Installed) -> None:
    where = installed.python_json(
        "import json; from t4patch.data.locations import DATA_KINDS, data_dir; "
        "print(json.dumps({k: str(data_dir(k)) for k in DATA_KINDS}))"
    )
    assert isinstance(where, dict) and set(where) == set(DATA_TREES)
    for tree, location in where.items():
        path = Path(location)
        assert path.parts[-2:] == ("_data", tree), location
        assert not path.is_relative_to(REPO) and path.is_relative_to(installed.python.parent.parent), location


def test_installed_wheel_lists_and_validates_the_shipped_patch_sets(installed: Installed) -> None:
    on_disk = {f"{d.parent.name}=={d.name}" for d in (REPO / "patches").glob("*/*") if (d / "manifest.toml").is_file()}
    assert on_disk, "no patch sets in the checkout"
    listed = installed.run(installed.script, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    specs = {f"{p['distribution']}=={p['version']}" for p in json.loads(listed.stdout)["patch_sets"]}
    assert specs == on_disk
    validated = installed.run(installed.script, "validate")
    assert validated.returncode == 0, validated.stdout + validated.stderr
    for spec in on_disk:
        line = next((ln for ln in validated.stdout.splitlines() if ln.startswith(f"{spec}: ")), None)
        assert line is not None and "valid" in line and "/_data/patches/" in line, validated.stdout
    version = installed.run(installed.python, "-m", "t4patch", "--version")
    assert version.returncode == 0 and version.stdout.strip(), version.stderr


def test_installed_wheel_loads_build_recipes_and_the_gpu_table(installed: Installed) -> None:
    recipes_on_disk = sorted(p.stem for p in (REPO / "recipes").glob("*.toml"))
    assert recipes_on_disk
    loaded = installed.python_json(
        "import json; from t4patch.builder.recipe import load_recipe, recipe_names; "
        "print(json.dumps({n: [load_recipe(n).name, str(load_recipe(n).path)] for n in recipe_names()}))"
    )
    assert isinstance(loaded, dict) and sorted(loaded) == recipes_on_disk
    for name, (recipe_name, path) in loaded.items():
        assert recipe_name == name and "/_data/recipes/" in path and not Path(path).is_relative_to(REPO), path
    archs = installed.python_json(
        "import json; from t4patch.cuda.arch import load_archs; "
        "print(json.dumps({n: [a.major, a.minor, a.shared_limit] for n, a in load_archs().items()}))"
    )
    assert isinstance(archs, dict) and archs.get("sm_75") == [7, 5, 65536], archs
