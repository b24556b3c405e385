"""The worker process of `verify attention`: imports the engine, compiles its launches, writes JSON.

It runs in a separate interpreter because it has to change process-wide state that must never leak into
t4patch itself or into the next engine: Triton's active driver, ``torch.cuda`` probes, ``CUDA_VISIBLE_DEVICES``,
and the engine's own imports. The interpreter is the target's (``--python``) or t4patch's own; it needs torch
and triton, and this module imports only the standard library until it is told what to do.

Protocol: ``argv[1]`` is a JSON request file (see :func:`t4patch.verify.attention.runner.build_request`); the
result goes to the request's ``result_path`` as JSON, never to stdout, which engine loggers write to.
Failures the user can act on (a missing module, the wrong Triton) come back as ``{"ok": false, "error":
{...}}`` with a kind the parent turns into the right T4PatchError; per-case failures are recorded per case.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import platform
import sys
import traceback
from pathlib import Path
from typing import Any


class _EngineRootFinder(importlib.abc.MetaPathFinder):
    """Resolves the engine's top-level packages from the target root only, whatever else is on sys.path."""

    def __init__(self, root: Path, packages: list[str]) -> None:
        self.root = root
        self.packages = set(packages)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname in self.packages:
            return importlib.machinery.PathFinder.find_spec(fullname, [str(self.root)])
        return None


def _error(kind: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"ok": False, "error": {"kind": kind, "message": message, **extra}}


def _top(name: str | None) -> str:
    return (name or "").split(".")[0]


def _sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _findable(name: str) -> bool:
    """Can ``name`` be imported here (found on the path, without importing it)?"""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _progress(request: dict[str, Any], line: str) -> None:
    """One line per step for the parent's terminal display (appended: the parent reads the last one)."""
    if request.get("progress_path"):
        with open(request["progress_path"], "a", encoding="utf-8") as stream:
            stream.write(line + "\n")


def _make_driver(request: dict[str, Any]) -> Any:
    """The engine's driver named by the case table, imported now from the "module:Class" the request carries
    (the parent read it from the engine table; this interpreter never reads the table)."""
    engine = request["engine"]
    module_name, _, class_name = str(engine.get("driver_class") or "").partition(":")
    if not module_name or not class_name:
        raise ValueError(
            f"the request names no driver class for {engine['driver']!r} (the case table was loaded without the "
            "engine table's drivers: load_cases(drivers=...))"
        )
    driver = getattr(importlib.import_module(module_name), class_name)
    return driver(Path(request["root"]), request["arch"], request["model"], engine["settings"])


def run_request(request: dict[str, Any]) -> dict[str, Any]:
    engine = request["engine"]
    root = Path(request["root"])
    packages = engine["packages"]
    # Never let the working directory shadow the engine or its dependencies.
    cwd = os.getcwd()
    sys.path[:] = [p for p in sys.path if p not in ("", ".", cwd)]
    for extra in request.get("extra_paths", []):
        if extra not in sys.path:
            sys.path.append(extra)
    sys.meta_path.insert(0, _EngineRootFinder(root, packages))

    versions: dict[str, Any] = {"python": platform.python_version(), "executable": sys.executable}
    # Every module the compile may need (the verify extra's) is looked for before anything is imported, so one
    # report names them all. torch and triton are needed always; the others only if the engine's import asks for
    # one of them (an engine may not need every module of the extra), and then they are named together.
    missing = [name for name in request.get("needs", ["torch", "triton"]) if not _findable(name)]
    if {"torch", "triton"} & set(missing):
        return _error("missing-dependency", f"cannot import {', '.join(missing)}", module=missing[0], modules=missing,
                      versions=versions)
    for name in ("torch", "triton"):
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            return _error("missing-dependency", f"cannot import {name}: {exc}", module=name, modules=[name],
                          versions=versions)
        versions[name] = getattr(module, "__version__", "unknown")
    # where the compiler came from: the parent asks the status model whether t4patch's Triton set is applied there
    versions["triton_root"] = str(Path(sys.modules["triton"].__file__ or "").resolve().parent.parent)
    versions["compiler_env"] = {k: os.environ.get(k) for k in request.get("compiler_env_names", [])}
    series = ".".join(str(versions["triton"]).split(".")[:2])
    if series != engine["triton_series"]:
        return _error(
            "triton-version",
            f"triton {versions['triton']} is installed; {engine['distribution']} {engine['version']} runs on "
            f"triton {engine['triton_series']}.x, and tile/shared-memory results belong to the compiler that "
            f"produced them",
            versions=versions,
        )

    from t4patch.verify.attention import triton_target

    recorder = triton_target.install(request["arch"]["capability"][0] * 10 + request["arch"]["capability"][1])
    driver = _make_driver(request)
    try:
        driver.load()
    except ModuleNotFoundError as exc:
        if _top(exc.name) in packages:
            return _error("engine-code", f"{engine['distribution']} has no module {exc.name}", versions=versions)
        return _error(
            "missing-dependency",
            f"importing {engine['distribution']} needs {exc.name}",
            module=_top(exc.name),
            modules=list(dict.fromkeys([*missing, _top(exc.name)])),
            versions=versions,
        )
    except Exception as exc:  # noqa: BLE001 - reported as a one-line finding, with the traceback for --debug
        return _error(
            "engine-code",
            f"loading {engine['distribution']}'s attention launcher failed: {type(exc).__name__}: {exc}",
            traceback=traceback.format_exc(),
            versions=versions,
        )

    results: list[dict[str, Any]] = []
    total = len(request["model"]["layers"]) * len(request["cases"])
    for layer in request["model"]["layers"]:
        for case in request["cases"]:
            _progress(request, f"{len(results)}/{total} cases (next: {layer['name']} {case['name']})")
            start = len(recorder.launches)
            entry: dict[str, Any] = {"layer": layer["name"], "case": case["name"], "path": None, "error": None}
            try:
                entry["path"] = driver.run_case(layer, case, recorder.launches)
            except Exception as exc:  # noqa: BLE001 - a case that cannot be compiled is a failed case, not a crash
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                entry["error"] = f"{type(exc).__name__}: {first}"[:500]
                entry["traceback"] = traceback.format_exc()
            entry["launches"] = [launch.to_json() for launch in recorder.launches[start:]]
            results.append(entry)
    _progress(request, f"{len(results)}/{total} cases")

    return {
        "ok": True,
        "versions": versions,
        "loader": driver.describe(),
        "files": {rel: _sha256(root / rel) for rel in engine["files"]},
        "results": results,
        "notes": list(recorder.resource_notes),
        "triton_cache_dir": os.environ.get("TRITON_CACHE_DIR"),
    }


def main(argv: list[str]) -> int:
    sys.dont_write_bytecode = True
    # vLLM keeps real Triton only when no driver is active *and* CUDA_VISIBLE_DEVICES is set but empty; it
    # also hides any real GPU, so nothing here can touch one.
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    request = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    if request.get("triton_cache_dir"):
        os.environ.setdefault("TRITON_CACHE_DIR", request["triton_cache_dir"])
    try:
        result = run_request(request)
    except Exception as exc:  # noqa: BLE001 - the parent reports it as an internal error with this traceback
        result = _error("internal", f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
    Path(request["result_path"]).write_text(json.dumps(result), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
