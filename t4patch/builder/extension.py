"""Torch-extension recipes: a small CUDA library built from an engine's source archive (kind "torch-extension").

Such a recipe (``recipes/<name>/recipe.toml``, its one source change beside it) pins an sdist by sha256 and every
file the build reads from it, an exact unified diff, emulated host values (``[emulate]``: the ``-D`` defines the
diff reads, so a newer GPU chooses what the emulated one would), a generator script of the archive, the nvcc
sources and flags (PTX only: ``-gencode arch=compute_NN,code=compute_NN``), and the torch ops the library
registers, whose schemas are read from the archive's own ``ops.def("...")`` calls, never retyped.

This module holds the recipe section's shape and checks, the toolchain the build needs (nvcc, torch's stable-ABI
headers and libraries, the cuBLAS header) found without importing torch, the cache key, and the pure parts of the
work (the tree from the pinned bytes, the registration source, the compile and link commands). The builder's
plan, preflight, runner and pipeline run it like any other recipe.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from t4patch.data.reader import DataKind, Key, ListOf, Number, Spec, Str, Table, optional
from t4patch.errors import BuildError, T4PatchError
from t4patch.fileio.hashing import sha256_bytes, sha256_file

KIND = "torch-extension"
CUBLAS_INCLUDE_ENV = "T4PATCH_CUBLAS_INCLUDE"
REGISTRATION = "t4patch_registration.cpp"
# Bumped whenever the builder changes how an extension is compiled or linked (part of the cache key).
BUILDER_VERSION = 3
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_C_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
_PTX_ONLY = re.compile(r"^arch=compute_(\d+),code=compute_\1$")

_STRINGS = ListOf(Str())
# The sections a torch-extension recipe has besides the common keys (schema, name, kind, summary, min_free_gib).
EXTENSION_SECTIONS: dict[str, Key | Spec] = {
    "cuda": optional(Table({"tools": Table({"nvcc": Str()})})),
    "source": Table({
        "distribution": Str(), "version": Str(), "sdist": Str(), "sdist_sha256": Str(), "root": Str(),
        "env": Str(), "license": optional(Str()), "files": ListOf(ListOf(Str()), nonempty=True),
    }),
    "change": Table({"diff": Str(), "patched_sha256": Str()}),
    "emulate": Table({"capability": ListOf(Number()), "max_shared_memory_per_block_optin": Number(),
                      "multiprocessors": Number(), "source": Str()}),
    "generate": Table({"script": Str(), "args": _STRINGS, "outputs": ListOf(Str(), nonempty=True),
                       "imports": optional(_STRINGS)}),
    "compile": Table({
        "gencode": Str(), "sources": ListOf(Str(), nonempty=True), "flags": _STRINGS, "include_dirs": _STRINGS,
        "bindings": Str(), "namespace": Str(), "ops": ListOf(Str(), nonempty=True), "library": Str(),
    }),
}


@dataclass(frozen=True)
class Emulation:
    """The host values a T4 reports, compiled into the patched source as ``-D`` defines."""

    capability: tuple[int, int]
    max_shared_memory_per_block_optin: int
    multiprocessors: int
    source: str

    def defines(self) -> list[str]:
        """The -D flags the recipe's diff reads (without them the patched file behaves as stock)."""
        return [
            f"-DT4PATCH_EMULATED_CAPABILITY_MAJOR={self.capability[0]}",
            f"-DT4PATCH_EMULATED_CAPABILITY_MINOR={self.capability[1]}",
            f"-DT4PATCH_EMULATED_MAX_SHARED_MEM={self.max_shared_memory_per_block_optin}",
            f"-DT4PATCH_EMULATED_SMS={self.multiprocessors}",
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "capability": f"{self.capability[0]}.{self.capability[1]}",
            "max_shared_memory_per_block_optin": self.max_shared_memory_per_block_optin,
            "multiprocessors": self.multiprocessors,
            "source": self.source,
        }


