"""One build from plan to record: source, steps, artifacts, architecture check, build-record.json.

The record (:class:`~t4patch.builder.record.BuildRecord`) is written on success *and* on failure (status
"failed", the steps that ran, the error), so a broken build still leaves evidence next to its log. A build
whose artifacts lack sm_XY code is a failed build: the record says so and VerificationError is raised, even
though every step exited 0. An engine recipe and a torch extension run through the same code; the extension's
two steps that t4patch does itself (``unpack``, ``register``: no subprocess) are :func:`_action`'s.

The plan runs as planned: every command is the plan's, with only :class:`~t4patch.builder.plan.StepOutput`
arguments filled in from the output of the step they name (the commit ``resolve-ref`` found), and each
command's outcome is a typed :class:`~t4patch.builder.runner.StepResult` that goes into the record as it is.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import glob
import os
import platform
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import t4patch
from t4patch.builder.plan import CHECKOUT_STEP, BuildPlan, PlannedStep
from t4patch.builder.preflight import Check
from t4patch.builder.record import BuildRecord
from t4patch.builder.runner import LogRunner, StatusPrinter, StepResult, StepRunner, step_failure
from t4patch.builder.source import (
    SourceIdentity,
    accept_commit,
    check_reused_clone,
    identify_directory,
    resolve_checkout,
    unresolved_ref,
)
from t4patch.errors import BuildError, LockBusyError, T4PatchError, VerificationError
from t4patch.fileio.atomic import write_json_atomic
from t4patch.fileio.hashing import sha256_file
from t4patch.verify.artifacts.check import ArtifactReport, check_artifacts


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def collect_artifacts(plan: BuildPlan) -> tuple[list[Path], list[Path]]:
    """(all artifact files, the CUDA ones) from the recipe's globs; BuildError if a pattern matched nothing."""
    files: dict[Path, None] = {}
    cuda: dict[Path, None] = {}
    missing = []
    patterns = plan.recipe.artifact_files + (plan.recipe.tests_files if plan.with_tests else ())
    for pattern, target in [(p, files) for p in patterns] + (
        [(p, cuda) for p in plan.recipe.cuda_artifacts] if plan.cuda else []
    ):
        hits = sorted(glob.glob(str(plan.build_dir / pattern)))
        if not hits:
            missing.append(pattern)
        for hit in hits:
            real = Path(hit).resolve()
            if real.is_file():
                target.setdefault(real, None)
                files.setdefault(real, None)
    if missing:
        raise BuildError(
            f"the build finished but produced no {', '.join(missing)} under {plan.build_dir}",
            hint=f"read {plan.log_path}; the recipe's targets and artifacts may not match this source version",
        )
    return list(files), list(cuda)


def execute(plan: BuildPlan, checks: list[Check], *, printer: StatusPrinter | None = None,
            command_line: str = "", runner: StepRunner | None = None) -> tuple[dict[str, Any], ArtifactReport | None]:
    """Run ``plan`` (preflight already passed: ``checks``); return (the record written to plan.record_path,
    the artifact report, None for a CPU-only build). ``runner`` runs the commands (default: a LogRunner on
    the plan's log)."""
    printer = printer or StatusPrinter()
    plan.out.mkdir(parents=True, exist_ok=True)
    with output_lock(plan.out, command_line):
        return _execute(plan, checks, printer, command_line, runner)


@contextlib.contextmanager
def output_lock(out: Path, command_line: str) -> Iterator[None]:
    """An exclusive flock on the output directory for the whole build: a second build into the same directory
    (a rerun in another shell, a loader building the same extension) is refused instead of mixing files."""
    fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LockBusyError(f"another build is writing {out}",
                                hint=f"wait for it to finish, then rerun: {command_line or 't4patch build'}") from None
        except OSError:
            pass  # a filesystem without flock (ENOLCK): build unlocked, as before there was a lock
        yield
    finally:
        os.close(fd)  # closing releases the flock


