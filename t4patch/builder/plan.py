"""Turn a recipe and the command line into the exact commands, directories and environment of one build.

Planning is pure (no subprocess, nothing written), so ``--dry-run`` prints precisely what a real build
runs, and unit tests can check the command line for every architecture without a toolchain. Nothing in a
plan is rewritten while it runs: what only the run can know (which commit ``--ref`` names) is found by a
step of its own (``resolve-ref``, a lookup shown in the dry run like any other command), and a later step
takes it through a :class:`StepOutput` argument, which the dry run shows as ``<output of resolve-ref>``.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from t4patch.builder import extension as ext
from t4patch.builder.extension import Toolchain
from t4patch.builder.recipe import Recipe, StepTemplate
from t4patch.builder.source import ref_lookup_commands
from t4patch.cuda.arch import CPU_WORD, Arch, parse_build_target
from t4patch.errors import BuildError, UsageError

CPU = CPU_WORD  # how a CPU-only build is written on the command line and in the build record
RESOLVE_STEP = "resolve-ref"
CHECKOUT_STEP = "checkout"
# A ref is passed to git as an argument: anything else (a leading "-", spaces, "..", "^{...}") is refused so
# that `--ref=--orphan=x` can never reach git as an option.
REF_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")


@dataclass(frozen=True)
class StepOutput:
    """An argument filled at run time with the output of an earlier step of the same plan."""

    step: str  # the name of that step

    def shown(self) -> str:
        return f"<output of {self.step}>"


Arg = str | StepOutput


@dataclass(frozen=True)
class PlannedStep:
    """One step: a command, or (``lookup``) commands tried in order whose first answer is the step's output.

    A lookup step (``resolve-ref``) runs each of ``lookup`` with its output captured; the first that exits 0
    and prints an acceptable answer ends the step, and that answer is its output. A shell writes the same as
    ``a || b || c``, which is how :meth:`shell` shows it. ``argv`` of a lookup step is its first command.
    """

    name: str
    argv: tuple[Arg, ...]
    cwd: Path
    env: dict[str, str]  # variables added to (or replacing in) the inherited environment
    progress: str
    lookup: tuple[tuple[str, ...], ...] = ()
    # independent commands that must all succeed, run up to the plan's jobs at a time (an extension's compiles)
    batch: tuple[tuple[str, ...], ...] = ()
    # a step t4patch does itself, no subprocess (an extension's "unpack" and "register"): its description
    action: str | None = None

    def commands(self) -> tuple[tuple[Arg, ...], ...]:
        """Every command this step may run, in order (one, unless it is a lookup or a batch; none for an action)."""
        if self.action is not None:
            return ()
        return self.lookup or self.batch or (self.argv,)

    def inputs(self) -> tuple[str, ...]:
        """Names of the earlier steps whose output this step takes."""
        return tuple(a.step for a in self.argv if isinstance(a, StepOutput))

    def bind(self, outputs: Mapping[str, str]) -> tuple[str, ...]:
        """The argv to run, with every StepOutput replaced by that step's output."""
        bound = []
        for arg in self.argv:
            if isinstance(arg, StepOutput):
                if arg.step not in outputs:
                    raise BuildError(f"step {self.name!r} needs the output of step {arg.step!r}, which has none",
                                     hint="this is a t4patch defect: report it with the build log")
                bound.append(outputs[arg.step])
            else:
                bound.append(arg)
        return tuple(bound)

    def shell(self) -> str:
        """The step as one copy-pasteable shell line (cd + env + command); a StepOutput shows as a placeholder."""
        if self.action is not None:
            return f"(t4patch: {self.action})"
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        # Each alternative of a lookup gets the environment: in `A=1 a || b` it would reach `a` only. A batch
        # reads as its commands one after another (the build runs them side by side; the result is the same).
        joiner = " && " if self.batch else " || "
        cmd = joiner.join(f"{env + ' ' if env else ''}{_shown(argv)}" for argv in self.commands())
        return f"(cd {shlex.quote(str(self.cwd))} && {cmd})"

    def to_dict(self) -> dict[str, object]:
        doc: dict[str, object] = {"name": self.name, "argv": [_arg(a) for a in self.argv], "cwd": str(self.cwd),
                                  "env": dict(sorted(self.env.items())), "shell": self.shell()}
        if self.lookup:
            doc["lookup"] = [list(argv) for argv in self.lookup]
        if self.batch:
            doc["batch"] = [list(argv) for argv in self.batch]
        if self.action is not None:
            doc["action"] = self.action
        if self.inputs():
            doc["inputs"] = list(self.inputs())
        return doc


