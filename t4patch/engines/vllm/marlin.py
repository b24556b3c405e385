"""vLLM's compiled Marlin without importing vLLM: load ``vllm/_C_stable_libtorch.abi3.so`` into torch.

vLLM 0.33.0 ships its CUDA ops in one library built on torch's stable C ABI, so it loads under other torch
versions (seen under torch 2.11 + CUDA 13). Importing ``vllm`` instead would pull its whole runtime and needs
its pinned torch. This module finds the library (an explicit path, possibly ``.xz``-compressed, or the target
environment's vllm installation), loads it once, identifies it by sha256 against ``engine-data/vllm/marlin-
libraries.toml``, and can rebuild vLLM's own thin Python wrappers (``marlin_gemm``, ``gptq_marlin_repack``)
from the real ``_custom_ops.py`` source next to it, so code that calls ``vllm._custom_ops`` runs vLLM's wrapper
code and not a t4patch imitation.
"""

from __future__ import annotations

import ast
import lzma
import os
import re
import shlex
import shutil
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from t4patch.data.locations import data_dir
from t4patch.data.reader import DataKind, Int, ListOf, Str, Table, optional, read
from t4patch.errors import DataFileError, MissingDependencyError
from t4patch.fileio.hashing import sha256_file

if TYPE_CHECKING:
    from t4patch.environment.target import TargetEnvironment

LIBRARY_NAME = "_C_stable_libtorch.abi3.so"
LIBRARY = f"vllm/{LIBRARY_NAME}"  # the one home of its path inside site-packages (doctor, loaders, hints)
REQUIRED_OPS = ("marlin_gemm", "gptq_marlin_repack")
# The wrappers SGLang's patched code calls through vllm._custom_ops (vLLM 0.33.0 lines 1104-1252).
WRAPPERS = ("gptq_marlin_repack", "awq_marlin_repack", "marlin_gemm")


def companion_version() -> str:
    """The vLLM release whose compiled Marlin the shipped patch sets need beside their engine (their
    ``[[requires]]`` entry naming this library), newest first; "?" when no patch set requires one."""
    from t4patch.engines.requirements import required_releases

    releases = required_releases("vllm")
    with_library = [c for c in releases if c.library == LIBRARY]
    return (with_library or releases)[0].version if releases else "?"


def install_hint(target: TargetEnvironment | None = None) -> str:
    """Put the companion vLLM beside the engine (``--no-deps``: its own requirements would replace the engine's
    torch), aimed at ``target``, else at this interpreter (`verify marlin` runs in the one that loads the
    library: ``--python`` re-runs it there); or name the library itself."""
    pip = target.pip_install() if target is not None else f"{shlex.quote(sys.executable)} -m pip install"
    return f"{pip} --no-deps vllm=={companion_version()}, or pass --vllm-lib PATH/{LIBRARY_NAME}"


def _series(version: str) -> str:
    return ".".join(version.split(".")[:2])


@dataclass(frozen=True)
class KnownFile:
    file: str
    sha256: str
    version: str
    wheel: str


@dataclass(frozen=True)
class LoadedLibrary:
    path: Path  # the .so that was loaded
    given: Path  # what the user named (maybe the .xz)
    sha256: str  # of the loaded .so
    identified_as: KnownFile | None
    vllm_dir: Path  # the directory holding the library (a vllm/ package dir when it came from a wheel)

    def to_json(self) -> dict[str, object]:
        return {
            "path": str(self.path),
            "given": str(self.given),
            "sha256": self.sha256,
            "identified_as": (
                {"version": self.identified_as.version, "wheel": self.identified_as.wheel}
                if self.identified_as
                else None
            ),
        }


LIBRARY_TABLE = DataKind(
    label="verification data",
    error=DataFileError,
)
LIBRARY_TABLE_SCHEMA = Table(
    {
        "schema": Int(),
        "library": ListOf(
            Table(
                {
                    "file": Str(),
                    "sha256": Str(),
                    "version": Str(),
                    "wheel": Str(),
                    "turing_marlin": optional(Str()),  # what a reviewer should know the file holds for sm_75
                }
            ),
            nonempty=True,
        ),
    }
)


def known_files(path: Path | None = None) -> tuple[KnownFile, ...]:
    """The known-library table (default: the shipped ``engine-data/vllm/marlin-libraries.toml``), validated."""
    path = path or data_dir("engine-data") / "vllm" / "marlin-libraries.toml"
    doc = read(path, LIBRARY_TABLE_SCHEMA, LIBRARY_TABLE, version=1)
    result = []
    for index, entry in enumerate(doc["library"], start=1):
        if not re.fullmatch(r"[0-9a-f]{64}", entry["sha256"]):
            raise LIBRARY_TABLE.fail(
                path, f"library[{index}].sha256: expected 64 lowercase hex digits, found {entry['sha256']!r}"
            )
        result.append(KnownFile(entry["file"], entry["sha256"], entry["version"], entry["wheel"]))
    return tuple(result)


def identify(sha256: str) -> KnownFile | None:
    return next((known for known in known_files() if known.sha256 == sha256), None)


def _cache_root() -> Path:
    from t4patch.fileio.cache import cache_dir

    return cache_dir("vllm-lib")