def _execute(plan: BuildPlan, checks: list[Check], printer: StatusPrinter, command_line: str,
             runner: StepRunner | None) -> tuple[dict[str, Any], ArtifactReport | None]:
    plan.log_path.write_text(f"# t4patch {t4patch.__version__} build log: {command_line}\n", encoding="utf-8")
    runner = runner or LogRunner(plan.log_path, printer)

    def failure(result: StepResult) -> BuildError:
        return step_failure(result, plan.log_path, printer.stream, plan.recipe.known_failures, command_line)

    started_wall, started = _now(), time.monotonic()
    results: list[StepResult] = []
    identity: SourceIdentity | None = None
    record = _base_record(plan, checks, command_line, started_wall)
    work: dict[str, Any] = {}  # what the extension's own steps hand on (the pinned bytes, the facts found)

    def finish(status: str, error: T4PatchError | None, report: ArtifactReport | None,
               artifacts: list[dict[str, Any]]) -> dict[str, Any]:
        durations: dict[str, float] = {}
        for r in results:  # a lookup or batch step runs several commands: its time is their sum
            durations[r.name] = durations.get(r.name, 0.0) + r.seconds
        record.status = status
        record.error = str(error) if error else None
        record.finished = _now()
        record.source = identity.to_dict() if identity else None
        record.steps = [r.to_dict() for r in results]
        record.durations = {**{k: round(v, 2) for k, v in durations.items()}, "total": round(time.monotonic() - started, 2)}
        record.artifacts = artifacts
        record.verification = report.to_dict() if report else (
            {"skipped": "CPU-only build: no GPU code to check"} if not plan.cuda and status == "ok" else None)
        if plan.recipe.extension is not None:
            record.extension = _extension_facts(plan, work, report if status == "ok" else None)
        doc = record.to_dict()
        write_json_atomic(plan.record_path, doc)
        return doc

    try:
        if plan.source.mode == "reuse":
            assert plan.source.repository is not None
            check_reused_clone(plan.source.path, plan.source.repository, plan.out)
        elif plan.source.mode == "directory":
            # Identified before any step runs: the build must not change what "the source" was, and an --out
            # inside the source tree is left out of the digest.
            identity = identify_directory(plan.source.path, exclude=_inside(plan.out, plan.source.path))
        outputs: dict[str, str] = {}
        total = len(plan.steps)
        for index, step in enumerate(plan.steps, 1):
            if step.action is not None:
                printer.start(index, total, step.name, (step.action,))
                t0 = time.monotonic()
                found = _action(plan, step, work)
                results.append(StepResult(step.name, (), str(step.cwd), {}, time.monotonic() - t0, 0, action=step.action))
                printer.done(step.name, time.monotonic() - t0, True)
                identity = found or identity
                continue
            if step.batch:
                batch = runner.run_batch(step, jobs=plan.jobs, index=index, total=total)
                results.extend(batch)
                bad = next((r for r in batch if not r.ok), None)
                if bad is not None:
                    raise failure(bad)
                continue
            if step.lookup:
                outputs[step.name] = _lookup(plan, step, runner, results, failure, index=index, total=total)
                continue
            result = runner.run(step, step.bind(outputs), index=index, total=total)
            results.append(result)
            if not result.ok:
                raise failure(result)
            if step.name == CHECKOUT_STEP and step.inputs():
                assert plan.source.ref is not None
                identity = resolve_checkout(plan.source.path, plan.source.ref, outputs[step.inputs()[0]])
        if identity is None:
            identity = identify_directory(plan.source.path, exclude=_inside(plan.out, plan.source.path))
        files, cuda_files = collect_artifacts(plan)
    except T4PatchError as exc:
        if identity is None and plan.source.mode == "directory" and plan.source.path.is_dir():
            identity = identify_directory(plan.source.path, exclude=_inside(plan.out, plan.source.path))
        finish("failed", exc, None, [])
        raise
    except KeyboardInterrupt:
        finish("interrupted", BuildError("interrupted (Ctrl-C or SIGTERM)"), None, [])
        raise

    report = None
    if plan.arch is not None:
        # a PTX-only build (--ptx-only, a torch extension) carries PTX for the arch by design: the recipe's SASS
        # requirement does not apply, and any SASS at all is a problem
        require = tuple(r for r in plan.recipe.require if not (plan.ptx_only and r == "sass"))
        report = check_artifacts(files, plan.arch, require=require, cuda_files=tuple(cuda_files), ptx_only=plan.ptx_only)
        artifacts = [{**r.to_dict(), "path": _rel(r.path, plan.out)} for r in report.files]
    else:
        artifacts = [{"path": _rel(p, plan.out), "size": p.stat().st_size, "sha256": sha256_file(p)} for p in files]
    if report is not None and not report.ok:
        problems = report.all_problems()
        error = VerificationError(
            f"build finished but its artifacts fail the {report.arch.name} check: {problems[0]}"
            + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""),
            hint=f"t4patch verify build {plan.out} --arch {plan.arch_text}  (record: {plan.record_path})",
        )
        finish("failed", error, report, artifacts)
        raise error
    return finish("ok", None, report, artifacts), report


