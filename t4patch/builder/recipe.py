"""Build recipes: the data in ``recipes/``, loaded and validated before anything runs.

Two kinds, one :class:`Recipe`: ``recipes/<name>.toml`` builds an engine from its git repository with the
recipe's commands (llama.cpp, mistral.rs); ``recipes/<name>/recipe.toml`` with ``kind = "torch-extension"``
builds a small torch extension from a pinned source archive (the Marlin sm_75 library, see
:mod:`t4patch.builder.extension`), its source change beside it.

A recipe is data, not code, so adding a ref or a flag is a reviewed one-line change and ``--dry-run`` can
show exactly what will run. Validation is strict (unknown keys, wrong types, unknown placeholders are errors)
because a typo in a flag would otherwise surface an hour into a build, or never: a misspelt
``-DCMAKE_CUDA_ARCHITECTURS`` is silently ignored by CMake and produces a build without sm_75 code.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from t4patch.builder.extension import EXTENSION_SECTIONS, KIND, ExtensionSpec, parse_extension
from t4patch.data.locations import data_dir
from t4patch.data.reader import Bool, DataKind, Int, ListOf, MapOf, Number, Str, Table, check, optional
from t4patch.data.tomlcompat import tomllib
from t4patch.errors import DataFileError, T4PatchError, UsageError

RECIPE_SCHEMA_VERSION = 1
PLACEHOLDERS = frozenset({"source", "build", "out", "arch", "jobs", "nvcc", "features"})
PROGRESS_KINDS = frozenset({"cmake", "ninja", "make", "cargo", "git", "none"})
REQUIREMENTS = frozenset({"sass", "ptx-text"})
KNOWN_TOOLS = frozenset({"git", "cmake", "ninja", "make", "cargo", "rustc", "nvcc", "cc", "c++"})
KNOWN_LIBRARIES = frozenset({"cudart", "cublas", "curand", "nvrtc", "cuda_driver", "cudnn"})
_VERSION = re.compile(r"^\d+(\.\d+){0,2}$")


@dataclass(frozen=True)
class StepTemplate:
    """One command of a recipe before placeholders are filled in."""

    name: str
    argv: tuple[str, ...]
    cuda_argv: tuple[str, ...] = ()
    cpu_argv: tuple[str, ...] = ()
    progress: str = "none"
    cwd: str = "{out}"


@dataclass(frozen=True)
class KnownFailure:
    """A log pattern with a known cause, turned into a precise hint when a step fails."""

    pattern: re.Pattern[str]
    explanation: str


@dataclass(frozen=True)
class Recipe:
    name: str
    summary: str
    repository: str
    default_ref: str
    build_dir: str
    min_free_gib: float
    cpu_variant: bool
    source_markers: tuple[str, ...]
    tools: dict[str, str]  # always needed: name -> minimum version
    cuda_tools: dict[str, str]  # needed for a CUDA build
    cuda_libraries: tuple[str, ...]
    nvcc_on_path: bool  # the build runs plain `nvcc` from PATH, so PATH must reach the preflighted one
    steps: tuple[StepTemplate, ...]
    env: dict[str, str]
    cuda_env: dict[str, str]
    artifact_files: tuple[str, ...]
    cuda_artifacts: tuple[str, ...]
    require: tuple[str, ...]
    cuda_features: tuple[str, ...] = ()
    optional_features: tuple[str, ...] = ()
    feature_min_arch: dict[str, int] = field(default_factory=dict)
    feature_libraries: dict[str, tuple[str, ...]] = field(default_factory=dict)
    known_failures: tuple[KnownFailure, ...] = ()
    path: Path | None = None
    tests_argv: dict[str, tuple[str, ...]] = field(default_factory=dict)  # step name -> extra args (--with-tests)
    tests_files: tuple[str, ...] = ()  # artifacts of the test build
    extension: ExtensionSpec | None = None  # kind "torch-extension": built from a pinned archive, not a clone

    @property
    def kind(self) -> str:
        return KIND if self.extension is not None else "engine"


def recipe_names() -> list[str]:
    """Names of the shipped recipes (``recipes/<name>.toml`` and ``recipes/<name>/recipe.toml``)."""
    root = data_dir("recipes")
    return sorted([p.name[: -len(".toml")] for p in root.glob("*.toml")]
                  + [p.parent.name for p in root.glob("*/recipe.toml")])


def recipe_path(name: str) -> Path | None:
    """The file of the shipped recipe ``name``, or None."""
    root = data_dir("recipes")
    for path in (root / f"{name}.toml", root / name / "recipe.toml"):
        if "/" not in name and name not in ("", ".", "..") and path.is_file():
            return path
    return None


def load_recipe(name: str) -> Recipe:
    """Load and validate the shipped recipe ``name``; UsageError if there is none of that name."""
    path = recipe_path(name)
    if path is None:
        names = recipe_names()
        raise UsageError(
            f"no build recipe named {name!r} (shipped: {', '.join(names) or 'none'})",
            hint="  or  ".join(f"t4patch build {n}" for n in names) or "reinstall t4patch",
        )
    return load_recipe_file(path)


RECIPE = DataKind(
    label="build recipe",
    error=DataFileError,
    hint="fix the recipe (see docs/build.md, 'Recipe format'), or reinstall t4patch",
)
_STRINGS = ListOf(Str())

# A recipe file, stated once; the strict reader refuses unknown keys, wrong types and missing keys.
RECIPE_SCHEMA = Table(
    {
        "schema": Int(),
        "name": Str(),
        "summary": Str(),
        "repository": Str(),
        "default_ref": Str(),
        "build_dir": Str(),
        "min_free_gib": Number(),
        "cpu_variant": optional(Bool()),
        "source_markers": optional(_STRINGS),
        "tools": optional(MapOf(Str())),  # always needed: tool -> minimum version
        "cuda": optional(
            Table(
                {
                    "tools": optional(MapOf(Str())),
                    "libraries": optional(_STRINGS),
                    "nvcc_on_path": optional(Bool()),
                }
            )
        ),
        "step": ListOf(
            Table(
                {
                    "name": Str(),
                    "argv": ListOf(Str(), nonempty=True),
                    "cuda_argv": optional(_STRINGS),
                    "cpu_argv": optional(_STRINGS),
                    "progress": optional(Str()),
                    "cwd": optional(Str()),
                }
            ),
            nonempty=True,
        ),
        "env": optional(MapOf(Str(nonempty=False))),
        "cuda_env": optional(MapOf(Str(nonempty=False))),
        "artifacts": Table({"files": _STRINGS, "cuda": optional(_STRINGS), "require": optional(_STRINGS)}),
        "features": optional(
            Table(
                {
                    "cuda": optional(_STRINGS),
                    "optional": optional(_STRINGS),
                    "min_arch": optional(MapOf(Int())),
                    "libraries": optional(MapOf(_STRINGS)),
                }
            )
        ),
        "known_failure": optional(ListOf(Table({"pattern": Str(), "explanation": Str()}))),
        # `t4patch build ... --with-tests`: extra arguments per step (by step name) and the test artifacts
        "tests": optional(Table({"argv": MapOf(_STRINGS, nonempty=True), "files": _STRINGS})),
    }
)


# A torch-extension recipe (kind = "torch-extension"), stated once; the sections are builder/extension.py's.
EXTENSION_RECIPE_SCHEMA = Table(
    {
        "schema": Int(),
        "name": Str(),
        "kind": Str(),
        "summary": Str(),
        "min_free_gib": Number(),
        **EXTENSION_SECTIONS,
        "known_failure": optional(ListOf(Table({"pattern": Str(), "explanation": Str()}))),
    }
)


def load_recipe_file(path: Path) -> Recipe:
    """Read, check and build the recipe in ``path`` (a shipped one or a copy)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise RECIPE.fail(path, "expected a TOML file, found nothing there") from None
    except OSError as exc:
        raise RECIPE.fail(path, f"expected a readable TOML file, found an unreadable one ({exc})") from None
    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise RECIPE.fail(path, f"expected a readable UTF-8 TOML file, found an unreadable one ({exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise RECIPE.fail(path, f"expected valid TOML, found a syntax error ({exc})") from None
    return parse_recipe(doc, path, data)


def _fail(origin: Path | None, message: str) -> T4PatchError:
    return RECIPE.fail(origin or "<recipe>", message)


def _check_placeholders(origin: Path | None, where: str, values: tuple[str, ...] | list[str]) -> None:
    for value in values:
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(value) if f is not None]
        except ValueError as exc:
            raise _fail(origin, f"{where}: bad placeholder syntax in {value!r} ({exc})") from exc
        for f in fields:
            if f not in PLACEHOLDERS:
                raise _fail(origin, f"{where}: unknown placeholder {{{f}}} in {value!r} (known: {sorted(PLACEHOLDERS)})")


