"""Build recipes: the data in ``builders/<name>.toml``, loaded and validated before anything runs.

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

from t4patch.data.locations import data_dir
from t4patch.data.tomlcompat import tomllib
from t4patch.errors import PatchSetError, UsageError

RECIPE_SCHEMA = 1
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


def recipe_names() -> list[str]:
    """Names of the shipped recipes (``builders/<name>.toml``)."""
    return sorted(p.name[: -len(".toml")] for p in data_dir("builders").glob("*.toml"))


def load_recipe(name: str) -> Recipe:
    """Load and validate the shipped recipe ``name``; UsageError if there is none of that name."""
    path = data_dir("builders") / f"{name}.toml"
    if not path.is_file():
        raise UsageError(
            f"no build recipe named {name!r} (shipped: {', '.join(recipe_names()) or 'none'})",
            hint="t4patch build llama.cpp  or  t4patch build mistral.rs",
        )
    return load_recipe_file(path)


def load_recipe_file(path: Path) -> Recipe:
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise PatchSetError(f"build recipe {path} is not valid TOML ({exc})", hint="fix or reinstall t4patch") from exc
    return parse_recipe(doc, path)


class _Reader:
    """Typed access to one TOML table that remembers which keys were used, so leftovers are errors."""

    def __init__(self, table: Any, where: str, origin: Path | None) -> None:
        if not isinstance(table, dict):
            raise self._error(f"{where} must be a table", origin)
        self.table, self.where, self.origin, self.used = table, where, origin, set()

    @staticmethod
    def _error(message: str, origin: Path | None) -> PatchSetError:
        return PatchSetError(
            f"build recipe {origin or '<recipe>'}: {message}",
            hint="fix the recipe (see docs/build.md, 'Recipe format'), or reinstall t4patch",
        )

    def fail(self, message: str) -> PatchSetError:
        return self._error(f"{self.where}{message}", self.origin)

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = ..., *, required: bool = True) -> Any:
        self.used.add(key)
        if key not in self.table:
            if default is not ... or not required:
                return None if default is ... else default
            raise self.fail(f"missing key {key!r}")
        value = self.table[key]
        if isinstance(value, bool) and kind in (int, float, (int, float)):
            raise self.fail(f"{key!r} must be a number, found {value!r}")
        if not isinstance(value, kind):
            raise self.fail(f"{key!r} has the wrong type ({type(value).__name__})")
        return value

    def strings(self, key: str, *, default: tuple[str, ...] | None = None) -> tuple[str, ...]:
        value = self.get(key, list, [] if default is not None else ..., required=default is None)
        if value is None:
            value = list(default or ())
        if not all(isinstance(v, str) and v for v in value):
            raise self.fail(f"{key!r} must be a list of non-empty strings")
        return tuple(value)

    def string_map(self, key: str) -> dict[str, str]:
        value = self.get(key, dict, {})
        for k, v in value.items():
            if not isinstance(v, str):
                raise self.fail(f"{key}.{k} must be a string")
        return dict(value)

    def finish(self) -> None:
        extra = sorted(set(self.table) - self.used)
        if extra:
            raise self.fail(f"unknown key(s) {', '.join(map(repr, extra))}")


def _check_placeholders(reader: _Reader, where: str, values: tuple[str, ...] | list[str]) -> None:
    for value in values:
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(value) if f is not None]
        except ValueError as exc:
            raise reader.fail(f"{where}: bad placeholder syntax in {value!r} ({exc})") from exc
        for f in fields:
            if f not in PLACEHOLDERS:
                raise reader.fail(f"{where}: unknown placeholder {{{f}}} in {value!r} (known: {sorted(PLACEHOLDERS)})")


def _check_versions(reader: _Reader, where: str, tools: dict[str, str]) -> None:
    for tool, version in tools.items():
        if tool not in KNOWN_TOOLS:
            raise reader.fail(f"{where}: unknown tool {tool!r} (known: {sorted(KNOWN_TOOLS)})")
        if not _VERSION.match(version):
            raise reader.fail(f"{where}.{tool}: minimum version {version!r} is not like '3.18' or '1.88.0'")


def parse_recipe(doc: dict[str, Any], origin: Path | None = None) -> Recipe:
    """Validate a recipe document (already parsed TOML) and build a :class:`Recipe`."""
    top = _Reader(doc, "", origin)
    schema = top.get("schema", int)
    if schema != RECIPE_SCHEMA:
        raise top.fail(f"schema {schema} is not supported (this t4patch reads schema {RECIPE_SCHEMA})")
    name = top.get("name", str)
    if origin is not None and origin.name != f"{name}.toml":
        raise top.fail(f"name {name!r} does not match the file name {origin.name!r}")
    repository = top.get("repository", str)
    if not re.match(r"^(https://|ssh://|git@|file://|/)", repository):
        raise top.fail(f"repository {repository!r} is not a git URL")
    default_ref = top.get("default_ref", str)
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$", default_ref):
        raise top.fail(f"default_ref {default_ref!r} is not a plain tag, branch or commit")
    build_dir = top.get("build_dir", str)
    if Path(build_dir).is_absolute() or ".." in Path(build_dir).parts:
        raise top.fail(f"build_dir {build_dir!r} must be a relative path inside the output directory")
    min_free = top.get("min_free_gib", (int, float))
    if min_free < 0:
        raise top.fail("min_free_gib must be >= 0")

    tools_reader = _Reader(top.get("tools", dict, {}), "[tools]", origin)
    tools = {k: tools_reader.get(k, str) for k in list(tools_reader.table)}
    _check_versions(top, "[tools]", tools)

    cuda = _Reader(top.get("cuda", dict, {}), "[cuda]", origin)
    cuda_tools = cuda.string_map("tools")
    _check_versions(top, "[cuda].tools", cuda_tools)
    libraries = cuda.strings("libraries", default=())
    for lib in libraries:
        if lib not in KNOWN_LIBRARIES:
            raise cuda.fail(f"unknown library {lib!r} (known: {sorted(KNOWN_LIBRARIES)})")
    nvcc_on_path = cuda.get("nvcc_on_path", bool, False)
    cuda.finish()

    raw_steps = top.get("step", list)
    if not raw_steps:
        raise top.fail("needs at least one [[step]]")
    steps, names = [], set()
    for i, raw in enumerate(raw_steps):
        s = _Reader(raw, f"[[step]] #{i + 1} ", origin)
        step = StepTemplate(
            name=s.get("name", str),
            argv=s.strings("argv"),
            cuda_argv=s.strings("cuda_argv", default=()),
            cpu_argv=s.strings("cpu_argv", default=()),
            progress=s.get("progress", str, "none"),
            cwd=s.get("cwd", str, "{out}"),
        )
        s.finish()
        if step.name in names or step.name in ("clone", "fetch", "checkout"):
            raise s.fail(f"step name {step.name!r} is duplicated or reserved")
        names.add(step.name)
        if step.progress not in PROGRESS_KINDS:
            raise s.fail(f"progress {step.progress!r} is not one of {sorted(PROGRESS_KINDS)}")
        for label, values in (("argv", step.argv), ("cuda_argv", step.cuda_argv), ("cpu_argv", step.cpu_argv),
                              ("cwd", (step.cwd,))):
            _check_placeholders(s, label, values)
        steps.append(step)

    env = top.string_map("env")
    cuda_env = top.string_map("cuda_env")
    for label, mapping in (("[env]", env), ("[cuda_env]", cuda_env)):
        for key, value in mapping.items():
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
                raise top.fail(f"{label}: {key!r} is not an environment variable name")
            _check_placeholders(top, f"{label}.{key}", (value,))

    art = _Reader(top.get("artifacts", dict), "[artifacts]", origin)
    files = art.strings("files")
    cuda_artifacts = art.strings("cuda", default=())
    require = art.strings("require", default=())
    art.finish()
    for req in require:
        if req not in REQUIREMENTS:
            raise art.fail(f"require {req!r} is not one of {sorted(REQUIREMENTS)}")
    for pattern in files + cuda_artifacts:
        if Path(pattern).is_absolute() or ".." in Path(pattern).parts:
            raise art.fail(f"{pattern!r} must be relative to the build directory")

    feats = _Reader(top.get("features", dict, {}), "[features]", origin)
    cuda_features = feats.strings("cuda", default=())
    optional = feats.strings("optional", default=())
    min_arch_raw = feats.get("min_arch", dict, {})
    feature_min_arch = {}
    for key, value in min_arch_raw.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 10:
            raise feats.fail(f"min_arch.{key} must be a compute capability like 80")
        feature_min_arch[key] = value
    libs_raw = feats.get("libraries", dict, {})
    feature_libraries = {}
    for key, value in libs_raw.items():
        if not isinstance(value, list) or not all(v in KNOWN_LIBRARIES for v in value):
            raise feats.fail(f"libraries.{key} must list known libraries ({sorted(KNOWN_LIBRARIES)})")
        feature_libraries[key] = tuple(value)
    feats.finish()
    if (cuda_features or optional) and not any("{features}" in a for st in steps for a in st.argv + st.cuda_argv):
        raise top.fail("declares [features] but no step passes {features}")

    failures = []
    for i, raw in enumerate(top.get("known_failure", list, [])):
        kf = _Reader(raw, f"[[known_failure]] #{i + 1} ", origin)
        pattern = kf.get("pattern", str)
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            raise kf.fail(f"pattern {pattern!r} is not a valid regular expression ({exc})") from exc
        failures.append(KnownFailure(compiled, kf.get("explanation", str)))
        kf.finish()

    recipe = Recipe(
        name=name,
        summary=top.get("summary", str),
        repository=repository,
        default_ref=default_ref,
        build_dir=build_dir,
        min_free_gib=float(min_free),
        cpu_variant=top.get("cpu_variant", bool, False),
        source_markers=top.strings("source_markers", default=()),
        tools=tools,
        cuda_tools=cuda_tools,
        cuda_libraries=libraries,
        nvcc_on_path=nvcc_on_path,
        steps=tuple(steps),
        env=env,
        cuda_env=cuda_env,
        artifact_files=files,
        cuda_artifacts=cuda_artifacts,
        require=require,
        cuda_features=cuda_features,
        optional_features=optional,
        feature_min_arch=feature_min_arch,
        feature_libraries=feature_libraries,
        known_failures=tuple(failures),
        path=origin,
    )
    top.finish()
    return recipe