@dataclass(frozen=True)
class ExtensionSpec:
    """Everything a torch-extension recipe says, checked."""

    recipe_sha256: str  # of recipe.toml's bytes
    distribution: str
    version: str
    sdist: str
    sdist_sha256: str
    sdist_env: str  # the environment variable naming the archive (or an unpacked tree)
    root: str
    files: tuple[tuple[str, str], ...]  # (path inside root, sha256)
    diff_path: Path
    diff_sha256: str
    patched_path: str
    patched_sha256: str
    emulation: Emulation
    generate_script: str
    generate_args: tuple[str, ...]
    generate_outputs: tuple[str, ...]
    generate_imports: tuple[str, ...]  # modules the generator needs in the build's interpreter (preflight checks)
    gencode: str
    sources: tuple[str, ...]
    flags: tuple[str, ...]
    include_dirs: tuple[str, ...]
    bindings: str
    namespace: str
    ops: tuple[str, ...]
    library: str

    @property
    def arch_digits(self) -> str:
        """The compute capability the PTX is for ("75")."""
        match = _PTX_ONLY.match(self.gencode)
        assert match is not None  # checked in parse_extension
        return match.group(1)

    def source_hash(self) -> str:
        """sha256 over every input byte of the build: the recipe, the diff, every pinned file.

        The pins stand for the files (reading the archive refuses any file that does not match its pin), so this
        needs no archive: a CPU-only check can tell whether a cached build still matches the recipe."""
        doc = {"recipe": self.recipe_sha256, "diff": self.diff_sha256, "files": [list(e) for e in self.files]}
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def _relative(fail: Any, value: str, what: str) -> str:
    parts = Path(value).parts
    if Path(value).is_absolute() or ".." in parts or not parts:
        raise fail(f"{what} {value!r} must be a relative path without '..'")
    return value


def _distinct(fail: Any, values: list[str], what: str) -> tuple[str, ...]:
    if len(set(values)) != len(values):
        raise fail(f"{what} lists an entry twice")
    return tuple(values)


def _hex64(fail: Any, value: str, what: str) -> str:
    if not _HEX64.match(value):
        raise fail(f"{what} must be 64 lowercase hex digits")
    return value


