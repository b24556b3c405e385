"""vLLM's Marlin built for the Turing code path: which recipe, which library, which ops, loaded into torch.

The build itself is t4patch's builder's (``recipes/vllm-marlin-sm75/``, a torch-extension recipe: vLLM 0.33.0's
Marlin from its sdist as compute_75 PTX only, with a T4's host values; ``t4patch build vllm-marlin-sm75`` runs it
ahead of time). What is vLLM's here: the recipe's name, the op namespace and ops the provider calls, and loading
the library into torch under that namespace. Heavy imports (torch) happen only in :func:`load_ops`.

The provider calls :func:`marlin_library` (the cached build, or a build once) and :func:`load_ops`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from t4patch.errors import BuildError

RECIPE_NAME = "vllm-marlin-sm75"
REBUILD = f"t4patch build {RECIPE_NAME}"


@dataclass(frozen=True)
class MarlinLibrary:
    """The built library and what its build record says about it (``facts``: the record's extension part)."""

    path: Path
    cached: bool
    version: str  # the vLLM release whose source it is
    gencode: str
    namespace: str  # torch.ops.<namespace>
    ops: tuple[str, ...]
    facts: dict[str, Any]  # source_hash, cache_key, source, change, emulation, toolchain, library, fatbin, ...
    seconds: float | None  # the build's duration (of the build that made it, also for a cached one)
    jobs: int
    record_path: Path


def marlin_library(sdist: str | Path | None = None, *, jobs: int | None = None, force: bool = False) -> MarlinLibrary:
    """The compute_75-only Marlin library for this interpreter's torch: cached, or built now from the sdist.

    ``sdist``: the vLLM sdist archive or an unpacked tree (default: the recipe's environment variable, else the
    t4patch cache). Raises the builder's errors (MissingDependencyError without the sdist, ToolMissingError from
    the preflight, BuildError, VerificationError when the library is not PTX-only)."""
    from t4patch.builder.extension_build import ensure_built
    from t4patch.builder.recipe import load_recipe

    recipe = load_recipe(RECIPE_NAME)
    spec = recipe.extension
    if spec is None:
        raise BuildError(f"recipes/{RECIPE_NAME} is not a torch-extension recipe", hint="reinstall t4patch")
    built = ensure_built(recipe, source=Path(sdist) if sdist else None, jobs=jobs, force=force)
    facts = built.record.extension or {}
    return MarlinLibrary(built.library, built.cached, spec.version, spec.gencode, spec.namespace, spec.ops, facts,
                         built.record.durations.get("total"), built.record.jobs, built.record_path)


_LOADED: dict[str, Any] = {}


def load_ops(library: MarlinLibrary) -> Any:
    """Load the library once per process; return ``torch.ops.<namespace>`` holding every op of the recipe."""
    import torch

    path = str(library.path.resolve())
    if path not in _LOADED:
        try:
            torch.ops.load_library(path)
        except OSError as exc:
            import ctypes

            try:
                ctypes.CDLL(path)  # the loader's own message (torch's hides it)
                detail = str(exc)
            except OSError as inner:
                detail = str(inner)
            raise BuildError(f"{path} does not load into torch {torch.__version__}: {detail}",
                             hint=f"rebuild with this interpreter's torch: {REBUILD}") from exc
        _LOADED[path] = getattr(torch.ops, library.namespace)
    namespace = _LOADED[path]
    missing = [op for op in library.ops if not hasattr(namespace, op)]
    if missing:
        raise BuildError(f"{path} loaded but registers no {', '.join(missing)} in torch.ops.{library.namespace}",
                         hint=f"rebuild: {REBUILD}")
    return namespace