def _decompress(xz_path: Path) -> Path:
    """Decompress once into the cache (keyed by the archive's hash); atomic so parallel runs are safe."""
    key = sha256_file(xz_path)[:16]
    target = _cache_root() / key / LIBRARY_NAME
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".partial-{os.getpid()}")
    try:
        with lzma.open(xz_path) as src, partial.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    except (lzma.LZMAError, EOFError) as exc:
        partial.unlink(missing_ok=True)
        raise MissingDependencyError(
            f"--vllm-lib {xz_path}: expected an xz-compressed {LIBRARY_NAME}, could not decompress it ({exc})",
            hint=install_hint(),
        ) from exc
    os.replace(partial, target)
    return target


def locate_library(explicit: str | None, vllm_root: Path | None, target: TargetEnvironment | None = None) -> Path:
    """The library to load: ``explicit`` (file or .xz) if given, else ``<vllm_root>/vllm/<LIBRARY_NAME>``; the
    hints install into ``target`` when given."""
    if explicit:
        path = Path(explicit).expanduser().resolve()
        if not path.is_file():
            raise MissingDependencyError(
                f"--vllm-lib {explicit}: expected vLLM's {LIBRARY_NAME} (or its .xz), found "
                + ("a directory" if path.is_dir() else "nothing"),
                hint=install_hint(target),
            )
        return path
    if vllm_root is not None:
        path = vllm_root / LIBRARY
        if path.is_file():
            return path
        raise MissingDependencyError(
            f"vllm is installed in {vllm_root} but {path.name} is missing from it (a CPU or partial build?)",
            hint=install_hint(target),
        )
    raise MissingDependencyError(
        f"expected vLLM {companion_version()}'s compiled Marlin kernels ({LIBRARY}) in the target "
        "environment, found no vllm installation",
        hint=install_hint(target),
    )


_LOADED: dict[Path, LoadedLibrary] = {}


def load_library(given: Path) -> LoadedLibrary:
    """Load the library into this process (once) and check that the Marlin ops are registered."""
    import torch

    so = _decompress(given) if given.suffix == ".xz" else given
    if so in _LOADED:
        return _LOADED[so]
    already = all(hasattr(torch.ops._C, op) for op in REQUIRED_OPS)
    if not already:
        try:
            torch.ops.load_library(str(so))
        except (OSError, RuntimeError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise MissingDependencyError(
                f"could not load {so}: {first} (it needs a CUDA build of torch and libcudart.so.13)",
                hint="run with the serving environment's Python (--python), or install a CUDA 13 torch",
            ) from exc
    missing = [op for op in REQUIRED_OPS if not hasattr(torch.ops._C, op)]
    if missing:
        raise MissingDependencyError(
            f"{so} loaded but registers no torch.ops._C.{', '.join(missing)} (not vLLM's op library?)",
            hint=install_hint(),
        )
    digest = sha256_file(so)
    loaded = LoadedLibrary(so, given, digest, identify(digest), given.parent)
    _LOADED[so] = loaded
    return loaded


def load_scalar_type_module(path: Path) -> types.ModuleType | None:
    """vLLM's ``scalar_type.py`` (stdlib-only) loaded by path under a private name, or None when absent."""
    import importlib.util

    name = "_t4patch_vllm_scalar_type"
    if not path.is_file():
        return None
    if name in sys.modules and getattr(sys.modules[name], "__file__", None) == str(path):
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class body runs
    spec.loader.exec_module(module)
    return module


def wrappers_from_source(custom_ops_py: Path, scalar_type_module: types.ModuleType | None) -> types.ModuleType:
    """A module holding vLLM's own ``marlin_gemm`` / ``gptq_marlin_repack`` / ``awq_marlin_repack``.

    The function definitions are taken verbatim from ``vllm/_custom_ops.py`` (parsed, not imported: its
    module body imports vLLM's platform layer) and executed in a namespace with torch; they only forward to
    ``torch.ops._C``, which :func:`load_library` has registered.
    """
    import torch

    if not custom_ops_py.is_file():
        raise MissingDependencyError(
            f"expected vLLM's {custom_ops_py.name} beside its compiled library at {custom_ops_py}, found nothing",
            hint=f"keep vllm/_custom_ops.py next to {LIBRARY}, or install vllm=={companion_version()}",
        )
    tree = ast.parse(custom_ops_py.read_text(encoding="utf-8"), filename=str(custom_ops_py))
    wanted = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in WRAPPERS]
    found = {node.name for node in wanted}
    if found != set(WRAPPERS):
        raise MissingDependencyError(
            f"{custom_ops_py} defines {sorted(found)}, expected {list(WRAPPERS)} "
            f"(not vLLM {_series(companion_version())}'s _custom_ops?)",
            hint=install_hint(),
        )
    module = types.ModuleType("vllm._custom_ops")
    module.__file__ = str(custom_ops_py)
    module.__dict__["torch"] = torch
    module.__dict__["ScalarType"] = getattr(scalar_type_module, "ScalarType", object)
    # annotations like `torch.Tensor | None` are evaluated at def time on 3.10+; that is fine with torch here
    exec(compile(ast.Module(body=list[ast.stmt](wanted), type_ignores=[]), str(custom_ops_py), "exec"), module.__dict__)
    module.__dict__["_t4patch_standin"] = (
        f"vllm._custom_ops rebuilt from {custom_ops_py} ({', '.join(WRAPPERS)} only, verbatim) over the loaded library"
    )
    return module