def _arg(arg: Arg) -> str:
    return arg.shown() if isinstance(arg, StepOutput) else arg


def _shown(argv: tuple[Arg, ...]) -> str:
    return " ".join(arg.shown() if isinstance(arg, StepOutput) else shlex.quote(arg) for arg in argv)


@dataclass(frozen=True)
class SourceSpec:
    """Where the source comes from: a clone of ``repository`` at ``ref``, or an existing directory."""

    mode: str  # "clone" (new clone), "reuse" (existing clone), "directory" (--source) or "sdist" (an extension's archive)
    path: Path
    repository: str | None
    ref: str | None


@dataclass(frozen=True)
class BuildPlan:
    recipe: Recipe
    arch: Arch | None  # None: a CPU-only build
    jobs: int
    out: Path
    build_dir: Path
    source: SourceSpec
    features: tuple[str, ...]
    env: dict[str, str]  # added to every build step (git steps get none)
    steps: tuple[PlannedStep, ...]  # executed exactly as shown: see module docstring
    nvcc: str | None
    log_path: Path
    record_path: Path
    flags: dict[str, list[str]] = field(default_factory=dict)  # step name -> recipe-derived arguments
    with_tests: bool = False  # --with-tests: the recipe's [tests] arguments and artifacts added
    ptx_only: bool = False  # --ptx-only: {arch} is "NN-virtual" (PTX for compute_NN, no SASS)
    toolchain: Toolchain | None = None  # a torch extension's compiler, torch and cuBLAS (None: an engine recipe)
    cache_key: str | None = None  # a torch extension's identity (inputs + toolchain): its default --out is named by it

    @property
    def cuda(self) -> bool:
        return self.arch is not None

    @property
    def arch_text(self) -> str:
        """The target as the command line and the build record write it: "75", or "cpu"."""
        return self.arch.digits if self.arch is not None else CPU

    def render(self) -> str:
        """Human description for --dry-run: what is built, where, with which environment and commands."""
        target = (f"{self.arch.name} (compute capability {self.arch.dotted})" if self.arch is not None
                  else "CPU only (no CUDA)")
        lines = [
            f"recipe    {self.recipe.name} ({self.recipe.path})",
            f"target    {target}",
            f"source    {self._source_line()}",
            f"out       {self.out}",
            f"build dir {self.build_dir}",
            f"log       {self.log_path}",
            f"record    {self.record_path}",
            f"jobs      {self.jobs}",
        ]
        if self.features:
            lines.append(f"features  {' '.join(self.features)}")
        if self.with_tests or self.ptx_only:
            lines.append("variant   " + ", ".join(
                (["with tests"] if self.with_tests else [])
                + ([f"PTX only ({self.arch_text}-virtual: no SASS; any newer GPU JIT-compiles the {self.arch.name if self.arch else ''} code)"]
                   if self.ptx_only else [])))
        lines.append("environment added to the build steps:")
        lines.extend(f"  {k}={v}" for k, v in sorted(self.env.items())) if self.env else lines.append("  (none)")
        lines.append("commands:")
        for i, step in enumerate(self.steps, 1):
            lines.append(f"  [{i}/{len(self.steps)}] {step.name}: {step.shell()}")
            if step.name == RESOLVE_STEP:
                lines.append(f"        (the first that prints a commit names {self.source.ref}: its tag, else the origin "
                             "branch, else a commit whose hash starts with it; that commit is the step's output)")
            if step.name == CHECKOUT_STEP and step.inputs():
                lines.append("        (HEAD is then read back and must be that commit)")
            if step.batch:
                lines.append(f"        ({len(step.batch)} commands, run up to {self.jobs} at a time; every one must succeed)")
        return "\n".join(lines)

    def _source_line(self) -> str:
        s = self.source
        if s.mode == "sdist":
            return f"{s.path} (source archive or unpacked tree; every pinned file checked)"
        if s.mode == "directory":
            return f"{s.path} (existing directory, --source)"
        return f"{s.repository} at {s.ref} -> {s.path} ({'new clone' if s.mode == 'clone' else 'existing clone'})"

    def to_dict(self) -> dict[str, object]:
        return {
            "recipe": self.recipe.name,
            "arch": self.arch_text,
            "cuda": self.cuda,
            "jobs": self.jobs,
            "out": str(self.out),
            "build_dir": str(self.build_dir),
            "source": {"mode": self.source.mode, "path": str(self.source.path),
                       "repository": self.source.repository, "ref": self.source.ref},
            "features": list(self.features),
            "with_tests": self.with_tests,
            "ptx_only": self.ptx_only,
            "env": dict(sorted(self.env.items())),
            "steps": [s.to_dict() for s in self.steps],
            "log": str(self.log_path),
            "record": str(self.record_path),
            **({"toolchain": self.toolchain.to_json(), "cache_key": self.cache_key} if self.toolchain else {}),
        }


