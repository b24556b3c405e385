"""Turn a recipe and the command line into the exact commands, directories and environment of one build.

Planning is pure (no subprocess, nothing written), so ``--dry-run`` prints precisely what a real build
runs, and unit tests can check the command line for every architecture without a toolchain.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from t4patch.builder.recipe import Recipe, StepTemplate
from t4patch.errors import UsageError

CPU = "cpu"
# A ref is passed to git as an argument: anything else (a leading "-", spaces, "..", "^{...}") is refused so
# that `--ref=--orphan=x` can never reach git as an option.
REF_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")


@dataclass(frozen=True)
class PlannedStep:
    name: str
    argv: tuple[str, ...]
    cwd: Path
    env: dict[str, str]  # variables added to (or replacing in) the inherited environment
    progress: str

    def shell(self) -> str:
        """The step as one copy-pasteable shell line (cd + env + command)."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        cmd = shlex.join(self.argv)
        return f"(cd {shlex.quote(str(self.cwd))} && {env + ' ' if env else ''}{cmd})"


@dataclass(frozen=True)
class SourceSpec:
    """Where the source comes from: a clone of ``repository`` at ``ref``, or an existing directory."""

    mode: str  # "clone" (new clone), "reuse" (existing clone in the output dir) or "directory" (--source)
    path: Path
    repository: str | None
    ref: str | None


@dataclass(frozen=True)
class BuildPlan:
    recipe: Recipe
    arch: str  # "75" or "cpu"
    jobs: int
    out: Path
    build_dir: Path
    source: SourceSpec
    features: tuple[str, ...]
    env: dict[str, str]  # added to every build step (git steps get none)
    steps: tuple[PlannedStep, ...]
    nvcc: str | None
    log_path: Path
    record_path: Path
    flags: dict[str, list[str]] = field(default_factory=dict)  # step name -> recipe-derived arguments

    @property
    def cuda(self) -> bool:
        return self.arch != CPU

    @property
    def arch_number(self) -> int | None:
        return None if self.arch == CPU else int(self.arch)

    def render(self) -> str:
        """Human description for --dry-run: what is built, where, with which environment and commands."""
        lines = [
            f"recipe    {self.recipe.name} ({self.recipe.path})",
            f"target    {'CPU only (no CUDA)' if not self.cuda else f'sm_{self.arch} (compute capability {self.arch[:-1]}.{self.arch[-1]})'}",
            f"source    {self._source_line()}",
            f"out       {self.out}",
            f"build dir {self.build_dir}",
            f"log       {self.log_path}",
            f"record    {self.record_path}",
            f"jobs      {self.jobs}",
        ]
        if self.features:
            lines.append(f"features  {' '.join(self.features)}")
        lines.append("environment added to the build steps:")
        lines.extend(f"  {k}={v}" for k, v in sorted(self.env.items())) if self.env else lines.append("  (none)")
        lines.append("commands:")
        for i, step in enumerate(self.steps, 1):
            lines.append(f"  [{i}/{len(self.steps)}] {step.name}: {step.shell()}")
            if step.name == "checkout":
                lines.append(f"        ({self.source.ref} is first resolved to a commit: refs/tags/{self.source.ref}, "
                             f"else refs/remotes/origin/{self.source.ref}, else a commit hash; that commit is checked out)")
        return "\n".join(lines)

    def _source_line(self) -> str:
        s = self.source
        if s.mode == "directory":
            return f"{s.path} (existing directory, --source)"
        return f"{s.repository} at {s.ref} -> {s.path} ({'new clone' if s.mode == 'clone' else 'existing clone'})"

    def to_dict(self) -> dict[str, object]:
        return {
            "recipe": self.recipe.name,
            "arch": self.arch,
            "cuda": self.cuda,
            "jobs": self.jobs,
            "out": str(self.out),
            "build_dir": str(self.build_dir),
            "source": {"mode": self.source.mode, "path": str(self.source.path),
                       "repository": self.source.repository, "ref": self.source.ref},
            "features": list(self.features),
            "env": dict(sorted(self.env.items())),
            "steps": [{"name": s.name, "argv": list(s.argv), "cwd": str(s.cwd), "env": dict(sorted(s.env.items())),
                       "shell": s.shell()} for s in self.steps],
            "log": str(self.log_path),
            "record": str(self.record_path),
        }