def _check_versions(origin: Path | None, where: str, tools: dict[str, str]) -> None:
    for tool, version in tools.items():
        if tool not in KNOWN_TOOLS:
            raise _fail(origin, f"{where}: unknown tool {tool!r} (known: {sorted(KNOWN_TOOLS)})")
        if not _VERSION.match(version):
            raise _fail(origin, f"{where}.{tool}: minimum version {version!r} is not like '3.18' or '1.88.0'")


def parse_recipe(doc: dict[str, Any], origin: Path | None = None, data: bytes | None = None) -> Recipe:
    """Validate a recipe document (already parsed TOML) and build a :class:`Recipe`.

    ``data``: the file's bytes (a torch-extension recipe's hash covers them; it needs ``origin`` too, for the
    diff beside it)."""
    schema = doc.get("schema")
    if isinstance(schema, int) and not isinstance(schema, bool) and schema != RECIPE_SCHEMA_VERSION:
        raise _fail(origin, f"schema {schema} is not supported (this t4patch reads schema {RECIPE_SCHEMA_VERSION})")
    if "kind" in doc:
        if doc["kind"] != KIND:
            raise _fail(origin, f"kind {doc['kind']!r} is not one this t4patch builds (known: {KIND!r}; an engine "
                        "recipe has no kind)")
        if origin is None or data is None:
            raise _fail(origin, f"a {KIND} recipe is read from its file (its diff lies beside it)")
        return _parse_extension_recipe(doc, origin, data)
    doc = check(doc, RECIPE_SCHEMA, RECIPE, origin or "<recipe>")
    name, repository, default_ref, build_dir, min_free = _parse_head(doc, origin)
    tools = dict(doc.get("tools", {}))
    _check_versions(origin, "[tools]", tools)
    cuda = doc.get("cuda", {})
    cuda_tools = dict(cuda.get("tools", {}))
    _check_versions(origin, "[cuda].tools", cuda_tools)
    libraries = _known_libraries(origin, "[cuda]", cuda.get("libraries", ()))
    steps = _parse_steps(origin, doc["step"])
    env, cuda_env = _parse_env(origin, doc)
    files, cuda_artifacts, require = _parse_artifacts(origin, doc["artifacts"])
    cuda_features, optional_features, feature_min_arch, feature_libraries = _parse_features(origin, doc, steps)
    tests_argv, tests_files = _parse_tests(origin, doc.get("tests", {}), {s.name for s in steps})
    return Recipe(
        name=name,
        summary=doc["summary"],
        repository=repository,
        default_ref=default_ref,
        build_dir=build_dir,
        min_free_gib=min_free,
        cpu_variant=doc.get("cpu_variant", False),
        source_markers=tuple(doc.get("source_markers", ())),
        tools=tools,
        cuda_tools=cuda_tools,
        cuda_libraries=libraries,
        nvcc_on_path=cuda.get("nvcc_on_path", False),
        steps=steps,
        env=env,
        cuda_env=cuda_env,
        artifact_files=files,
        cuda_artifacts=cuda_artifacts,
        require=require,
        cuda_features=cuda_features,
        optional_features=optional_features,
        feature_min_arch=feature_min_arch,
        feature_libraries=feature_libraries,
        known_failures=_parse_known_failures(origin, doc.get("known_failure", [])),
        path=origin,
        tests_argv=tests_argv,
        tests_files=tests_files,
    )


