"""The built t4patch wheel carries all of its data and the whole package, nothing that is checkout-only, and works.

One wheel is built from the checkout (``python -m build --wheel``, hatchling from PyPI) and installed with its
dependencies into a fresh venv; every check reads that wheel or runs that venv from a directory outside the
checkout, so nothing can fall back to the repository's own data trees (``patches/``, ``recipes/``, ``hardware/``,
``engine-data/``, ``cases/``) or code. The point (issue 20): no file that a checkout imports is one an install
cannot import, and the maintainer tools (``tools/``, beside the package) do not ship.
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
from packaging.requirements import Requirement

from t4patch.builder.recipe import recipe_names
from t4patch.data.locations import DATA_KINDS
from tests.helpers import progress, run_with_progress

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
DATA_TREES = DATA_KINDS  # repository root -> t4patch/_data/<tree> in the wheel
# What a module of the package may lack in an install without extras: the optional dependencies' import names
# (torch, triton, numpy, regex: `pip install t4patch[verify]`), which the heavy modules import at the top.
OPTIONAL_IMPORTS = sorted(
    {Requirement(r).name.replace("-", "_") for extra in PYPROJECT["project"]["optional-dependencies"].values() for r in extra}
)


def checkout_modules() -> list[str]:
    """Every module of the checkout's t4patch package, dotted (``t4patch.cli``, ``t4patch.data``, ...)."""
    names = []
    for path in sorted((REPO / "t4patch").rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        parts = path.relative_to(REPO).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


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
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(REPO)], "building the t4patch wheel (python -m build --wheel)"
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


def test_every_data_tree_is_force_included_at_the_same_path() -> None:
    force = PYPROJECT["tool"]["hatch"]["build"]["targets"]["wheel"]["force-include"]
    assert force == {tree: f"t4patch/_data/{tree}" for tree in DATA_TREES}, force
    for tree in DATA_TREES:
        assert (REPO / tree).is_dir(), f"data tree {tree}/ is missing from the checkout"


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


def test_wheel_ships_the_whole_package_and_nothing_checkout_only(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as zf:
        names = [n for n in zf.namelist() if not n.endswith("/")]
    top = sorted({n.split("/", 1)[0] for n in names})
    assert len(top) == 2 and top[0] == "t4patch" and top[1].endswith(".dist-info"), top  # no tools/, no tests/
    assert list((REPO / "tools").rglob("*.py")), "tools/ has no modules: the check below would be vacuous"
    shipped = {n for n in names if n.startswith("t4patch/") and n.endswith(".py") and not n.startswith("t4patch/_data/")}
    modules = {
        p.relative_to(REPO).as_posix() for p in (REPO / "t4patch").rglob("*.py") if "__pycache__" not in p.parts
    }
    assert sorted(modules - shipped) == [], "modules of the checkout missing from the wheel"
    assert sorted(shipped - modules) == [], "modules in the wheel that the checkout does not have"


# Runs in the installed venv: import each module named on stdin and say what happened, as JSON.
_IMPORT_EACH = """
import importlib, importlib.util, json, sys
result = {}
for name in json.load(sys.stdin):
    try:
        spec = importlib.util.find_spec(name)
        if spec is None:
            result[name] = ["not found", ""]
        elif name.endswith(".__main__"):
            result[name] = ["found", spec.origin]  # executing it would run the CLI
        else:
            module = importlib.import_module(name)
            result[name] = ["imported", getattr(module, "__file__", "")]
    except ModuleNotFoundError as exc:
        result[name] = ["missing", exc.name or ""]
    except BaseException as exc:
        result[name] = ["error", f"{type(exc).__name__}: {exc}"]
print(json.dumps(result))
"""


def test_every_module_of_the_checkout_imports_from_the_install(installed: Installed) -> None:
    """Each module of the checkout's package imports in the install (from the install, not the checkout); the only
    allowed failure is a missing optional dependency (an extra the venv did not install)."""
    modules = checkout_modules()
    assert "t4patch.cli" in modules and len(modules) > 50, modules
    proc = subprocess.run(
        [str(installed.python), "-c", _IMPORT_EACH], input=json.dumps(modules), capture_output=True, text=True,
        cwd=installed.workdir, env=installed.env, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    site = installed.python.parent.parent
    bad = []
    for name in modules:
        how, detail = result[name]
        if how in ("imported", "found"):
            if not Path(detail).is_relative_to(site) or Path(detail).is_relative_to(REPO):
                bad.append(f"{name}: loaded from {detail}, not from the install")
        elif how == "missing" and detail.split(".")[0] in OPTIONAL_IMPORTS:
            continue  # needs an extra (t4patch[verify]); the module itself shipped (checked above)
        else:
            bad.append(f"{name}: {how} {detail}")
    assert bad == [], "modules a checkout imports and the install cannot:\n" + "\n".join(bad)
    imported = [n for n in modules if result[n][0] == "imported"]
    assert "t4patch.cli" in imported and len(imported) > len(modules) // 2, "most modules must import without extras"


def test_the_tools_do_not_import_from_the_install(installed: Installed) -> None:
    proc = installed.run(installed.python, "-c", "import tools.bench")
    assert proc.returncode != 0 and "No module named 'tools'" in proc.stderr, proc.stdout + proc.stderr


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
    recipes_on_disk = sorted(recipe_names())  # what the checkout's own reader finds in recipes/
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