def normalize_arch(value: str) -> str:
    """'75', 'sm_75', '7.5' -> '75'; 'cpu' -> 'cpu'. UsageError for anything else."""
    text = value.strip().lower()
    if text == CPU:
        return CPU
    match = re.fullmatch(r"(?:sm_?|compute_)?(\d)\.?(\d)", text) or re.fullmatch(r"(?:sm_?)?(\d{2})(\d)", text)
    if match is None:
        raise UsageError(
            f"--arch {value!r}: expected a compute capability like 75 (Tesla T4), sm_75 or 7.5, or 'cpu'",
            hint="t4patch build llama.cpp --arch 75",
        )
    return "".join(match.groups())


def plan_build(
    recipe: Recipe,
    *,
    arch: str = "75",
    jobs: int | None = None,
    out: Path | None = None,
    ref: str | None = None,
    source_dir: Path | None = None,
    repository: str | None = None,
    features: tuple[str, ...] = (),
    nvcc: str | None = None,
    cwd: Path | None = None,
) -> BuildPlan:
    """Plan one build. ``nvcc`` is the compiler preflight found (placed into the CMake/cargo command)."""
    arch = normalize_arch(arch)
    if arch == CPU and not recipe.cpu_variant:
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
    chosen = _features(recipe, arch, features)

    base = (cwd or Path.cwd()).resolve()
    out = (out if out is not None else base / "t4patch-build" / f"{recipe.name}-{'cpu' if arch == CPU else 'sm' + arch}")
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
        "arch": "" if arch == CPU else arch,
        "jobs": str(jobs),
        "nvcc": nvcc or "nvcc",
        "features": " ".join(chosen),
    }
    env = {k: _fill(v, values) for k, v in recipe.env.items()}
    if arch != CPU:
        env.update({k: _fill(v, values) for k, v in recipe.cuda_env.items()})

    steps: list[PlannedStep] = []
    if source.mode != "directory":
        steps.extend(_git_steps(source))
    flags: dict[str, list[str]] = {}
    for template in recipe.steps:
        argv = _argv(template, values, arch)
        steps.append(PlannedStep(template.name, argv, Path(_fill(template.cwd, values)), dict(env), template.progress))
        flags[template.name] = list(argv[1:])
    return BuildPlan(
        recipe=recipe,
        arch=arch,
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
    )


def _features(recipe: Recipe, arch: str, requested: tuple[str, ...]) -> tuple[str, ...]:
    if requested and not (recipe.cuda_features or recipe.optional_features):
        raise UsageError(f"{recipe.name} takes no --feature", hint=f"t4patch build {recipe.name}")
    for feature in requested:
        floor = recipe.feature_min_arch.get(feature)
        if floor is not None and (arch == CPU or int(arch) < floor):
            raise UsageError(
                f"--feature {feature} needs compute capability {floor // 10}.{floor % 10} or newer; "
                f"this build targets {'the CPU' if arch == CPU else f'sm_{arch}'}",
                hint=f"t4patch build {recipe.name} --arch {arch} (without --feature {feature})",
            )
        if feature not in recipe.optional_features:
            allowed = ", ".join(recipe.optional_features) or "none"
            raise UsageError(f"--feature {feature!r} is not offered by the {recipe.name} recipe (offered: {allowed})",
                             hint=f"t4patch build {recipe.name} --dry-run")
    if arch == CPU:
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
    # The ref is resolved to a commit after the clone/fetch (t4patch.builder.source.resolve_ref: refs/tags/REF,
    # then refs/remotes/origin/REF, then a commit hash), and the pipeline replaces the last argument with that
    # commit: checking out the name itself would pick up a stale local branch of a reused clone.
    steps.append(PlannedStep("checkout", ("git", "-C", str(source.path), "-c", "advice.detachedHead=false",
                                          "checkout", "--force", "--detach", source.ref), source.path, git_env, "none"))
    return steps


def _fill(template: str, values: dict[str, str]) -> str:
    return template.format_map(values)


def _argv(template: StepTemplate, values: dict[str, str], arch: str) -> tuple[str, ...]:
    extra = template.cpu_argv if arch == CPU else template.cuda_argv
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
