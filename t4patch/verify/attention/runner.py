"""`verify attention`: prove, on any machine, whether each engine's Triton attention fits a GPU architecture.

The engine's own launcher (the driver the case table names, from the engine table) is called with the
model's shapes, so the tiles are the ones the engine really picks on that architecture; every
``kernel[grid](...)`` it makes is compiled for the architecture instead of run (Triton ships its own ptxas,
so no GPU is needed), and what the compile needs is compared with the architecture's shared-memory limit.

The work happens in a worker process (:mod:`t4patch.verify.attention.worker`), one per engine, because it
has to swap Triton's driver and torch's CUDA probes. The worker runs under the target's interpreter with
``--python`` (its torch and triton, the ones the engine would use) or under this interpreter otherwise (the
``verify`` extra), with the engine's package always resolved from the target's site-packages. Nothing is
written into the target: no bytecode (``-B``, ``PYTHONDONTWRITEBYTECODE``), no files; Triton's compile cache
goes to t4patch's cache directory (``$TRITON_CACHE_DIR`` if set).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from packaging.utils import canonicalize_name

from t4patch.environment import suggest
from t4patch.environment.interpreter import t4patch_command
from t4patch.environment.target import InstalledDistribution, TargetEnvironment
from t4patch.errors import (
    MissingDependencyError,
    NotInstalledError,
    T4PatchError,
    UnsupportedVersionError,
    UsageError,
    VerificationError,
)
from t4patch.patching.local_version import release_of
from t4patch.verify.attention.cases import Arch, CaseTable, Compiler, EngineCases, load_cases
from t4patch.verify.attention.needs import install_command, needed_modules, verify_extra
from t4patch.verify.attention.report import AttentionReport, EngineResult, case_results

WORKER_TIMEOUT_S = 3600
PROGRESS_POLL_S = 0.2
PROGRESS_WIDTH = 120
# The two compiles of every launch when the compiler has t4patch's set applied (see Compiler).
PASS_PATCHED = "patched"
PASS_STOCK = "stock"


@dataclass(frozen=True)
class EngineTarget:
    cases: EngineCases
    dist: InstalledDistribution


def default_triton_cache() -> Path:
    """Where compiled kernels are cached between runs (Triton's own cache format, keyed by source + target)."""
    if os.environ.get("TRITON_CACHE_DIR"):
        return Path(os.environ["TRITON_CACHE_DIR"]).expanduser()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "t4patch" / "triton"


def select_engines(names: list[str], table: CaseTable, target: TargetEnvironment) -> list[EngineTarget]:
    """The engines to verify: the named ones (each must be installed), or every installed one the table knows."""
    known = {canonicalize_name(e.distribution): e for e in table.engines}
    if names:
        chosen: list[EngineCases] = []
        for name in names:
            key = canonicalize_name(name.split("==")[0].strip())
            if key not in known:
                raise UsageError(
                    f"verify attention {name}: expected one of {', '.join(sorted(known))}, found no case table for it",
                    hint=f"t4patch verify attention {' '.join(sorted(known))}",
                )
            if key not in [canonicalize_name(c.distribution) for c in chosen]:
                chosen.append(known[key])
        required = True
    else:
        chosen = list(table.engines)
        required = False
    found: list[EngineTarget] = []
    for engine in chosen:
        dist = target.find(engine.distribution)
        if dist is None:
            if required:
                raise NotInstalledError(
                    f"{engine.distribution} is not installed in {target.description}",
                    hint="point at the serving environment with --python /path/to/venv/bin/python "
                    "or --site-packages DIR",
                )
            continue
        release = release_of(dist.version)  # an install of a `t4patch wheel` wheel is its release
        if release not in engine.versions:
            if not required:
                continue
            raise UnsupportedVersionError(
                f"{engine.distribution} {dist.version} is installed in {target.description}; verify attention "
                f"drives {engine.distribution} {', '.join(engine.versions)} only",
                hint=f"{target.pip_install()} {engine.distribution}=={engine.versions[-1]} (the whole release, with "
                "its own dependencies), or a newer t4patch",
            )
        found.append(EngineTarget(engine.for_version(release), dist))  # that release's Triton series
    if not found:
        supported = ", ".join(f"{e.distribution} {'/'.join(e.versions)}" for e in table.engines)
        raise NotInstalledError(
            f"none of the engines verify attention knows ({supported}) is installed in {target.description}",
            hint="name the environment: t4patch verify attention --python /path/to/venv/bin/python",
        )
    return found


# What the status model's per-engine state means for an attention verdict, in the words the report prints.
PATCH_STATE_TEXT = {
    "applied": "patch set applied",
    "not-applied": "stock, patch set not applied",
    "foreign": "foreign: files match neither the stock nor the patched hash",
    "partial": "patch set partially applied",
}


def patch_overall(dist: InstalledDistribution, target: TargetEnvironment) -> str | None:
    """The status model's state of ``dist``'s patch set (applied, not-applied, ...); None if there is none."""
    from t4patch.patching.status import engine_status

    status = engine_status(dist.name, target)
    return status.overall if status.overall in PATCH_STATE_TEXT else None


def build_request(
    engine: EngineTarget, arch: Arch, table: CaseTable, extra_paths: list[str], result_path: Path, cache: Path
) -> dict[str, Any]:
    cases = engine.cases
    return {
        "needs": needed_modules(verify_extra()),
        "compiler_env_names": sorted(table.compiler.stock_env) if table.compiler else [],
        "engine": {
            "key": cases.key,
            "distribution": cases.distribution,
            "version": engine.dist.version,
            "driver": cases.driver,
            "driver_class": cases.driver_class,
            "triton_series": cases.triton_series,
            "files": list(cases.files),
            "packages": sorted({f.split("/")[0] for f in cases.files}),
            "settings": dict(cases.settings),
        },
        "root": str(engine.dist.root),
        "extra_paths": extra_paths,
        "arch": arch.to_json(),
        "model": table.model.to_json(),
        "cases": [c.to_json() for c in cases.cases],
        "triton_cache_dir": str(cache),
        "result_path": str(result_path),
        "progress_path": str(result_path.with_name("progress.txt")),
    }


def run_worker(
    python: str,
    request: dict[str, Any],
    workdir: Path,
    progress: Callable[[str], None] | None = None,
    env_changes: dict[str, str | None] | None = None,
) -> dict[str, Any]:
    """Run one worker; return its JSON result (a crash without a result becomes a T4PatchError).

    The worker appends one line per compiled case to ``request["progress_path"]`` (when set); ``progress``
    is called with each new line while the worker runs, so a terminal shows where the compile is.
    ``env_changes``: variables to set (a string) or remove (None) in the worker's environment.
    """
    request_path = workdir / "request.json"
    request_path.write_text(json.dumps(request), encoding="utf-8")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONDONTWRITEBYTECODE="1")
    for name, value in (env_changes or {}).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    progress_path = Path(request["progress_path"]) if request.get("progress_path") else None
    out_path, err_path = workdir / "worker.stdout", workdir / "worker.stderr"
    try:
        # t4patch from this tree under that interpreter, without this environment's site-packages (its torch)
        with t4patch_command(python, "t4patch.verify.attention.worker", flags=("-B",)) as argv, \
                out_path.open("w") as out, err_path.open("w") as err:
            proc = subprocess.Popen([*argv, str(request_path)], stdout=out, stderr=err, env=env, cwd=str(workdir))
            deadline = time.monotonic() + WORKER_TIMEOUT_S
            seen = ""
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    proc.kill()
                    proc.wait()
                    raise subprocess.TimeoutExpired(argv, WORKER_TIMEOUT_S)
                if progress is not None and progress_path is not None and progress_path.exists():
                    lines = progress_path.read_text(encoding="utf-8").splitlines()
                    if lines and lines[-1] != seen:
                        seen = lines[-1]
                        progress(seen)
                time.sleep(PROGRESS_POLL_S)
    except subprocess.TimeoutExpired:
        raise T4PatchError(
            f"verify attention: the compile worker for {request['engine']['distribution']} ran over "
            f"{WORKER_TIMEOUT_S} s",
            hint="rerun; compiled kernels are cached, so a second run is much faster",
        ) from None
    except OSError as exc:
        raise T4PatchError(f"verify attention: could not start {python}: {exc}") from None
    result_path = Path(request["result_path"])
    if not result_path.exists():
        stderr = err_path.read_text(encoding="utf-8", errors="replace")
        stdout = out_path.read_text(encoding="utf-8", errors="replace")
        tail = (stderr.strip().splitlines() or stdout.strip().splitlines() or ["no output"])[-1]
        raise T4PatchError(
            f"verify attention: the compile worker ({python}) exited {proc.returncode} without a result: {tail}",
            hint="rerun with --debug; if it crashed inside Triton, report it with the versions of torch and triton",
        )
    return json.loads(result_path.read_text(encoding="utf-8"))