def commands(plan: BuildPlan) -> list[tuple[Arg, ...]]:
    """Every command of the plan in order, as the dry run shows them (a lookup's alternatives each listed)."""
    return [argv for step in plan.steps for argv in step.commands()]


def plan_build(
    recipe: Recipe,
    *,
    arch: str | Arch | None = "75",
    jobs: int | None = None,
    out: Path | None = None,
    ref: str | None = None,
    source_dir: Path | None = None,
    repository: str | None = None,
    features: tuple[str, ...] = (),
    nvcc: str | None = None,
    cwd: Path | None = None,
    with_tests: bool = False,
    ptx_only: bool = False,
    toolchain: Toolchain | None = None,
) -> BuildPlan:
    """Plan one build. ``nvcc`` is the compiler preflight found (placed into the CMake/cargo command).

    ``arch``: the user's ``--arch`` text (``75``, ``sm_75``, ``7.5``, ``cpu``), an :class:`Arch`, or None for a
    CPU-only build. A torch-extension recipe also needs ``toolchain`` (what compiles and loads it); its
    ``source_dir`` is the source archive or an unpacked tree."""
    target = parse_build_target(arch) if isinstance(arch, str) else arch
    if recipe.extension is not None:
        if ref is not None or repository is not None or features or with_tests:
            given = "--ref" if ref else "--repo" if repository else "--feature" if features else "--with-tests"
            raise UsageError(f"{given}: {recipe.name} is built from its pinned source archive (no clone, features or "
                             "test build)", hint=f"t4patch build {recipe.name} --dry-run")
        return _plan_extension(recipe, target, jobs=jobs, out=out, source=source_dir, cwd=cwd,
                               toolchain=toolchain or _no_toolchain(nvcc))
    if target is None and not recipe.cpu_variant:
        raise UsageError(f"{recipe.name} has no CPU-only build in its recipe", hint=f"t4patch build {recipe.name} --arch 75")
    if ref is not None and source_dir is not None:
        raise UsageError("--ref and --source exclude each other: --source builds the directory as it is",
                         hint=f"t4patch build {recipe.name} --source DIR  or  --ref REF")
    if ref is not None and (not REF_PATTERN.match(ref) or ".." in ref):
        raise UsageError(f"--ref {ref!r}: expected a tag, branch or commit (letters, digits, . _ / -, not starting "
                         "with - or .)", hint=f"t4patch build {recipe.name} --ref {recipe.default_ref}")
    if repository is not None and source_dir is not None:
        raise UsageError("--repo and --source exclude each other: --source builds the directory as it is, nothing "
                         "is cloned", hint=f"t4patch build {recipe.name} --source DIR  or  --repo URL")
    if jobs is None:
        jobs = os.cpu_count() or 1
    if jobs < 1:
        raise UsageError(f"--jobs {jobs}: expected a positive number", hint=f"t4patch build {recipe.name} --jobs 4")
    chosen = _features(recipe, target, features)
    if with_tests and not recipe.tests_argv:
        raise UsageError(f"{recipe.name}'s recipe has no test build", hint=f"t4patch build {recipe.name}")
    if ptx_only and target is None:
        raise UsageError("--ptx-only needs a GPU architecture (it builds PTX for it); --arch cpu has none",
                         hint=f"t4patch build {recipe.name} --arch 75 --ptx-only")

    base = (cwd or Path.cwd()).resolve()
    suffix = CPU if target is None else "sm" + target.digits + ("-virtual" if ptx_only else "")
    out = (out if out is not None else base / "t4patch-build" / f"{recipe.name}-{suffix}")
    out = (base / out).resolve() if not out.is_absolute() else out.resolve()
    build_dir = out / recipe.build_dir

    if source_dir is not None:
        src = (base / source_dir).resolve()
        if not src.is_dir():
            raise UsageError(f"--source {source_dir}: expected an existing {recipe.name} source directory, found "
                             f"{'a file' if src.exists() else 'nothing'} at {src}",
                             hint=f"t4patch build {recipe.name}  (clones {recipe.repository}) or --source DIR")
        source = SourceSpec("directory", src, None, None)
    else:
        src = out / "src"
        mode = "reuse" if (src / ".git").exists() else "clone"
        source = SourceSpec(mode, src, repository or recipe.repository, ref or recipe.default_ref)

    values = {
        "source": str(source.path),
        "build": str(build_dir),
        "out": str(out),
        "arch": "" if target is None else target.digits + ("-virtual" if ptx_only else ""),
        "jobs": str(jobs),
        "nvcc": nvcc or "nvcc",
        "features": " ".join(chosen),
    }
    env = {k: _fill(v, values) for k, v in recipe.env.items()}
    if target is not None:
        env.update({k: _fill(v, values) for k, v in recipe.cuda_env.items()})

    steps: list[PlannedStep] = []
    if source.mode != "directory":
        steps.extend(_git_steps(source))
    flags: dict[str, list[str]] = {}
    for template in recipe.steps:
        argv = _argv(template, values, target)
        if with_tests:
            argv += tuple(_fill(a, values) for a in recipe.tests_argv.get(template.name, ()))
        steps.append(PlannedStep(template.name, argv, Path(_fill(template.cwd, values)), dict(env), template.progress))
        flags[template.name] = list(argv[1:])
    return BuildPlan(
        recipe=recipe,
        arch=target,
        jobs=jobs,
        out=out,
        build_dir=build_dir,
        source=source,
        features=chosen,
        env=env,
        steps=tuple(steps),
        nvcc=nvcc,
        log_path=out / "build.log",
        record_path=out / "build-record.json",
        flags=flags,
        with_tests=with_tests,
        ptx_only=ptx_only,
    )