def _action(plan: BuildPlan, step: PlannedStep, work: dict[str, Any]) -> SourceIdentity | None:
    """Run one of a torch extension's own steps; the unpack step returns the source's identity."""
    from t4patch.builder import extension as ext
    from t4patch.builder.sdist import locate_sdist, read_sources

    spec = plan.recipe.extension
    assert spec is not None
    tree = plan.out / "src"
    if step.name == "unpack":
        sdist = locate_sdist(spec, plan.source.path)
        sources, origin = read_sources(spec, sdist)
        if tree.exists():
            shutil.rmtree(tree)  # an earlier build's tree: every file is written again from the pinned bytes
        ext.write_tree(spec, sources, tree)
        work.update(sources=sources, origin=origin)
        with plan.log_path.open("a", encoding="utf-8") as log:
            log.write(f"\n### t4patch step unpack: {len(sources)} pinned files from {sdist} ({origin['kind']}), "
                      f"{spec.diff_path.name} applied to {spec.patched_path} (sha256 {spec.patched_sha256})\n")
        return SourceIdentity("sdist", sdist, None, None, False, None, None, None, len(sources),
                              archive_sha256=str(origin["sdist_sha256"]) if origin.get("sdist_sha256") else None)
    if step.name == "register":
        # the generator (the step before) must have written exactly what the recipe lists
        work["generated"] = ext.generated_files(spec, tree)
        work["schemas"] = ext.op_schemas(work["sources"][spec.bindings].decode("utf-8"), spec.ops, spec.bindings)
        (tree / ext.REGISTRATION).write_text(ext.registration_source(spec, work["schemas"]), encoding="utf-8")
        with plan.log_path.open("a", encoding="utf-8") as log:
            log.write(f"\n### t4patch step register: generated {', '.join(work['generated'])}; "
                      f"{ext.REGISTRATION} defines {', '.join(spec.ops)}\n")
        return None
    raise BuildError(f"step {step.name!r} is no step t4patch runs itself", hint="this is a t4patch defect: report it")


def _extension_facts(plan: BuildPlan, work: dict[str, Any], report: ArtifactReport | None) -> dict[str, Any]:
    """What a torch extension's loader and reports need from the record (complete only for an ok build)."""
    from t4patch.builder import extension as ext

    spec = plan.recipe.extension
    assert spec is not None and plan.toolchain is not None
    library = plan.build_dir / spec.library
    facts: dict[str, Any] = {
        "source_hash": spec.source_hash(),
        "cache_key": plan.cache_key,
        "source": {"distribution": spec.distribution, "version": spec.version, **work.get("origin", {})},
        "change": {"diff": spec.diff_path.name, "diff_sha256": spec.diff_sha256, "path": spec.patched_path,
                   "sha256": spec.patched_sha256},
        "emulation": spec.emulation.to_json(),
        "generated": work.get("generated"),
        "schemas": work.get("schemas"),
        "namespace": spec.namespace,
        "ops": list(spec.ops),
        "gencode": spec.gencode,
        "compile_flags": ext.compile_flags(spec),
        "toolchain": plan.toolchain.to_json(),
        "library": None,
        "fatbin": None,
    }
    if report is not None and library.is_file():
        result = next(r for r in report.files if r.path == library.resolve())
        facts["library"] = {"file": spec.library, "path": str(library), "sha256": result.sha256, "bytes": result.size}
        facts["fatbin"] = result.summary.to_dict()
    return facts


def _lookup(plan: BuildPlan, step: PlannedStep, runner: StepRunner, results: list[StepResult],
            failure: Callable[[StepResult], BuildError], *, index: int, total: int) -> str:
    """Run a lookup step's commands in order until one answers; its answer (a commit) is the step's output."""
    assert plan.source.ref is not None
    for argv in step.lookup:
        result = runner.run(step, argv, index=index, total=total, capture=True)
        results.append(result)
        if result.returncode is None:
            raise failure(result)
        commit = accept_commit(plan.source.ref, argv, result.returncode, result.output or "")
        if commit is not None:
            return commit
    raise unresolved_ref(plan.source.path, plan.source.ref)


def _inside(path: Path, root: Path) -> Path | None:
    """``path`` when it lies inside ``root`` (so a digest of ``root`` must leave it out), else None."""
    try:
        path.resolve().relative_to(root.resolve())
    except ValueError:
        return None
    return path


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def _base_record(plan: BuildPlan, checks: list[Check], command_line: str, started: str) -> BuildRecord:
    recipe_path = plan.recipe.path
    return BuildRecord(
        t4patch=t4patch.__version__,
        command=command_line,
        recipe=plan.recipe.name,
        recipe_sha256=sha256_file(recipe_path) if recipe_path else None,
        arch=plan.arch_text,
        cuda=plan.cuda,
        features=list(plan.features),
        with_tests=plan.with_tests,
        ptx_only=plan.ptx_only,
        jobs=plan.jobs,
        out=str(plan.out),
        build_dir=str(plan.build_dir),
        log=str(plan.log_path),
        requested={"mode": plan.source.mode, "repository": plan.source.repository, "ref": plan.source.ref,
                   "path": str(plan.source.path)},
        env=dict(sorted(plan.env.items())),
        flags=plan.flags,
        tools={c.name: c.found or "" for c in checks},
        host={"machine": platform.machine(), "system": platform.system(), "release": platform.release(),
              "cpus": os.cpu_count(), "python": platform.python_version()},
        started=started,
    )
