"""A torch extension for the code that loads it: the cached build when it still matches, else a build, once.

``t4patch build <extension>`` and a loader (the vLLM Marlin sm_75 provider) share this: the same plan (its output
directory is ``cache_dir("extensions")/<name>/<key>``, the key covering the recipe, its diff, every pinned file,
nvcc, torch and the Python ABI), the same preflight, runner, log and build record. A cached build is used only
when its record reads back as an ``ok`` build of the same key and the library still hashes to what the record
says; anything else (no record, a damaged one, another key, a changed library) is rebuilt.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from t4patch.builder.extension import Toolchain, detect_toolchain
from t4patch.builder.plan import BuildPlan, plan_build
from t4patch.builder.preflight import cuda_roots, enforce, run_preflight, tool_version
from t4patch.builder.preflight import line as preflight_line
from t4patch.builder.recipe import Recipe
from t4patch.builder.record import BuildRecord, read_record
from t4patch.cuda.nvcc import find_nvcc
from t4patch.errors import UsageError
from t4patch.fileio.hashing import sha256_file


@dataclass(frozen=True)
class BuiltExtension:
    library: Path
    record: BuildRecord  # record.extension holds the facts (source hash, cache key, library, fatbin, ...)
    record_path: Path
    cached: bool


def toolchain_for(recipe: Recipe) -> Toolchain:
    """This interpreter's toolchain for ``recipe`` (a torch extension), found without raising."""
    assert recipe.extension is not None
    nvcc = find_nvcc()
    version = tool_version("nvcc", executable=nvcc)[1] if nvcc else None
    roots = tuple(cuda_roots(nvcc)) if nvcc else ()
    return detect_toolchain(nvcc, version, recipe.extension.generate_imports, roots)


def command_line(recipe: Recipe, source: Path | None = None, jobs: int | None = None) -> str:
    """The `t4patch build` command that makes this build (for the log header and rerun hints)."""
    parts = ["t4patch", "build", recipe.name]
    if source is not None:
        parts += ["--source", str(source)]
    if jobs is not None:
        parts += ["--jobs", str(jobs)]
    return shlex.join(parts)


def cached_build(plan: BuildPlan) -> tuple[BuiltExtension | None, str]:
    """(the build in ``plan.out`` when it is usable, else None; why not)."""
    spec = plan.recipe.extension
    assert spec is not None
    if not plan.record_path.is_file():
        return None, "no build yet"
    try:
        record = read_record(plan.record_path, hint="")
    except UsageError as exc:
        return None, str(exc)
    facts = record.extension or {}
    library = plan.build_dir / spec.library
    if not record.ok or record.recipe != plan.recipe.name:
        return None, f"the last build there {record.status}"
    if facts.get("cache_key") != plan.cache_key:
        return None, "built from other inputs or another toolchain"
    expected = (facts.get("library") or {}).get("sha256") if isinstance(facts.get("library"), dict) else None
    if not library.is_file() or sha256_file(library) != expected:
        return None, f"{library} is missing or changed since it was built"
    return BuiltExtension(library, record, plan.record_path, cached=True), "cached"


def ensure_built(recipe: Recipe, *, source: Path | None = None, jobs: int | None = None, force: bool = False,
                 stream: TextIO | None = None) -> BuiltExtension:
    """The cached build of ``recipe`` for this interpreter, or a new one (preflight enforced, progress on
    ``stream``); raises what a build raises (ToolMissingError, BuildError, VerificationError, ...)."""
    from t4patch.builder.pipeline import execute
    from t4patch.builder.runner import StatusPrinter

    stream = stream or sys.stderr
    plan = plan_build(recipe, arch=recipe.extension.arch_digits if recipe.extension else "75", jobs=jobs,
                      source_dir=source, toolchain=toolchain_for(recipe))
    if not force:
        hit, why = cached_build(plan)
        if hit is not None:
            stream.write(f"{recipe.name}: cached build {hit.library} (key {str(plan.cache_key)[:16]})\n")
            return hit
        stream.write(f"{recipe.name}: building into {plan.out} ({why})\n")
    checks = run_preflight(plan)
    for check in checks:
        if not check.ok:
            stream.write("preflight " + preflight_line(check) + "\n")
    rerun = command_line(recipe, source, jobs)
    enforce(checks, command=rerun)
    execute(plan, checks, printer=StatusPrinter(stream), command_line=rerun)
    record = read_record(plan.record_path, hint=f"rerun: {rerun}")
    return BuiltExtension(plan.build_dir / recipe.extension.library if recipe.extension else plan.build_dir,
                          record, plan.record_path, cached=False)