def _parse_head(doc: dict[str, Any], origin: Path | None) -> tuple[str, str, str, str, float]:
    """(name, repository, default_ref, build_dir, min_free_gib), each checked."""
    name = doc["name"]
    if origin is not None and origin.name != f"{name}.toml":
        raise _fail(origin, f"name {name!r} does not match the file name {origin.name!r}")
    repository = doc["repository"]
    if not re.match(r"^(https://|ssh://|git@|file://|/)", repository):
        raise _fail(origin, f"repository {repository!r} is not a git URL")
    default_ref = doc["default_ref"]
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$", default_ref):
        raise _fail(origin, f"default_ref {default_ref!r} is not a plain tag, branch or commit")
    build_dir = doc["build_dir"]
    _relative_inside(origin, "build_dir", build_dir, "the output directory")
    min_free = doc["min_free_gib"]
    if min_free < 0:
        raise _fail(origin, "min_free_gib must be >= 0")
    return name, repository, default_ref, build_dir, float(min_free)


def _relative_inside(origin: Path | None, where: str, pattern: str, inside: str) -> None:
    if Path(pattern).is_absolute() or ".." in Path(pattern).parts:
        if where == "build_dir":
            raise _fail(origin, f"build_dir {pattern!r} must be a relative path inside {inside}")
        raise _fail(origin, f"{where}: {pattern!r} must be relative to {inside}")


