"""vLLM 0.33.0's Marlin, built from its sdist as PTX for compute_75 only, so any newer GPU runs the Turing code.

The recipe is data (``recipes/vllm-marlin-sm75/recipe.toml``): the sdist's sha256, the sha256 of
every source file the build reads, the one source change (an exact unified diff adding ``#ifdef``-guarded
overrides after marlin.cu's three device queries), the emulated T4 values, the generator call and the nvcc
flags. This module

1. reads the pinned files from the sdist archive (or an unpacked tree) and refuses any other bytes;
2. computes the **source hash** (the recipe, the diff and every pinned file) and, with the toolchain (nvcc
   version, torch version, Python ABI), the cache key;
3. on a cache miss: writes the tree, applies the diff exactly, runs vLLM's ``generate_kernels.py 7.5``,
   writes a registration file with the op schemas read from vLLM's own ``torch_bindings.cpp``, compiles
   every source with nvcc in parallel (progress on stderr, full log kept), links a shared library, and reads
   its fatbin back: it must hold PTX for compute_75 and no SASS at all;
4. loads it into torch (``torch.ops.load_library``) under its own op namespace.

Heavy imports (torch) happen only in :func:`load_ops`. ``python -m t4patch.engines.vllm.marlin_sm75 build``
builds (or finds) the library ahead of a run; ``... hash`` prints the source hash without building.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from t4patch.data.locations import data_dir
from t4patch.data.reader import DataKind, ListOf, Number, Str, Table, check, optional
from t4patch.data.tomlcompat import tomllib
from t4patch.errors import (
    BuildError,
    DataFileError,
    ForeignFileError,
    MissingDependencyError,
    ToolMissingError,
    VerificationError,
)
from t4patch.fileio.hashing import sha256_bytes, sha256_file

RECIPE_NAME = "vllm-marlin-sm75"
SDIST_ENV = "T4PATCH_VLLM_SDIST"
CUBLAS_INCLUDE_ENV = "T4PATCH_CUBLAS_INCLUDE"
BUILD_RECORD = "build.json"
RECORD_SCHEMA = 1
# Bumped whenever this module changes how it compiles or links (part of the cache key, with the source hash).
BUILDER_VERSION = 2
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_OP_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def recipe_dir() -> Path:
    return data_dir("recipes") / RECIPE_NAME


@dataclass(frozen=True)
class Emulation:
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
class Recipe:
    path: Path
    sha256: str  # of recipe.toml's bytes
    distribution: str
    version: str
    sdist: str
    sdist_sha256: str
    root: str
    files: tuple[tuple[str, str], ...]  # (path inside root, sha256)
    diff_path: Path
    diff_sha256: str
    patched_path: str  # the file the diff changes
    patched_sha256: str
    emulation: Emulation
    generate_script: str
    generate_args: tuple[str, ...]
    generate_outputs: tuple[str, ...]
    gencode: str
    sources: tuple[str, ...]
    flags: tuple[str, ...]
    include_dirs: tuple[str, ...]
    namespace: str
    ops: tuple[str, ...]
    library: str


EXT_RECIPE = DataKind(
    label="extension build recipe",
    error=DataFileError,
)
# The file's shape, stated once (unknown keys, wrong types and missing keys are refused by the strict reader);
# the semantic checks follow in parse_recipe.
RECIPE_SCHEMA = Table({
    "schema": Number(),
    "name": Str(),
    "source": Table({
        "distribution": Str(), "version": Str(), "sdist": Str(), "sdist_sha256": Str(), "root": Str(),
        "license": optional(Str()), "files": ListOf(ListOf(Str()), nonempty=True),
    }),
    "change": Table({"diff": Str(), "patched_sha256": Str()}),
    "emulate": Table({"capability": ListOf(Number()), "max_shared_memory_per_block_optin": Number(),
                      "multiprocessors": Number(), "source": Str()}),
    "generate": Table({"script": Str(), "args": ListOf(Str()), "outputs": ListOf(Str(), nonempty=True)}),
    "compile": Table({
        "gencode": Str(), "sources": ListOf(Str(), nonempty=True), "flags": ListOf(Str()),
        "include_dirs": ListOf(Str()), "namespace": Str(), "ops": ListOf(Str(), nonempty=True), "library": Str(),
    }),
})


def _fail(path: Path, message: str) -> DataFileError:
    return EXT_RECIPE.fail(path, message)  # type: ignore[return-value]


def _strings(table: dict[str, Any], key: str, path: Path, where: str) -> tuple[str, ...]:
    value = table.get(key)
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise _fail(path, f"{where}.{key} must be a non-empty list of strings")
    if len(set(value)) != len(value):
        raise _fail(path, f"{where}.{key} lists an entry twice")
    return tuple(value)


def _string(table: dict[str, Any], key: str, path: Path, where: str) -> str:
    value = table.get(key)
    if not isinstance(value, str) or not value:
        raise _fail(path, f"{where}.{key} must be a non-empty string")
    return value


def _relative(value: str, path: Path, what: str) -> str:
    parts = Path(value).parts
    if Path(value).is_absolute() or ".." in parts or not parts:
        raise _fail(path, f"{what} {value!r} must be a relative path without '..'")
    return value


def parse_recipe(data: bytes, path: Path) -> Recipe:
    """Validate the recipe strictly; every problem is a DataFileError naming the key."""
    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise _fail(path, str(exc)) from exc
    check(doc, RECIPE_SCHEMA, EXT_RECIPE, path, version=1)
    if doc.get("name") != RECIPE_NAME:
        raise _fail(path, f"expected name = {RECIPE_NAME!r}, found {doc.get('name')!r}")
    for section in ("source", "change", "emulate", "generate", "compile"):
        if not isinstance(doc.get(section), dict):
            raise _fail(path, f"missing [{section}] table")
    src, change, emu, gen, comp = (doc[s] for s in ("source", "change", "emulate", "generate", "compile"))

    sdist_sha = _string(src, "sdist_sha256", path, "source")
    if not _HEX64.match(sdist_sha):
        raise _fail(path, "source.sdist_sha256 must be 64 lowercase hex digits")
    files_raw = src.get("files")
    if not isinstance(files_raw, list) or not files_raw:
        raise _fail(path, "source.files must be a non-empty list of [path, sha256] pairs")
    files: list[tuple[str, str]] = []
    for entry in files_raw:
        if not (isinstance(entry, list) and len(entry) == 2 and all(isinstance(x, str) for x in entry)):
            raise _fail(path, f"source.files entry {entry!r} is not a [path, sha256] pair")
        if not _HEX64.match(entry[1]):
            raise _fail(path, f"source.files {entry[0]}: sha256 must be 64 lowercase hex digits")
        files.append((_relative(entry[0], path, "source.files path"), entry[1]))
    if len({f for f, _ in files}) != len(files):
        raise _fail(path, "source.files lists a path twice")
    pinned = {f for f, _ in files}

    diff_name = _string(change, "diff", path, "change")
    diff_path = path.parent / _relative(diff_name, path, "change.diff")
    if not diff_path.is_file():
        raise _fail(path, f"change.diff {diff_name} does not exist beside the recipe")
    patched_sha = _string(change, "patched_sha256", path, "change")
    if not _HEX64.match(patched_sha):
        raise _fail(path, "change.patched_sha256 must be 64 lowercase hex digits")
    from t4patch.patching.unified_diff import parse_diff

    try:
        file_diffs = parse_diff(diff_path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise _fail(path, f"change.diff {diff_name}: {exc}") from exc
    if len(file_diffs) != 1 or file_diffs[0].path not in pinned:
        raise _fail(path, f"change.diff {diff_name} must change exactly one file listed in source.files")

    cap = emu.get("capability")
    if not (isinstance(cap, list) and len(cap) == 2 and all(isinstance(x, int) and x >= 0 for x in cap)):
        raise _fail(path, "emulate.capability must be [major, minor]")
    smem, sms = emu.get("max_shared_memory_per_block_optin"), emu.get("multiprocessors")
    for key, value in (("max_shared_memory_per_block_optin", smem), ("multiprocessors", sms)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise _fail(path, f"emulate.{key} must be a positive integer")
    emulation = Emulation((cap[0], cap[1]), smem, sms, _string(emu, "source", path, "emulate"))

    script = _relative(_string(gen, "script", path, "generate"), path, "generate.script")
    if script not in pinned:
        raise _fail(path, f"generate.script {script} is not pinned in source.files")
    outputs = _strings(gen, "outputs", path, "generate")
    gencode = _string(comp, "gencode", path, "compile")
    if not re.fullmatch(r"arch=compute_(\d+),code=compute_\1", gencode):
        raise _fail(path, f"compile.gencode {gencode!r} must be PTX only: arch=compute_NN,code=compute_NN")
    generated_dir = str(Path(script).parent)
    sources = _strings(comp, "sources", path, "compile")
    for source in sources:
        _relative(source, path, "compile.sources entry")
        if source not in pinned and not (
            str(Path(source).parent) == generated_dir and Path(source).name in outputs
        ):
            raise _fail(path, f"compile.sources {source} is neither pinned nor a generator output")
    namespace = _string(comp, "namespace", path, "compile")
    ops = _strings(comp, "ops", path, "compile")
    for name in (namespace, *ops):
        if not _OP_NAME.match(name):
            raise _fail(path, f"{name!r} is not a C identifier")
    library = _string(comp, "library", path, "compile")
    if "/" in library or not library.endswith(".so"):
        raise _fail(path, "compile.library must be a file name ending in .so")
    return Recipe(
        path=path,
        sha256=sha256_bytes(data),
        distribution=_string(src, "distribution", path, "source"),
        version=_string(src, "version", path, "source"),
        sdist=_string(src, "sdist", path, "source"),
        sdist_sha256=sdist_sha,
        root=_relative(_string(src, "root", path, "source"), path, "source.root"),
        files=tuple(files),
        diff_path=diff_path,
        diff_sha256=sha256_file(diff_path),
        patched_path=file_diffs[0].path,
        patched_sha256=patched_sha,
        emulation=emulation,
        generate_script=script,
        generate_args=_strings(gen, "args", path, "generate"),
        generate_outputs=outputs,
        gencode=gencode,
        sources=sources,
        flags=_strings(comp, "flags", path, "compile"),
        include_dirs=tuple(_relative(d, path, "compile.include_dirs entry") for d in _strings(comp, "include_dirs", path, "compile")),
        namespace=namespace,
        ops=ops,
        library=library,
    )


def load_recipe(path: Path | None = None) -> Recipe:
    path = path or recipe_dir() / "recipe.toml"
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise _fail(path, f"expected the recipe file, found none ({exc})") from exc
    return parse_recipe(data, path)


# --------------------------------------------------------------------------------------------- sources


def default_sdist(recipe: Recipe) -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    return Path(base) / "t4patch" / "sdists" / recipe.sdist


def _sdist_hint(recipe: Recipe) -> str:
    return (
        f"put {recipe.sdist} (sha256 {recipe.sdist_sha256[:12]}...) in {default_sdist(recipe).parent}/ or set "
        f"{SDIST_ENV}=PATH (pip download --no-deps --no-binary :all: {recipe.distribution}=={recipe.version}; "
        "keep the archive from pip's unpack step, docs/verification/marlin-sm75-emulated-2026-12-01.md)"
    )


def locate_sdist(recipe: Recipe, explicit: str | Path | None = None) -> Path:
    """The sdist archive or unpacked tree: ``explicit``, else $T4PATCH_VLLM_SDIST, else the t4patch cache."""
    given = explicit or os.environ.get(SDIST_ENV)
    path = Path(given).expanduser() if given else default_sdist(recipe)
    if not path.exists():
        raise MissingDependencyError(f"expected the {recipe.distribution} {recipe.version} sdist at {path}, found nothing", hint=_sdist_hint(recipe))
    return path


def read_sources(recipe: Recipe, sdist: Path) -> tuple[dict[str, bytes], dict[str, Any]]:
    """The pinned files' bytes, from the archive (its sha256 checked first) or an unpacked tree.

    Every file must hash to its pin: a different vLLM, an edited tree or a damaged download is refused
    (ForeignFileError) before anything is built.
    """
    wanted = dict(recipe.files)
    found: dict[str, bytes] = {}
    origin: dict[str, Any] = {"path": str(sdist)}
    if sdist.is_dir():
        root = sdist / recipe.root if (sdist / recipe.root).is_dir() else sdist
        origin.update(kind="directory", root=str(root), sdist_sha256=None)
        for rel in wanted:
            try:
                found[rel] = (root / rel).read_bytes()
            except OSError:
                pass
    else:
        digest = sha256_file(sdist)
        origin.update(kind="archive", sdist_sha256=digest)
        if digest != recipe.sdist_sha256:
            raise ForeignFileError(
                f"{sdist} hashes to {digest}, expected the {recipe.sdist} of the recipe ({recipe.sdist_sha256})",
                hint=_sdist_hint(recipe),
            )
        names = {f"{recipe.root}/{rel}": rel for rel in wanted}
        try:
            with tarfile.open(sdist, "r:*") as archive:
                for member in archive:
                    found_rel = names.get(member.name)
                    if found_rel is None or not member.isfile():
                        continue
                    handle = archive.extractfile(member)
                    if handle is not None:
                        found[found_rel] = handle.read()
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise ForeignFileError(f"{sdist}: not a readable sdist archive ({exc})", hint=_sdist_hint(recipe)) from exc
    missing = sorted(set(wanted) - set(found))
    if missing:
        raise ForeignFileError(
            f"{sdist}: {len(missing)} pinned file(s) missing, first {missing[0]}", hint=_sdist_hint(recipe)
        )
    for rel, expected in wanted.items():
        actual = sha256_bytes(found[rel])
        if actual != expected:
            raise ForeignFileError(
                f"{sdist}: {rel} hashes to {actual}, expected {expected} ({recipe.distribution} {recipe.version})",
                hint=_sdist_hint(recipe),
            )
    return found, origin


def source_hash(recipe: Recipe) -> str:
    """sha256 over everything the build's input bytes are made of: the recipe, the diff, every pinned file.

    The pinned hashes stand for the files (read_sources refuses any file that does not match its pin), so
    this needs no sdist: a CPU-only check can tell whether a cached build still matches the recipe.
    """
    doc = {
        "recipe": recipe.sha256,
        "diff": recipe.diff_sha256,
        "files": [list(entry) for entry in recipe.files],
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


# --------------------------------------------------------------------------------------------- toolchain


@dataclass(frozen=True)
class Toolchain:
    nvcc: Path
    nvcc_version: str  # the "release X.Y, VX.Y.Z" line
    torch_version: str
    torch_include: Path
    torch_libraries: tuple[Path, ...]  # libtorch*.so the library must name (NEEDED) to find the stable C ABI
    cublas_include: Path
    python: str  # the interpreter that runs the generator
    python_abi: str

    def to_json(self) -> dict[str, Any]:
        return {
            "nvcc": str(self.nvcc),
            "nvcc_version": self.nvcc_version,
            "torch": self.torch_version,
            "torch_include": str(self.torch_include),
            "torch_libraries": [str(p) for p in self.torch_libraries],
            "cublas_include": str(self.cublas_include),
            "python": self.python,
            "python_abi": self.python_abi,
        }


def _find_nvcc() -> Path:
    found = shutil.which("nvcc")
    if not found:
        cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
        candidate = Path(cuda_home) / "bin" / "nvcc" if cuda_home else Path("/usr/local/cuda/bin/nvcc")
        if candidate.is_file():
            found = str(candidate)
    if not found:
        raise ToolMissingError("building vLLM's Marlin for sm_75 needs nvcc, found none on PATH or in CUDA_HOME", hint="install the CUDA toolkit (>= 12) and put its bin/ on PATH")
    return Path(found)


def _nvcc_version(nvcc: Path) -> str:
    try:
        proc = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=60, check=False)
    except OSError as exc:
        raise ToolMissingError(f"{nvcc} could not run ({exc})", hint="reinstall the CUDA toolkit") from exc
    line = next((ln for ln in proc.stdout.splitlines() if "release" in ln), "")
    if proc.returncode != 0 or not line:
        raise ToolMissingError(f"{nvcc} --version printed no release line", hint="reinstall the CUDA toolkit")
    return line.split(",", 1)[1].strip() if "," in line else line.strip()


def _torch_location() -> tuple[str, Path]:
    """torch's version and include directory, without importing torch (its lib/ sits beside include/)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        raise MissingDependencyError(f"building the extension needs torch's headers; torch is not importable from {sys.executable}", hint="run it with the interpreter that has torch")
    include = Path(spec.origin).parent / "include"
    if not (include / "torch" / "csrc" / "stable" / "library.h").is_file():
        raise MissingDependencyError(f"torch at {include.parent} has no stable-ABI headers (torch/csrc/stable/library.h)", hint="torch >= 2.10 is needed")
    from importlib.metadata import PackageNotFoundError, version

    try:
        torch_version = version("torch")
    except PackageNotFoundError:
        torch_version = "unknown"
    return torch_version, include