class TerminalProgress:
    """One self-overwriting status line on stderr, only when stderr is a terminal (never in logs or pipes)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty()
        self.width = 0

    def show(self, text: str) -> None:
        if not self.enabled:
            return
        text = text[: PROGRESS_WIDTH - 1]
        self.stream.write("\r" + text.ljust(self.width))
        self.stream.flush()
        self.width = len(text)

    def clear(self) -> None:
        if self.enabled and self.width:
            self.stream.write("\r" + " " * self.width + "\r")
            self.stream.flush()
            self.width = 0


def _raise_worker_error(
    engine: EngineTarget, python: str, error: dict[str, Any], target: TargetEnvironment | None = None,
    *, own_interpreter: bool = True,
) -> None:
    """Turn the worker's error into the right T4PatchError.

    ``own_interpreter``: the worker ran under t4patch's interpreter (no ``--python``), whose compile modules are
    t4patch's ``verify`` extra: the hint installs the whole extra in one command. Under the target's interpreter
    (``--python``) it installs only what is missing, so the serving environment's torch is never replaced.
    """
    kind = error.get("kind")
    message = error.get("message", "unknown error")
    series = engine.cases.triton_series
    if kind == "missing-dependency":
        missing = list(error.get("modules") or [error.get("module") or "?"])
        extra = verify_extra()
        listed = ", ".join(str(r) for r in extra)
        where = "t4patch's own interpreter" if own_interpreter else "the target's interpreter"
        text = (
            f"verify attention {engine.cases.distribution}: {where} ({python}) cannot import "
            f"{', '.join(missing)}; compiling needs t4patch's verify extra ({listed})"
            + (f", with triton {series}.x for {engine.cases.distribution} {engine.dist.version}"
               if any(r.name == "triton" and not r.specifier.contains(f"{series}.0") for r in extra) else "")
            + "; a CPU build of torch is enough"
            + ("" if own_interpreter or "torch" in missing
               else " (the command installs only the missing modules: the serving torch is kept)")
            + (f"; {message}" if message and not message.startswith("cannot import") else "")
        )
        # the whole extra in one go when t4patch's own interpreter lacks part of it; else only what is missing
        whole = own_interpreter and bool(set(missing) & set(needed_modules(extra)))
        hint = install_command(python, missing, extra, series, whole_extra=whole)
        raise MissingDependencyError(text, hint=hint)
    python = shlex.quote(python)
    if kind == "triton-version":
        raise MissingDependencyError(
            f"verify attention {engine.cases.distribution}: {message}",
            hint=f"{python} -m pip install 'triton~={series}.0'",
        )
    if kind == "engine-code":
        raise VerificationError(
            f"verify attention {engine.cases.distribution} {engine.dist.version} in {engine.dist.root}: {message}",
            hint=suggest.command(target, "status", engine.cases.distribution)
            + " (a file may have been changed by someone else)",
        )
    raise T4PatchError(
        f"verify attention {engine.cases.distribution}: internal error in the compile worker: {message}",
        hint="rerun with --debug and report it",
    )


def verify_attention(
    engine_names: list[str],
    arch: Arch,
    target: TargetEnvironment,
    *,
    python: str | None = None,
    site_packages: str | None = None,
    table: CaseTable | None = None,
    cache: Path | None = None,
) -> AttentionReport:
    """Compile every case of every selected engine for ``arch``; the report says what fits.

    ``python``: run the worker under this interpreter (the target's); default: this interpreter.
    ``site_packages``: the target directory, added to the worker's path after its own entries so the
    engine's pure-Python dependencies installed only there are found too.
    """
    table = table or load_cases()
    engines = select_engines(engine_names, table, target)
    interpreter = python or sys.executable
    extra = [site_packages] if site_packages else []
    cache = cache or default_triton_cache()
    results = []
    terminal = TerminalProgress()
    compiler = table.compiler
    for engine in engines:
        label = f"verify attention: {engine.cases.distribution} {engine.dist.version} for {arch.name}"
        total = len(table.model.layers) * len(engine.cases.cases)

        def compile_pass(name: str, env_changes: dict[str, str | None], label: str = label,
                         engine: EngineTarget = engine, total: int = total) -> dict[str, Any]:
            what = f"{label}, {name} Triton" if name == PASS_STOCK else label
            terminal.show(f"{what}: importing the engine ({total} cases to compile)")
            started = time.monotonic()

            def show(line: str) -> None:
                terminal.show(f"{what}: compiling, {line} done, {time.monotonic() - started:.0f} s")

            try:
                with tempfile.TemporaryDirectory(prefix="t4patch-verify-") as tmp:
                    workdir = Path(tmp)
                    request = build_request(engine, arch, table, extra, workdir / "result.json", cache)
                    result = run_worker(interpreter, request, workdir, progress=show, env_changes=env_changes)
            finally:
                terminal.clear()
            if not result.get("ok"):
                _raise_worker_error(engine, interpreter, result.get("error", {}), target,
                                    own_interpreter=python is None)
            return result

        # First as the compiler is installed, with the set's off switch removed (it would make "patched" stock).
        result = compile_pass(PASS_PATCHED, {name: None for name in (compiler.stock_env if compiler else {})})
        overall = patch_overall(engine.dist, target)
        versions = result.get("versions", {})
        compiler_state = _compiler_state(compiler, versions)
        applied = compiler is not None and compiler_state == "applied"
        stock = compile_pass(PASS_STOCK, dict(compiler.stock_env)) if applied and compiler else None
        results.append(
            EngineResult(
                key=engine.cases.key,
                distribution=engine.cases.distribution,
                version=engine.dist.version,
                site_packages=str(engine.dist.root),
                patch_state=PATCH_STATE_TEXT.get(overall or ""),
                patch_overall=overall,
                interpreter=interpreter,
                versions=versions,
                loader=result.get("loader", {}),
                files=result.get("files", {}),
                cases=case_results(
                    result.get("results", []), engine.cases, table.model, arch,
                    stock_results=stock.get("results", []) if stock is not None else None,
                    require_mma=applied and compiler is not None and arch.name in compiler.mma_archs,
                    stock_required_fma=applied and arch.capability < 80,
                ),
                notes=tuple(result.get("notes", [])) + tuple(
                    n for n in (stock or {}).get("notes", []) if n not in result.get("notes", [])),
                compiler=_compiler_json(compiler, versions, compiler_state, stock),
            )
        )
    return AttentionReport(arch=arch, model=table.model, target=target.to_json(), engines=tuple(results))


def _compiler_state(compiler: Compiler | None, versions: dict[str, Any]) -> str | None:
    """The status model's state of t4patch's set for the compiler the worker imported (from where it was imported):
    applied, not-applied, partial, foreign, no-patch-set, ...; None when it cannot be told."""
    root = versions.get("triton_root")
    if compiler is None or not root:
        return None
    from t4patch.environment.target import resolve_target
    from t4patch.patching.status import engine_status

    try:
        return engine_status(compiler.distribution, resolve_target(site_packages=root)).overall
    except T4PatchError:
        return None


def _compiler_json(compiler: Compiler | None, versions: dict[str, Any], state: str | None,
                   stock: dict[str, Any] | None) -> dict[str, Any]:
    if compiler is None:
        return {}
    two_passes = stock is not None
    seen = {PASS_PATCHED if two_passes else "as-installed": versions.get("compiler_env") or {}}
    if stock is not None:
        seen[PASS_STOCK] = stock.get("versions", {}).get("compiler_env") or {}
    return {
        "distribution": compiler.distribution,
        "version": versions.get(compiler.distribution),
        "root": versions.get("triton_root"),
        "t4patch_set": state,
        "passes": [PASS_PATCHED, PASS_STOCK] if two_passes else [PASS_PATCHED if state == "applied" else "as-installed"],
        "stock_env": dict(compiler.stock_env),
        "mma_archs": list(compiler.mma_archs),
        # the user's own values of the switch (the first pass ran without them), and what each pass's worker saw
        "environment": {name: os.environ.get(name) for name in compiler.stock_env},
        "pass_environment": seen,
    }


def check(report: AttentionReport, target: TargetEnvironment | None = None) -> None:
    """Raise VerificationError naming every failed case, or return when all fit (hints aimed at ``target``)."""
    failures = report.failures()
    if not failures:
        return
    listed = "; ".join(f"{e.distribution} {c.layer}/{c.case}: {c.problems[0]}" for e, c in failures[:4])
    more = f" (+{len(failures) - 4} more)" if len(failures) > 4 else ""
    states = {e.patch_overall for e, _ in failures}
    misfits_only = all("of shared memory > limit" in p for _, c in failures for p in c.problems)
    hint = (
        suggest.command(target, "apply", *sorted({f"{e.distribution}=={e.version}" for e, _ in failures}))
        if states & {"not-applied", "partial"}
        else "see the table above; the failing launches would raise OutOfResources on this architecture"
        if misfits_only
        else "see the table above: with t4patch's Triton set applied these launches must run on tensor cores "
        "without spilling"
    )
    verdict = "do not fit" if misfits_only else "fail on"
    raise VerificationError(
        f"{len(failures)} attention case(s) {verdict} {report.arch.name}: {listed}{more}", hint=hint
    )