def _known_libraries(origin: Path | None, where: str, values: Any) -> tuple[str, ...]:
    for lib in values:
        if lib not in KNOWN_LIBRARIES:
            raise _fail(origin, f"{where}: unknown library {lib!r} (known: {sorted(KNOWN_LIBRARIES)})")
    return tuple(values)


def _parse_steps(origin: Path | None, raw_steps: list[dict[str, Any]]) -> tuple[StepTemplate, ...]:
    steps: list[StepTemplate] = []
    names: set[str] = set()
    for i, raw in enumerate(raw_steps, start=1):
        where = f"step[{i}]"
        step = StepTemplate(
            name=raw["name"],
            argv=tuple(raw["argv"]),
            cuda_argv=tuple(raw.get("cuda_argv", ())),
            cpu_argv=tuple(raw.get("cpu_argv", ())),
            progress=raw.get("progress", "none"),
            cwd=raw.get("cwd", "{out}"),
        )
        if step.name in names or step.name in ("clone", "fetch", "checkout"):
            raise _fail(origin, f"{where}: step name {step.name!r} is duplicated or reserved")
        names.add(step.name)
        if step.progress not in PROGRESS_KINDS:
            raise _fail(origin, f"{where}: progress {step.progress!r} is not one of {sorted(PROGRESS_KINDS)}")
        for label, values in (("argv", step.argv), ("cuda_argv", step.cuda_argv), ("cpu_argv", step.cpu_argv),
                              ("cwd", (step.cwd,))):
            _check_placeholders(origin, f"{where}.{label}", values)
        steps.append(step)
    return tuple(steps)