def _features(recipe: Recipe, arch: Arch | None, requested: tuple[str, ...]) -> tuple[str, ...]:
    if requested and not (recipe.cuda_features or recipe.optional_features):
        raise UsageError(f"{recipe.name} takes no --feature", hint=f"t4patch build {recipe.name}")
    for feature in requested:
        floor = recipe.feature_min_arch.get(feature)
        if floor is not None and (arch is None or arch.capability < floor):
            raise UsageError(
                f"--feature {feature} needs compute capability {floor // 10}.{floor % 10} or newer; "
                f"this build targets {'the CPU' if arch is None else arch.name}",
                hint=f"t4patch build {recipe.name} --arch {CPU if arch is None else arch.digits} "
                     f"(without --feature {feature})",
            )
        if feature not in recipe.optional_features:
            allowed = ", ".join(recipe.optional_features) or "none"
            raise UsageError(f"--feature {feature!r} is not offered by the {recipe.name} recipe (offered: {allowed})",
                             hint=f"t4patch build {recipe.name} --dry-run")
    if arch is None:
        return tuple(dict.fromkeys(requested))
    return tuple(dict.fromkeys(recipe.cuda_features + tuple(requested)))


def _git_steps(source: SourceSpec) -> list[PlannedStep]:
    assert source.repository is not None and source.ref is not None
    git_env = {"GIT_TERMINAL_PROMPT": "0"}  # never hang on a password prompt
    steps = []
    # "--" keeps a repository that starts with "-" from being read as an option.
    if source.mode == "clone":
        steps.append(PlannedStep("clone", ("git", "clone", "--progress", "--no-checkout", "--", source.repository,
                                           str(source.path)), source.path.parent, git_env, "git"))
    else:
        # --force: a tag moved upstream replaces the local one; --prune: a branch deleted upstream no longer
        # resolves from a stale refs/remotes/origin/<name>.
        steps.append(PlannedStep("fetch", ("git", "-C", str(source.path), "fetch", "--progress", "--force", "--prune",
                                           "--tags", "origin"), source.path, git_env, "git"))
    # The ref is resolved to a commit after the clone/fetch (refs/tags/REF, then refs/remotes/origin/REF, then a
    # commit hash), and the commit is what is checked out: checking out the name itself would pick up a stale
    # local branch of a reused clone.
    lookup = ref_lookup_commands(source.path, source.ref)
    steps.append(PlannedStep(RESOLVE_STEP, lookup[0], source.path, git_env, "none", lookup=lookup))
    steps.append(PlannedStep(CHECKOUT_STEP, ("git", "-C", str(source.path), "-c", "advice.detachedHead=false",
                                             "checkout", "--force", "--detach", StepOutput(RESOLVE_STEP)),
                             source.path, git_env, "none"))
    return steps


