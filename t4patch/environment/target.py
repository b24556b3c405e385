"""The environment t4patch reads or changes: which site-packages, which installed distributions.

t4patch often runs from its own venv while the engine lives in the serving venv, so the target is named
explicitly: ``--python EXE`` asks that interpreter for its ``sys.path`` (one subprocess through
:mod:`t4patch.environment.interpreter`, nothing imported there), ``--site-packages DIR`` names a directory (e.g. a ``pip install --target`` tree), and by default the
running interpreter's own ``sys.path`` is used. Distributions are found from their ``.dist-info`` metadata,
never by importing them, so this works for engines whose import would need a GPU or take seconds.
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass, field
from importlib.metadata import Distribution, PathDistribution
from pathlib import Path

from packaging.utils import canonicalize_name

from t4patch.environment.interpreter import probe_json
from t4patch.errors import TargetEnvironmentError, UsageError
from t4patch.fileio.wheeltools import parse_record

_PROBE = (
    "import json, sys, sysconfig; "
    "print(json.dumps({'sys_path': sys.path, 'purelib': sysconfig.get_path('purelib'), "
    "'platlib': sysconfig.get_path('platlib'), 'version': sys.version.split()[0], "
    "'executable': sys.executable}))"
)


@dataclass(frozen=True)
class InstalledDistribution:
    """One installed distribution, described only from its metadata directory."""

    name: str  # canonical (PEP 503) name
    version: str
    root: Path  # the directory its RECORD paths are relative to (a site-packages dir)
    dist_info: Path
    pip: str = "pip"  # how to run pip install for *this* environment (see TargetEnvironment.pip_install)

    def reinstall_command(self, version: str | None = None) -> str:
        """The exact command that puts the released files of this distribution back, in its own environment."""
        return f"{self.pip} --force-reinstall --no-deps {self.name}=={version or self.version}"

    def record(self) -> dict[str, str | None]:
        """Map each RECORD path to its sha256 in hex (None where RECORD has no hash, e.g. RECORD itself)."""
        return parse_record((self.dist_info / "RECORD").read_text(encoding="utf-8"))


@dataclass(frozen=True)
class TargetEnvironment:
    """Where to look for (and change) installed engines."""

    search_path: tuple[Path, ...]
    description: str
    python: str | None = None
    python_version: str | None = None
    # the targeting options that name this environment on a command line (empty: the running interpreter), so
    # every suggested command can carry them (see t4patch.environment.suggest)
    options: tuple[str, ...] = ()
    _cache: dict[str, InstalledDistribution | None] = field(default_factory=dict, compare=False, repr=False)

    def find(self, name: str) -> InstalledDistribution | None:
        """The installed distribution called ``name`` (any spelling), or None; first match on the path wins."""
        key = canonicalize_name(name)
        if key not in self._cache:
            self._cache[key] = self._find_uncached(key)
        return self._cache[key]

    def _find_uncached(self, key: str) -> InstalledDistribution | None:
        for directory in self.search_path:
            if not directory.is_dir():
                continue
            for dist in Distribution.discover(name=key, path=[str(directory)]):
                if not isinstance(dist, PathDistribution):
                    continue
                dist_info = Path(str(dist._path))  # the only way to get the metadata dir
                if dist_info.suffix != ".dist-info":
                    continue
                version = dist.version
                if version is None:
                    continue
                return InstalledDistribution(key, version, dist_info.parent, dist_info, self.pip_install())
        return None

    def pip_install(self) -> str:
        """`pip install` aimed at this environment (shell-quoted): its interpreter's pip, or --target for a
        bare directory."""
        if self.python:
            return f"{shlex.quote(self.python)} -m pip install"
        # a bare directory has no pip of its own; a bare `pip` may not be on PATH (t4patch's venv is rarely
        # activated), so name the pip of the interpreter running t4patch when it has one
        pip = f"{shlex.quote(sys.executable)} -m pip" if sys.executable and _has_pip() else "pip"
        return f"{pip} install --upgrade --target {shlex.quote(str(self.search_path[0]))}"

    def to_json(self) -> dict[str, object]:
        return {
            "description": self.description,
            "python": self.python,
            "python_version": self.python_version,
            "search_path": [str(p) for p in self.search_path],
        }


def _has_pip() -> bool:
    import importlib.util

    return importlib.util.find_spec("pip") is not None


def resolve_target(python: str | None = None, site_packages: str | None = None) -> TargetEnvironment:
    """Build the target from the shared ``--python`` / ``--site-packages`` options."""
    for option, value in (("--python", python), ("--site-packages", site_packages)):
        if value is not None and not value.strip():
            raise UsageError(
                f"{option} {value!r}: expected a path, found an empty value (it would silently mean this "
                "interpreter's environment)",
                hint=f"pass the path, e.g. {option} /path/to/venv/" + ("bin/python" if option == "--python" else
                "lib/python3.11/site-packages"),
            )
    if python and site_packages:
        raise UsageError(
            "--python and --site-packages name the target twice",
            hint="pass only one of them",
        )
    if site_packages:
        path = Path(site_packages).expanduser().resolve()
        if not path.is_dir():
            raise TargetEnvironmentError(
                f"--site-packages {site_packages}: expected an existing directory, found "
                + ("a file" if path.exists() else "nothing"),
                hint="pass the site-packages directory of the serving environment "
                "(python -c 'import sysconfig; print(sysconfig.get_path(\"purelib\"))')",
            )
        _refuse_environment_root(path, site_packages)
        return TargetEnvironment((path,), f"site-packages {path}", options=("--site-packages", str(path)))
    if python:
        return _probe_interpreter(python)
    return TargetEnvironment(
        tuple(Path(p) for p in sys.path if p and Path(p).is_dir()),
        f"this interpreter ({sys.executable})",
        python=sys.executable,
        python_version=sys.version.split()[0],
    )


def _probe_interpreter(python: str) -> TargetEnvironment:
    exe = Path(python).expanduser()
    if not (exe.is_file() and os.access(exe, os.X_OK)):
        raise TargetEnvironmentError(
            f"--python {python}: expected an executable Python interpreter, found "
            + ("a non-executable file" if exe.exists() else "nothing"),
            hint="pass e.g. --python /path/to/venv/bin/python",
        )
    info = probe_json(str(exe), _PROBE)
    shape = {"sys_path": list, "purelib": str, "platlib": str, "version": str, "executable": str}
    if not (isinstance(info, dict) and all(isinstance(info.get(k), t) for k, t in shape.items())
            and all(isinstance(p, str) for p in info["sys_path"])):
        raise TargetEnvironmentError(
            f"--python {python}: expected a Python interpreter that reports {sorted(shape)}, found "
            f"{str(info)[:80]!r}",
            hint="pass a Python interpreter, e.g. --python /path/to/venv/bin/python",
        )
    paths: list[Path] = []
    for entry in [*info["sys_path"], info["purelib"], info["platlib"]]:
        if entry and Path(entry).is_dir() and Path(entry) not in paths:
            paths.append(Path(entry))
    return TargetEnvironment(
        tuple(paths),
        f"interpreter {info['executable']}",
        python=info["executable"],
        python_version=info["version"],
        options=("--python", os.path.abspath(exe)),
    )


def _site_packages_below(root: Path) -> list[Path]:
    """site-packages directories of a venv or installation prefix at ``root`` (POSIX and Windows layouts)."""
    found = sorted(root.glob("lib/python3*/site-packages")) + sorted(root.glob("lib64/python3*/site-packages"))
    found += [p for p in (root / "Lib" / "site-packages",) if p.is_dir()]
    unique: dict[Path, Path] = {}
    for p in found:
        if p.is_dir():
            unique.setdefault(p.resolve(), p)  # lib64 is often a link to lib
    return list(unique.values())


def _refuse_environment_root(path: Path, given: str) -> None:
    """A venv or prefix root holds no distributions itself: reporting "none installed" there would be wrong."""
    if any(path.glob("*.dist-info")):
        return
    below = _site_packages_below(path)
    if not below and not (path / "pyvenv.cfg").is_file():
        return
    python = next((p for p in (path / "bin" / "python", path / "Scripts" / "python.exe") if p.is_file()), None)
    options = [f"--site-packages {shlex.quote(str(p))}" for p in below[:1]]
    if python is not None:
        options.append(f"--python {shlex.quote(str(python))}")
    raise TargetEnvironmentError(
        f"--site-packages {given}: expected a site-packages directory, found the root of a Python environment "
        f"({'a venv' if (path / 'pyvenv.cfg').is_file() else 'an installation prefix'}); its packages are in "
        + (", ".join(str(p) for p in below) or "a site-packages directory below it"),
        hint="rerun with " + (" or ".join(options) or "--python DIR/bin/python"),
    )
