"""Where t4patch's data lives: one tree per owner, named after what it holds (never after a code package).

- ``patches/<dist>/<version>/``: the engine patch sets.
- ``recipes/``: build recipes (``<name>.toml`` for ``t4patch build``; ``vllm-marlin-sm75/`` for the Marlin
  extension).
- ``hardware/``: facts about GPUs (``gpu-archs.toml``, ``gpu-memory-bandwidth.toml``).
- ``engine-data/<engine>/``: facts about one engine's released files (``vllm/marlin-libraries.toml``, ...).
- ``cases/``: the inputs of the verification commands (attention cases, Marlin tolerances and shapes, the
  llama.cpp op list).

In the source tree they sit at the repository root; in a built wheel they are shipped inside the package as
``t4patch/_data/<tree>`` (pyproject's force-include). Code never hard-codes either location: it asks here.
``T4PATCH_PATCHES`` (or the global ``--patches DIR``) points patch-set lookup at another tree, which is how
tests use synthetic patch sets and how maintainers try a new set before shipping it. Missing ``patches/``
data is a :class:`PatchSetError`; missing data of the other trees a :class:`DataFileError`.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import sys
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlparse

from t4patch.errors import DataFileError, PatchSetError

_PACKAGE_DIR = Path(__file__).resolve().parent.parent  # .../t4patch
DATA_KINDS = ("patches", "recipes", "hardware", "engine-data", "cases")


def data_dir(kind: str) -> Path:
    """The directory holding shipped data of ``kind`` (one of DATA_KINDS)."""
    if kind not in DATA_KINDS:
        raise ValueError(f"unknown data kind {kind!r}")
    if kind == "patches" and os.environ.get("T4PATCH_PATCHES"):
        override = Path(os.environ["T4PATCH_PATCHES"]).expanduser()
        if not override.is_dir():
            raise PatchSetError(
                f"T4PATCH_PATCHES={override}: expected a directory of patch sets, found nothing there",
                hint="unset T4PATCH_PATCHES to use the patch sets shipped with t4patch",
            )
        return override
    for candidate in shipped_dirs(kind):
        if candidate.is_dir():
            return candidate
    # patches/ is patch-set data (exit 7); the other trees are the other shipped data (exit 16)
    error = PatchSetError if kind == "patches" else DataFileError
    raise error(
        f"t4patch's {kind}/ data is missing (looked in {_PACKAGE_DIR / '_data'} and {_PACKAGE_DIR.parent})",
        hint=reinstall_hint(),
    )


def shipped_dirs(kind: str) -> tuple[Path, Path]:
    """Where the shipped tree of ``kind`` may be, in lookup order: inside an installed wheel
    (``t4patch/_data/<kind>``), then in the checkout this t4patch runs from (``<repository>/<kind>``). Neither
    need exist; :func:`data_dir` returns the first that does. (Code that must recognise the shipped files, for
    instance to refuse writing into them, asks here rather than spelling the two places out.)"""
    if kind not in DATA_KINDS:
        raise ValueError(f"unknown data kind {kind!r}")
    return (_PACKAGE_DIR / "_data" / kind, _PACKAGE_DIR.parent / kind)


@functools.cache
def reinstall_hint() -> str:
    """The command that puts t4patch's own shipped files back, for the way this t4patch was installed.

    t4patch is installed from a checkout or a built wheel (it is not on PyPI), so "pip install t4patch" would
    not work. PEP 610's direct_url.json says where the install came from: a checkout installed editable gets
    its data back from git, a wheel or a directory is reinstalled from the same place.
    """
    python = shlex.quote(sys.executable)
    try:
        raw = metadata.distribution("t4patch").read_text("direct_url.json")
        origin = json.loads(raw) if raw else {}
    except (metadata.PackageNotFoundError, ValueError):
        origin = {}
    url = origin.get("url", "") if isinstance(origin, dict) else ""
    path = unquote(urlparse(url).path) if url.startswith("file://") else ""
    editable = isinstance(origin, dict) and bool((origin.get("dir_info") or {}).get("editable"))
    checkout = Path(path) if editable else _PACKAGE_DIR.parent
    if (editable or not path) and (checkout / ".git").exists():
        return f"restore the shipped data from git: git -C {shlex.quote(str(checkout))} checkout -- {' '.join(DATA_KINDS)}"
    if path:
        return f"reinstall t4patch from where it came: {python} -m pip install --force-reinstall --no-deps {shlex.quote(path)}"
    return "reinstall t4patch the way it was installed (from its repository checkout or a built wheel)"