def parse_extension(doc: dict[str, Any], origin: Path, recipe_bytes: bytes, kind: DataKind) -> ExtensionSpec:
    """The semantic checks of a schema-checked torch-extension recipe; every problem names its key."""

    def fail(message: str) -> T4PatchError:
        return kind.fail(origin, message)

    src, change, emu, gen, comp = (doc[s] for s in ("source", "change", "emulate", "generate", "compile"))
    files: list[tuple[str, str]] = []
    for entry in src["files"]:
        if len(entry) != 2:
            raise fail(f"source.files entry {entry!r} is not a [path, sha256] pair")
        files.append((_relative(fail, entry[0], "source.files path"), _hex64(fail, entry[1], f"source.files {entry[0]}: sha256")))
    _distinct(fail, [f for f, _ in files], "source.files")
    pinned = {f for f, _ in files}
    if not _ENV_NAME.match(src["env"]):
        raise fail(f"source.env {src['env']!r} is not an environment variable name")

    diff_name = _relative(fail, change["diff"], "change.diff")
    diff_path = origin.parent / diff_name
    if not diff_path.is_file():
        raise fail(f"change.diff {diff_name} does not exist beside the recipe")
    from t4patch.patching.unified_diff import parse_diff

    try:
        file_diffs = parse_diff(diff_path.read_text(encoding="utf-8"))
    except (ValueError, OSError, UnicodeDecodeError) as exc:
        raise fail(f"change.diff {diff_name}: {exc}") from exc
    if len(file_diffs) != 1 or file_diffs[0].path not in pinned:
        raise fail(f"change.diff {diff_name} must change exactly one file listed in source.files")

    cap = emu["capability"]
    if not (len(cap) == 2 and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in cap)):
        raise fail("emulate.capability must be [major, minor]")
    for key in ("max_shared_memory_per_block_optin", "multiprocessors"):
        value = emu[key]
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise fail(f"emulate.{key} must be a positive integer")
    emulation = Emulation((cap[0], cap[1]), emu["max_shared_memory_per_block_optin"], emu["multiprocessors"], emu["source"])

    script = _relative(fail, gen["script"], "generate.script")
    if script not in pinned:
        raise fail(f"generate.script {script} is not pinned in source.files")
    outputs = _distinct(fail, gen["outputs"], "generate.outputs")
    if not _PTX_ONLY.match(comp["gencode"]):
        raise fail(f"compile.gencode {comp['gencode']!r} must be PTX only: arch=compute_NN,code=compute_NN")
    generated_dir = str(Path(script).parent)
    sources = _distinct(fail, comp["sources"], "compile.sources")
    for source in sources:
        _relative(fail, source, "compile.sources entry")
        if source not in pinned and not (str(Path(source).parent) == generated_dir and Path(source).name in outputs):
            raise fail(f"compile.sources {source} is neither pinned nor a generator output")
    bindings = _relative(fail, comp["bindings"], "compile.bindings")
    if bindings not in pinned:
        raise fail(f"compile.bindings {bindings} is not pinned in source.files")
    ops = _distinct(fail, comp["ops"], "compile.ops")
    for name in (comp["namespace"], *ops):
        if not _C_NAME.match(name):
            raise fail(f"{name!r} is not a C identifier")
    library = comp["library"]
    if "/" in library or not library.endswith(".so"):
        raise fail("compile.library must be a file name ending in .so")
    return ExtensionSpec(
        recipe_sha256=sha256_bytes(recipe_bytes),
        distribution=src["distribution"],
        version=src["version"],
        sdist=src["sdist"],
        sdist_sha256=_hex64(fail, src["sdist_sha256"], "source.sdist_sha256"),
        sdist_env=src["env"],
        root=_relative(fail, src["root"], "source.root"),
        files=tuple(files),
        diff_path=diff_path,
        diff_sha256=sha256_file(diff_path),
        patched_path=file_diffs[0].path,
        patched_sha256=_hex64(fail, change["patched_sha256"], "change.patched_sha256"),
        emulation=emulation,
        generate_script=script,
        generate_args=tuple(gen["args"]),
        generate_outputs=outputs,
        generate_imports=tuple(gen.get("imports", ())),
        gencode=comp["gencode"],
        sources=sources,
        flags=tuple(comp["flags"]),
        include_dirs=tuple(_relative(fail, d, "compile.include_dirs entry") for d in comp["include_dirs"]),
        bindings=bindings,
        namespace=comp["namespace"],
        ops=ops,
        library=library,
    )


# --------------------------------------------------------------------------------------------- toolchain


@dataclass(frozen=True)
class Toolchain:
    """What the build compiles and links against; None where it was not found (preflight then says so)."""

    nvcc: str | None
    nvcc_version: str | None  # "13.0.88"
    torch_version: str | None
    torch_include: Path | None  # has torch/csrc/stable/library.h
    torch_libraries: tuple[Path, ...]  # libtorch*.so the library must name (NEEDED) to find the stable C ABI
    cublas_include: Path | None
    python: str  # the interpreter that runs the generator and later loads the library
    python_abi: str
    generator_modules: tuple[str, ...] = ()  # modules the generator imports that this interpreter lacks

    def to_json(self) -> dict[str, Any]:
        return {
            "nvcc": self.nvcc,
            "nvcc_version": self.nvcc_version,
            "torch": self.torch_version,
            "torch_include": str(self.torch_include) if self.torch_include else None,
            "torch_libraries": [str(p) for p in self.torch_libraries],
            "cublas_include": str(self.cublas_include) if self.cublas_include else None,
            "python": self.python,
            "python_abi": self.python_abi,
        }