def _fill(template: str, values: dict[str, str]) -> str:
    return template.format_map(values)


def _argv(template: StepTemplate, values: dict[str, str], arch: Arch | None) -> tuple[str, ...]:
    extra = template.cpu_argv if arch is None else template.cuda_argv
    argv = [_fill(a, values) for a in template.argv + extra]
    # An argument that only held an empty placeholder ({features} of a featureless build) is dropped with the
    # option naming it, so cargo never sees `--features ""`.
    cleaned: list[str] = []
    for arg in argv:
        if arg == "" and cleaned and cleaned[-1].startswith("-"):
            cleaned.pop()
            continue
        cleaned.append(arg)
    return tuple(cleaned)


def _no_toolchain(nvcc: str | None) -> Toolchain:
    return Toolchain(nvcc, None, None, None, (), None, "python3", "")


def _plan_extension(recipe: Recipe, target: Arch | None, *, jobs: int | None, out: Path | None, source: Path | None,
                    cwd: Path | None, toolchain: Toolchain) -> BuildPlan:
    """A torch extension: unpack the pinned files, generate, register the ops, compile (in parallel), link.

    Its default output directory is the t4patch cache (``cache_dir("extensions")/<name>/<key>``), named by the
    cache key, which is where the code that loads the library finds it again."""
    from t4patch.builder.sdist import sdist_path
    from t4patch.fileio.cache import cache_dir

    spec = recipe.extension
    assert spec is not None
    if target is None or target.digits != spec.arch_digits:
        raise UsageError(f"{recipe.name} is built as PTX for compute_{spec.arch_digits} only ({spec.gencode}); "
                         f"--arch {target.digits if target else CPU} is not what it builds",
                         hint=f"t4patch build {recipe.name}")
    if jobs is None:
        jobs = os.cpu_count() or 1
    if jobs < 1:
        raise UsageError(f"--jobs {jobs}: expected a positive number", hint=f"t4patch build {recipe.name} --jobs 4")
    key = ext.cache_key(spec, toolchain)
    base = (cwd or Path.cwd()).resolve()
    out = cache_dir("extensions") / recipe.name / key[:16] if out is None else out
    out = (base / out).resolve() if not out.is_absolute() else out.resolve()
    build_dir = out / recipe.build_dir
    tree = out / "src"
    objects = build_dir / "obj"
    sdist = sdist_path(spec, (base / source) if source is not None else None)
    generate, generate_cwd = ext.generate_command(spec, toolchain, tree)
    compiles = ext.compile_commands(spec, toolchain, tree, objects)
    link = ext.link_command(spec, toolchain, [Path(argv[argv.index("-o") + 1]) for _, argv in compiles],
                            build_dir / spec.library)
    steps = (
        PlannedStep("unpack", (), out, {}, "none",
                    action=f"read the {len(spec.files)} pinned files of {sdist}, each checked against its sha256, "
                           f"write them under {tree} and apply {spec.diff_path.name} exactly "
                           f"(the result must hash to {spec.patched_sha256[:12]}...)"),
        PlannedStep("generate", generate, generate_cwd, {}, "none"),
        PlannedStep("register", (), out, {}, "none",
                    action=f"write {tree / ext.REGISTRATION}: {', '.join(spec.ops)} under torch.ops.{spec.namespace}, "
                           f"their schemas read from {spec.bindings}"),
        PlannedStep("compile", compiles[0][1], objects, {}, "none", batch=tuple(argv for _, argv in compiles)),
        PlannedStep("link", link, build_dir, {}, "none"),
    )
    return BuildPlan(
        recipe=recipe,
        arch=target,
        jobs=jobs,
        out=out,
        build_dir=build_dir,
        source=SourceSpec("sdist", sdist, None, None),
        features=(),
        env={},
        steps=steps,
        nvcc=toolchain.nvcc,
        log_path=out / "build.log",
        record_path=out / "build-record.json",
        flags={"compile": [*ext.compile_flags(spec), "-gencode", spec.gencode]},
        ptx_only=True,
        toolchain=toolchain,
        cache_key=key,
    )