def _cublas_include(nvcc: Path) -> Path:
    """vLLM's torch_utils.h includes <cublas_v2.h>: the CUDA toolkit's, or the nvidia-cublas wheel's."""
    candidates: list[Path] = []
    if os.environ.get(CUBLAS_INCLUDE_ENV):
        candidates.append(Path(os.environ[CUBLAS_INCLUDE_ENV]).expanduser())
    cuda_root = nvcc.resolve().parent.parent
    candidates += [cuda_root / "include", cuda_root / "targets" / "x86_64-linux" / "include"]
    for site in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *sys.path}:
        if site:
            candidates += [Path(site) / "nvidia" / "cu13" / "include", Path(site) / "nvidia" / "cublas" / "include"]
    for candidate in candidates:
        if (candidate / "cublas_v2.h").is_file():
            return candidate
    raise ToolMissingError(
        "vLLM's torch_utils.h includes <cublas_v2.h>; found it in none of " + ", ".join(str(c) for c in candidates[:4]),
        hint=f"install the CUDA toolkit's cuBLAS headers or pip install nvidia-cublas, or set {CUBLAS_INCLUDE_ENV}=DIR",
    )


def detect_toolchain() -> Toolchain:
    nvcc = _find_nvcc()
    torch_version, include = _torch_location()
    # torch loads libtorch_cpu.so as a dependency of an RTLD_LOCAL extension, so its symbols are not global:
    # the library must name them itself, as vLLM's _C_stable_libtorch does (libtorch_cuda only in CUDA builds)
    libraries = tuple(p for p in (include.parent / "lib" / f"lib{n}.so" for n in ("torch", "torch_cpu", "torch_cuda")) if p.is_file())
    if not any(p.name == "libtorch_cpu.so" for p in libraries):
        raise MissingDependencyError(f"torch at {include.parent} has no lib/libtorch_cpu.so to link against", hint="reinstall torch")
    return Toolchain(
        nvcc=nvcc,
        nvcc_version=_nvcc_version(nvcc),
        torch_version=torch_version,
        torch_include=include,
        torch_libraries=libraries,
        cublas_include=_cublas_include(nvcc),
        python=sys.executable,
        python_abi=sysconfig.get_config_var("SOABI") or "",
    )


