"""Import single SGLang kernel modules from an installed tree without importing SGLang.

Why: ``import sglang`` cannot be done piecemeal. Its package ``__init__.py`` files pull the whole server stack
(transformers, the language frontend, zmq, fastapi, SGLang's runtime), which a verification environment
rarely has and which has nothing to do with the kernels under test. The verifiers (``verify attention``,
``verify marlin``) need only a few leaf modules, so they load the installed package as a *skeleton*:

- every ``sglang.*`` package is an empty module whose ``__path__`` is the real directory (its ``__init__.py``,
  which only fills registries and re-exports names, is skipped and recorded);
- every ``sglang.*`` module is the real installed file, found the way Python's own path finder finds it
  (through the parent's ``__path__``), so whatever the kernel code imports is real code;
- a module named in ``overrides`` is served as the given module object. Each caller owns its stand-ins and
  lists them in its report; this module defines none.

Packages are marked ``_t4patch_skeleton = True`` so a caller can tell a skeleton ``sglang`` in ``sys.modules``
from a real one.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import types
from pathlib import Path
from typing import Any


class _EmptyPackageLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # default module creation

    def exec_module(self, module: types.ModuleType) -> None:
        module.__dict__["_t4patch_skeleton"] = True


class _FixedModuleLoader(importlib.abc.Loader):
    def __init__(self, module: types.ModuleType) -> None:
        self.module = module

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return self.module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


class SkeletonFinder(importlib.abc.MetaPathFinder):
    """Serves ``sglang.*`` from ``root`` (a site-packages dir): packages empty, modules real, overrides fixed.

    Install it with ``sys.meta_path.insert(0, finder)``. ``real_modules`` lists the real files imported,
    ``skipped_inits`` the packages whose ``__init__.py`` was not executed (both in import order, may repeat).
    """

    def __init__(self, root: Path, overrides: dict[str, types.ModuleType]) -> None:
        self.root = root
        self.overrides = overrides
        self.real_modules: list[str] = []
        self.skipped_inits: list[str] = []

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "sglang" and not fullname.startswith("sglang."):
            return None
        if fullname in self.overrides:
            return importlib.machinery.ModuleSpec(fullname, _FixedModuleLoader(self.overrides[fullname]))
        search = [str(self.root)] if fullname == "sglang" else path
        spec = importlib.machinery.PathFinder.find_spec(fullname, search)
        if spec is None:
            return None
        if spec.submodule_search_locations is not None:
            package = importlib.machinery.ModuleSpec(fullname, _EmptyPackageLoader(), is_package=True)
            package.submodule_search_locations = list(spec.submodule_search_locations)
            if spec.origin is not None and Path(spec.origin).name.startswith("__init__."):
                self.skipped_inits.append(fullname)  # a namespace directory (origin None) has nothing to skip
            return package
        self.real_modules.append(fullname)
        return spec