def torch_location() -> tuple[str | None, Path | None]:
    """torch's version and its include directory (with the stable-ABI headers), without importing torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return None, None
    include = Path(spec.origin).parent / "include"
    from importlib.metadata import PackageNotFoundError, version

    try:
        torch_version: str | None = version("torch")
    except PackageNotFoundError:
        torch_version = None
    return torch_version, include if (include / "torch" / "csrc" / "stable" / "library.h").is_file() else None


def cublas_candidates(nvcc: str | None, toolkit_roots: tuple[Path, ...] = ()) -> list[Path]:
    """Where <cublas_v2.h> may be: $T4PATCH_CUBLAS_INCLUDE, the CUDA toolkit roots (the preflight's, which see
    through an nvcc wrapper script), the toolkit beside nvcc, the nvidia-cublas wheels."""
    candidates: list[Path] = []
    if os.environ.get(CUBLAS_INCLUDE_ENV):
        candidates.append(Path(os.environ[CUBLAS_INCLUDE_ENV]).expanduser())
    roots = list(toolkit_roots) + ([Path(nvcc).resolve().parent.parent] if nvcc else [])
    for root in dict.fromkeys(roots):
        candidates += [root / "include", root / "targets" / "x86_64-linux" / "include",
                       root / "targets" / "sbsa-linux" / "include"]
    sites = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *sys.path])
    for site in sites:
        if site:
            candidates += [Path(site) / "nvidia" / "cu13" / "include", Path(site) / "nvidia" / "cublas" / "include"]
    return candidates


def detect_toolchain(nvcc: str | None, nvcc_version: str | None, generator_imports: tuple[str, ...] = (),
                     toolkit_roots: tuple[Path, ...] = ()) -> Toolchain:
    """The toolchain of this interpreter (the library is loaded into it), found without raising."""
    torch_version, include = torch_location()
    libraries: tuple[Path, ...] = ()
    if include is not None:
        # torch loads libtorch_cpu.so as a dependency of an RTLD_LOCAL extension, so its symbols are not global:
        # the library must name them itself (libtorch_cuda only in CUDA builds of torch)
        libraries = tuple(p for p in (include.parent / "lib" / f"lib{n}.so" for n in ("torch", "torch_cpu", "torch_cuda"))
                          if p.is_file())
    cublas = next((c for c in cublas_candidates(nvcc, toolkit_roots) if (c / "cublas_v2.h").is_file()), None)
    missing = tuple(m for m in generator_imports if importlib.util.find_spec(m) is None)
    return Toolchain(nvcc, nvcc_version, torch_version, include, libraries, cublas, sys.executable,
                     sysconfig.get_config_var("SOABI") or "", missing)


def cache_key(spec: ExtensionSpec, toolchain: Toolchain) -> str:
    """The build's identity: its inputs (source hash) and what compiles and loads them."""
    doc = {"source": spec.source_hash(), "nvcc": toolchain.nvcc_version, "torch": toolchain.torch_version,
           "abi": toolchain.python_abi, "builder": BUILDER_VERSION}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


# --------------------------------------------------------------------------------------------- the tree


_DEF_CALL = re.compile(r"\bops\.def\(\s*((?:\"(?:[^\"\\]|\\.)*\"\s*)+)\)", re.S)
_LITERAL = re.compile(r"\"((?:[^\"\\]|\\.)*)\"")


def op_schemas(bindings: str, ops: tuple[str, ...], origin: str = "the bindings file") -> dict[str, str]:
    """The schema string of each op, read from ``ops.def("...")`` calls (adjacent literals joined)."""
    found: dict[str, list[str]] = {op: [] for op in ops}
    for call in _DEF_CALL.finditer(bindings):
        schema = "".join(_LITERAL.findall(call.group(1)))
        name = schema.split("(", 1)[0].strip()
        if name in found:
            found[name].append(schema)
    for op, schemas in found.items():
        if len(schemas) != 1:
            raise BuildError(f"{origin}: expected one ops.def for {op}, found {len(schemas)}",
                             hint="the recipe pins this file; report this as a t4patch bug")
    return {op: schemas[0] for op, schemas in found.items()}


def registration_source(spec: ExtensionSpec, schemas: dict[str, str]) -> str:
    lines = [
        f"// Generated by t4patch from {spec.distribution} {spec.version} {spec.bindings}.",
        "// The schemas are the archive's, verbatim; _C is defined to the recipe's namespace on the command line.",
        "#include <torch/csrc/stable/library.h>",
        "",
        "STABLE_TORCH_LIBRARY(_C, ops) {",
    ]
    lines += [f"  ops.def({json.dumps(schemas[op])});" for op in spec.ops]
    lines += ["}", ""]
    return "\n".join(lines)