def cache_key(recipe: Recipe, toolchain: Toolchain) -> str:
    doc = {
        "source": source_hash(recipe),
        "nvcc": toolchain.nvcc_version,
        "torch": toolchain.torch_version,
        "abi": toolchain.python_abi,
        "builder": BUILDER_VERSION,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    return Path(base) / "t4patch" / "extensions" / RECIPE_NAME


# --------------------------------------------------------------------------------------------- the tree


_DEF_CALL = re.compile(r"\bops\.def\(\s*((?:\"(?:[^\"\\]|\\.)*\"\s*)+)\)", re.S)
_LITERAL = re.compile(r"\"((?:[^\"\\]|\\.)*)\"")


def op_schemas(bindings: str, ops: tuple[str, ...]) -> dict[str, str]:
    """The schema string of each op, read from vLLM's ``ops.def("...")`` calls (adjacent literals joined)."""
    found: dict[str, list[str]] = {op: [] for op in ops}
    for call in _DEF_CALL.finditer(bindings):
        schema = "".join(_LITERAL.findall(call.group(1)))
        name = schema.split("(", 1)[0].strip()
        if name in found:
            found[name].append(schema)
    for op, schemas in found.items():
        if len(schemas) != 1:
            raise BuildError(f"csrc/torch_bindings.cpp: expected one ops.def for {op}, found {len(schemas)}", hint="the recipe pins this file; report this as a t4patch bug")
    return {op: schemas[0] for op, schemas in found.items()}


def registration_source(recipe: Recipe, schemas: dict[str, str]) -> str:
    lines = [
        f"// Generated by t4patch ({RECIPE_NAME}) from {recipe.distribution} {recipe.version} csrc/torch_bindings.cpp.",
        "// The schemas are vLLM's, verbatim; _C is defined to the recipe's namespace on the command line.",
        "#include <torch/csrc/stable/library.h>",
        "",
        "STABLE_TORCH_LIBRARY(_C, ops) {",
    ]
    for op in recipe.ops:
        lines.append(f"  ops.def({json.dumps(schemas[op])});")
    lines += ["}", ""]
    return "\n".join(lines)


def prepare_tree(recipe: Recipe, sources: dict[str, bytes], tree: Path, toolchain_python: str, log: Callable[[str], None]) -> dict[str, Any]:
    """Write the pinned files, apply the change exactly, generate the kernels; return what was done."""
    from t4patch.patching.unified_diff import DiffMismatch, apply_file_diff, parse_diff

    for rel, data in sources.items():
        target = tree / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    (file_diff,) = parse_diff(recipe.diff_path.read_text(encoding="utf-8"))
    try:
        patched = apply_file_diff(sources[file_diff.path], file_diff)
    except DiffMismatch as exc:
        raise BuildError(f"{recipe.diff_path.name} does not apply to {file_diff.path}: {exc}", hint="the recipe pins this file; report this as a t4patch bug") from exc
    if sha256_bytes(patched) != recipe.patched_sha256:
        raise BuildError(
            f"{file_diff.path} after {recipe.diff_path.name} hashes to {sha256_bytes(patched)}, expected {recipe.patched_sha256}",
            hint="the recipe's change.patched_sha256 and its diff disagree; report this as a t4patch bug",
        )
    (tree / file_diff.path).write_bytes(patched)
    log(f"applied {recipe.diff_path.name} to {file_diff.path} (sha256 {recipe.patched_sha256[:12]})")

    script = tree / recipe.generate_script
    out_dir = script.parent
    cmd = [toolchain_python, str(script), *recipe.generate_args, str(out_dir)]
    proc = subprocess.run(cmd, cwd=out_dir, capture_output=True, text=True, check=False)
    log("$ " + " ".join(cmd) + "\n" + proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
        if "jinja2" in (proc.stderr or ""):
            raise MissingDependencyError(f"vLLM's generate_kernels.py needs jinja2 in {toolchain_python}", hint=f"{toolchain_python} -m pip install jinja2")
        raise BuildError(f"generate_kernels.py {' '.join(recipe.generate_args)} failed (exit {proc.returncode}): {tail[0]}", hint="see the build log")
    produced = sorted(p.name for p in out_dir.iterdir() if p.name.endswith("kernel_selector.h") or "_kernel_" in p.name)
    expected = sorted(recipe.generate_outputs)
    if produced != expected:
        raise BuildError(
            f"generate_kernels.py {' '.join(recipe.generate_args)} wrote {produced}, the recipe expects {expected}",
            hint="the recipe pins the generator; report this as a t4patch bug",
        )
    schemas = op_schemas(sources["csrc/torch_bindings.cpp"].decode("utf-8"), recipe.ops)
    (tree / "t4patch_registration.cpp").write_text(registration_source(recipe, schemas), encoding="utf-8")
    generated = {name: sha256_file(out_dir / name) for name in expected}
    return {"patched": {"path": file_diff.path, "sha256": recipe.patched_sha256}, "generated": generated, "schemas": schemas}


def compile_commands(recipe: Recipe, toolchain: Toolchain, tree: Path, objects: Path) -> list[tuple[str, list[str]]]:
    """(label, argv) of every compile; the registration file last."""
    common = [
        *recipe.flags,
        f"-D_C={recipe.namespace}",
        *recipe.emulation.defines(),
        *(f"-I{tree / d}" for d in recipe.include_dirs),
        f"-I{toolchain.torch_include}",
        f"-I{toolchain.cublas_include}",
    ]
    commands = []
    for source in (*recipe.sources, "t4patch_registration.cpp"):
        out = objects / (Path(source).name + ".o")
        argv = [str(toolchain.nvcc), "-c", str(tree / source), "-o", str(out), "-gencode", recipe.gencode, *common]
        commands.append((source, argv))
    return commands


def link_command(recipe: Recipe, toolchain: Toolchain, objects: list[Path], out: Path) -> list[str]:
    # -nodlink: no device-link step. Without it nvcc adds a device-link stub compiled for its default
    # architecture (sm_75 SASS with nvcc 13), and the library would no longer be PTX-only.
    # libtorch*: named without an rpath (they are loaded by torch before this library, found by soname)
    libs = [arg for lib in toolchain.torch_libraries for arg in (f"-L{lib.parent}", f"-l{lib.name[3:-3]}")]
    return [str(toolchain.nvcc), "-shared", "-nodlink", "-cudart", "shared", "-o", str(out), *map(str, objects), *libs]


def check_library(recipe: Recipe, library: Path) -> dict[str, Any]:
    """The built library must carry PTX for the recipe's arch and no SASS (so every GPU JIT-compiles it)."""
    from t4patch.cuda.fatbin import cuda_architectures

    summary = cuda_architectures(library)
    arch = re.search(r"compute_(\d+)", recipe.gencode).group(1)  # type: ignore[union-attr]
    if summary.sass or summary.ptx != frozenset({f"compute_{arch}"}):
        raise VerificationError(
            f"{library}: expected PTX for compute_{arch} only, found SASS {sorted(summary.sass)} and PTX {sorted(summary.ptx)}",
            hint="the build did not use the recipe's -gencode; rebuild with a clean cache",
        )
    return summary.to_dict()


@dataclass(frozen=True)
class Built:
    library: Path
    record: dict[str, Any]
    cached: bool


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _run_compiles(commands: list[tuple[str, list[str]]], jobs: int, log: Callable[[str], None], progress: Callable[[str], None]) -> list[dict[str, Any]]:
    done: list[dict[str, Any]] = []
    lock = threading.Lock()
    started = time.monotonic()

    def one(label: str, argv: list[str]) -> dict[str, Any]:
        t0 = time.monotonic()
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        seconds = time.monotonic() - t0
        with lock:
            log("$ " + " ".join(argv) + "\n" + proc.stdout + proc.stderr)
            if proc.returncode == 0:
                done.append({"source": label, "seconds": round(seconds, 1)})
                progress(f"[{len(done)}/{len(commands)}] {Path(label).name} ({seconds:.0f} s, {time.monotonic() - started:.0f} s elapsed)")
        if proc.returncode != 0:
            errors = [ln for ln in (proc.stderr + proc.stdout).splitlines() if "error" in ln.lower()] or (proc.stderr + proc.stdout).splitlines()[-1:]
            raise BuildError(f"nvcc failed on {label} (exit {proc.returncode}): {errors[0] if errors else ''}"[:600], hint="see the build log")
        return done[-1]

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(one, label, argv) for label, argv in commands]
        for future in as_completed(futures):
            future.result()  # the first failure propagates (the others finish; their output is logged)
    return sorted(done, key=lambda d: [c for c, _ in commands].index(d["source"]))


def _cached(recipe: Recipe, directory: Path, key: str) -> Built | None:
    record_path = directory / BUILD_RECORD
    library = directory / recipe.library
    if not record_path.is_file() or not library.is_file():
        return None
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    if record.get("cache_key") != key or record.get("library", {}).get("sha256") != sha256_file(library):
        return None
    return Built(library, record, cached=True)


def build(
    recipe: Recipe | None = None,
    sdist: str | Path | None = None,
    *,
    jobs: int | None = None,
    cache: Path | None = None,
    progress: Callable[[str], None] = _say,
    force: bool = False,
) -> Built:
    """Find the cached library for this recipe and toolchain, or build it (once) from the sdist."""
    recipe = recipe or load_recipe()
    toolchain = detect_toolchain()
    key = cache_key(recipe, toolchain)
    root = cache or cache_root()
    directory = root / key[:16]
    if not force:
        hit = _cached(recipe, directory, key)
        if hit is not None:
            progress(f"{RECIPE_NAME}: cached build {hit.library} (source {hit.record['source_hash'][:12]})")
            return hit
    sdist_path = locate_sdist(recipe, sdist)
    sources, origin = read_sources(recipe, sdist_path)
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"{key[:16]}.partial-", dir=root))
    log_lines: list[str] = []
    log_lock = threading.Lock()

    def log(text: str) -> None:
        with log_lock:
            log_lines.append(text)

    started = datetime.datetime.now(datetime.timezone.utc)
    t0 = time.monotonic()
    try:
        tree = work / "src"
        objects = work / "obj"
        objects.mkdir(parents=True)
        progress(f"{RECIPE_NAME}: building from {sdist_path} (source {source_hash(recipe)[:12]}, nvcc {toolchain.nvcc_version}, torch {toolchain.torch_version})")
        prepared = prepare_tree(recipe, sources, tree, toolchain.python, log)
        commands = compile_commands(recipe, toolchain, tree, objects)
        jobs = jobs or os.cpu_count() or 1
        compiled = _run_compiles(commands, jobs, log, progress)
        library = work / recipe.library
        link = link_command(recipe, toolchain, [objects / (Path(s).name + ".o") for s, _ in commands], library)
        proc = subprocess.run(link, capture_output=True, text=True, check=False)
        log("$ " + " ".join(link) + "\n" + proc.stdout + proc.stderr)
        if proc.returncode != 0:
            first = next((ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()), "")
            raise BuildError(f"linking {recipe.library} failed (exit {proc.returncode}): {first}"[:600], hint="see the build log")
        fatbin = check_library(recipe, library)
        record = {
            "schema": RECORD_SCHEMA,
            "recipe": RECIPE_NAME,
            "recipe_sha256": recipe.sha256,
            "source_hash": source_hash(recipe),
            "cache_key": key,
            "started_utc": started.isoformat(timespec="seconds"),
            "seconds": round(time.monotonic() - t0, 1),
            "jobs": jobs,
            "source": {"distribution": recipe.distribution, "version": recipe.version, **origin},
            "change": {"diff": recipe.diff_path.name, "diff_sha256": recipe.diff_sha256, **prepared["patched"]},
            "emulation": recipe.emulation.to_json(),
            "generated": prepared["generated"],
            "schemas": prepared["schemas"],
            "namespace": recipe.namespace,
            "gencode": recipe.gencode,
            "compile_flags": [*recipe.flags, f"-D_C={recipe.namespace}", *recipe.emulation.defines()],
            "compiles": compiled,
            "toolchain": toolchain.to_json(),
            "library": {"file": recipe.library, "sha256": sha256_file(library), "bytes": library.stat().st_size},
            "fatbin": fatbin,
        }
        (work / BUILD_RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        (work / "build.log").write_text("\n".join(log_lines) + "\n", encoding="utf-8")
        shutil.rmtree(tree)
        shutil.rmtree(objects)
        if directory.exists():
            shutil.rmtree(directory)
        os.replace(work, directory)
    except BaseException:
        (work / "build.log").write_text("\n".join(log_lines) + "\n", encoding="utf-8")
        progress(f"{RECIPE_NAME}: build failed; log kept at {work / 'build.log'}")
        raise
    progress(f"{RECIPE_NAME}: built {directory / recipe.library} in {record['seconds']:.0f} s")
    record["library"]["path"] = str(directory / recipe.library)
    return Built(directory / recipe.library, record, cached=False)


_LOADED: dict[str, Any] = {}


def load_ops(built: Built, recipe: Recipe | None = None) -> Any:
    """Load the library once per process; return ``torch.ops.<namespace>`` holding every recipe op."""
    import torch

    recipe = recipe or load_recipe()
    path = str(built.library.resolve())
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
            raise BuildError(f"{path} does not load into torch {torch.__version__}: {detail}", hint="rebuild with this interpreter's torch: python -m t4patch.engines.vllm.marlin_sm75 build --force") from exc
        _LOADED[path] = getattr(torch.ops, recipe.namespace)
    namespace = _LOADED[path]
    missing = [op for op in recipe.ops if not hasattr(namespace, op)]
    if missing:
        raise BuildError(f"{path} loaded but registers no {', '.join(missing)} in torch.ops.{recipe.namespace}", hint="rebuild: python -m t4patch.engines.vllm.marlin_sm75 build --force")
    return namespace


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m t4patch.engines.vllm.marlin_sm75", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build (or find in the cache) the compute_75-only Marlin library")
    b.add_argument("--sdist", help=f"the vLLM sdist archive or unpacked tree (default ${SDIST_ENV} or the t4patch cache)")
    b.add_argument("--jobs", type=int, help="parallel nvcc processes (default: CPU count)")
    b.add_argument("--force", action="store_true", help="rebuild even when a cached build matches")
    b.add_argument("--record", help="also copy the build record (JSON) here")
    sub.add_parser("hash", help="print the recipe's source hash (no sdist, no nvcc needed)")
    args = parser.parse_args(argv)
    from t4patch.errors import T4PatchError

    try:
        recipe = load_recipe()
        if args.command == "hash":
            print(source_hash(recipe))
            return 0
        built = build(recipe, args.sdist, jobs=args.jobs, force=args.force)
        if args.record:
            Path(args.record).write_text(json.dumps(built.record, indent=2) + "\n", encoding="utf-8")
        print(built.library)
        return 0
    except T4PatchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