def _parse_env(origin: Path | None, doc: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    env = dict(doc.get("env", {}))
    cuda_env = dict(doc.get("cuda_env", {}))
    for label, mapping in (("[env]", env), ("[cuda_env]", cuda_env)):
        for key, value in mapping.items():
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
                raise _fail(origin, f"{label}: {key!r} is not an environment variable name")
            _check_placeholders(origin, f"{label}.{key}", (value,))
    return env, cuda_env


def _parse_artifacts(origin: Path | None, art: dict[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    files = tuple(art["files"])
    cuda_artifacts = tuple(art.get("cuda", ()))
    require = tuple(art.get("require", ()))
    for req in require:
        if req not in REQUIREMENTS:
            raise _fail(origin, f"[artifacts]: require {req!r} is not one of {sorted(REQUIREMENTS)}")
    for pattern in files + cuda_artifacts:
        _relative_inside(origin, "[artifacts]", pattern, "the build directory")
    return files, cuda_artifacts, require


def _parse_features(origin: Path | None, doc: dict[str, Any], steps: tuple[StepTemplate, ...]
                    ) -> tuple[tuple[str, ...], tuple[str, ...], dict[str, int], dict[str, tuple[str, ...]]]:
    feats = doc.get("features", {})
    cuda_features = tuple(feats.get("cuda", ()))
    optional_features = tuple(feats.get("optional", ()))
    feature_min_arch: dict[str, int] = {}
    for key, value in feats.get("min_arch", {}).items():
        if value < 10:
            raise _fail(origin, f"[features].min_arch.{key} must be a compute capability like 80, found {value}")
        feature_min_arch[key] = value
    feature_libraries: dict[str, tuple[str, ...]] = {}
    for key, value in feats.get("libraries", {}).items():
        if not all(v in KNOWN_LIBRARIES for v in value):
            raise _fail(origin, f"[features].libraries.{key} must list known libraries ({sorted(KNOWN_LIBRARIES)})")
        feature_libraries[key] = tuple(value)
    if (cuda_features or optional_features) and not any(
        "{features}" in a for st in steps for a in st.argv + st.cuda_argv
    ):
        raise _fail(origin, "declares [features] but no step passes {features}")
    return cuda_features, optional_features, feature_min_arch, feature_libraries


def _parse_tests(origin: Path | None, tests: dict[str, Any], names: set[str]
                 ) -> tuple[dict[str, tuple[str, ...]], tuple[str, ...]]:
    tests_argv = {step_name: tuple(args) for step_name, args in tests.get("argv", {}).items()}
    for step_name, args in tests_argv.items():
        if step_name not in names:
            raise _fail(origin, f"[tests].argv.{step_name}: no step of that name (steps: {', '.join(sorted(names))})")
        _check_placeholders(origin, f"[tests].argv.{step_name}", args)
    tests_files = tuple(tests.get("files", ()))
    for pattern in tests_files:
        if Path(pattern).is_absolute() or ".." in Path(pattern).parts:
            raise _fail(origin, f"[tests].files: {pattern!r} must be relative to the build directory")
    return tests_argv, tests_files


def _parse_known_failures(origin: Path | None, raw_failures: list[dict[str, Any]]) -> tuple[KnownFailure, ...]:
    failures = []
    for i, raw in enumerate(raw_failures, start=1):
        pattern = raw["pattern"]
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            raise _fail(
                origin, f"known_failure[{i}]: pattern {pattern!r} is not a valid regular expression ({exc})"
            ) from exc
        failures.append(KnownFailure(compiled, raw["explanation"]))
    return tuple(failures)


def _parse_extension_recipe(doc: dict[str, Any], origin: Path, data: bytes) -> Recipe:
    doc = check(doc, EXTENSION_RECIPE_SCHEMA, RECIPE, origin)
    name = doc["name"]
    if origin.name != "recipe.toml" or origin.parent.name != name:
        raise _fail(origin, f"name {name!r} does not match the recipe's place (expected {name}/recipe.toml)")
    if doc["min_free_gib"] < 0:
        raise _fail(origin, "min_free_gib must be >= 0")
    cuda_tools = dict(doc.get("cuda", {}).get("tools", {}))
    _check_versions(origin, "[cuda].tools", cuda_tools)
    spec = parse_extension(doc, origin, data, RECIPE)
    return Recipe(
        name=name,
        summary=doc["summary"],
        repository="",  # an extension comes from its pinned archive (spec.sdist), not from a clone
        default_ref="",
        build_dir="build",
        min_free_gib=float(doc["min_free_gib"]),
        cpu_variant=False,
        source_markers=(),
        tools={},
        cuda_tools=cuda_tools,
        cuda_libraries=(),
        nvcc_on_path=False,
        steps=(),
        env={},
        cuda_env={},
        artifact_files=(spec.library,),
        cuda_artifacts=(spec.library,),
        require=(),  # PTX only by design: the plan is a PTX-only build (no SASS may be there at all)
        known_failures=_parse_known_failures(origin, doc.get("known_failure", [])),
        path=origin,
        extension=spec,
    )