def patched_source(spec: ExtensionSpec, sources: dict[str, bytes]) -> bytes:
    """The one changed file: the recipe's diff applied exactly (no fuzz, no offset), its sha256 checked."""
    from t4patch.patching.unified_diff import DiffMismatch, apply_file_diff, parse_diff

    (file_diff,) = parse_diff(spec.diff_path.read_text(encoding="utf-8"))
    try:
        patched = apply_file_diff(sources[file_diff.path], file_diff)
    except DiffMismatch as exc:
        raise BuildError(f"{spec.diff_path.name} does not apply to {file_diff.path}: {exc}",
                         hint="the recipe pins this file; report this as a t4patch bug") from exc
    if sha256_bytes(patched) != spec.patched_sha256:
        raise BuildError(
            f"{file_diff.path} after {spec.diff_path.name} hashes to {sha256_bytes(patched)}, expected {spec.patched_sha256}",
            hint="the recipe's change.patched_sha256 and its diff disagree; report this as a t4patch bug",
        )
    return patched


def write_tree(spec: ExtensionSpec, sources: dict[str, bytes], tree: Path) -> None:
    """The pinned files under ``tree``, the change applied."""
    patched = patched_source(spec, sources)
    for rel, data in sources.items():
        target = tree / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(patched if rel == spec.patched_path else data)


def generated_files(spec: ExtensionSpec, tree: Path) -> dict[str, str]:
    """sha256 of each generator output; BuildError when the generator wrote other files than the recipe says."""
    out_dir = (tree / spec.generate_script).parent
    produced = sorted(p.name for p in out_dir.iterdir() if p.name.endswith("kernel_selector.h") or "_kernel_" in p.name)
    expected = sorted(spec.generate_outputs)
    if produced != expected:
        raise BuildError(f"{Path(spec.generate_script).name} {' '.join(spec.generate_args)} wrote {produced}, "
                         f"the recipe expects {expected}", hint="the recipe pins the generator; report this as a t4patch bug")
    return {name: sha256_file(out_dir / name) for name in expected}


def generate_command(spec: ExtensionSpec, toolchain: Toolchain, tree: Path) -> tuple[tuple[str, ...], Path]:
    """(argv, cwd) of the archive's generator, writing into its own directory."""
    script = tree / spec.generate_script
    return (toolchain.python, str(script), *spec.generate_args, str(script.parent)), script.parent


def compile_flags(spec: ExtensionSpec) -> list[str]:
    """The recipe's flags, the namespace and the emulated host values (what every source is compiled with)."""
    return [*spec.flags, f"-D_C={spec.namespace}", *spec.emulation.defines()]


def compile_commands(spec: ExtensionSpec, toolchain: Toolchain, tree: Path, objects: Path) -> list[tuple[str, tuple[str, ...]]]:
    """(source, argv) of every compile; the registration file last."""
    common = [
        *compile_flags(spec),
        *(f"-I{tree / d}" for d in spec.include_dirs),
        f"-I{toolchain.torch_include or '<torch include: not found>'}",
        f"-I{toolchain.cublas_include or '<cublas include: not found>'}",
    ]
    nvcc = toolchain.nvcc or "nvcc"
    return [(source, (nvcc, "-c", str(tree / source), "-o", str(objects / (Path(source).name + ".o")),
                      "-gencode", spec.gencode, *common))
            for source in (*spec.sources, REGISTRATION)]


def link_command(spec: ExtensionSpec, toolchain: Toolchain, objects: list[Path], out: Path) -> tuple[str, ...]:
    # -nodlink: no device-link step. Without it nvcc adds a device-link stub compiled for its default
    # architecture (sm_75 SASS with nvcc 13), and the library would no longer be PTX-only.
    # libtorch*: named without an rpath (they are loaded by torch before this library, found by soname)
    libs = [arg for lib in toolchain.torch_libraries for arg in (f"-L{lib.parent}", f"-l{lib.name[3:-3]}")]
    return (toolchain.nvcc or "nvcc", "-shared", "-nodlink", "-cudart", "shared", "-o", str(out), *map(str, objects), *libs)
