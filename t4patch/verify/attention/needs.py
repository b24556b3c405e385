"""What the compile worker needs to import, and the one pip command that installs all of it.

The list is t4patch's own ``verify`` extra (pyproject.toml, the one home of it), read from the installed
metadata, or from the checkout's pyproject.toml when t4patch runs from a source tree that was never installed:
torch, triton, and the light modules the engines import on the way to their attention launchers. The worker
looks for every one before importing anything, so a user hears about all missing modules at once, with one
command to paste, instead of one module per run.
"""

from __future__ import annotations

import shlex
from importlib import metadata
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from t4patch.data.tomlcompat import tomllib

EXTRA = "verify"
# A CPU build of torch is all a compile needs; the default index serves multi-GB CUDA builds. Local versions
# ("2.14.0+cpu") sort above the plain ones, so pip takes the CPU wheel from this extra index.
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
_CHECKOUT = Path(__file__).resolve().parents[3] / "pyproject.toml"
# Import names whose pip distribution is spelled differently.
PIP_NAMES = {"zmq": "pyzmq", "PIL": "pillow", "yaml": "pyyaml", "cv2": "opencv-python-headless"}


def verify_extra() -> list[Requirement]:
    """The requirements of t4patch's ``verify`` extra ([] when neither metadata nor pyproject.toml has them)."""
    try:
        raw = metadata.requires("t4patch") or []
        found = [r for r in map(_parse, raw) if r is not None and _in_extra(r)]
        if found:
            return [_without_marker(r) for r in found]
    except metadata.PackageNotFoundError:
        pass
    try:
        project = tomllib.loads(_CHECKOUT.read_text(encoding="utf-8")).get("project", {})
    except (OSError, tomllib.TOMLDecodeError):
        return []
    extras = project.get("optional-dependencies", {}).get(EXTRA, [])
    return [r for r in map(_parse, extras) if r is not None]


def _in_extra(requirement: Requirement) -> bool:
    """Is this metadata requirement one of the extra's (its marker holds with the extra, not without)?"""
    marker = requirement.marker
    return marker is not None and marker.evaluate({"extra": EXTRA}) and not marker.evaluate({"extra": ""})


def _parse(text: str) -> Requirement | None:
    try:
        return Requirement(text)
    except InvalidRequirement:
        return None


def _without_marker(requirement: Requirement) -> Requirement:
    requirement = Requirement(str(requirement))
    requirement.marker = None
    return requirement


def import_name(requirement: Requirement) -> str:
    """The module a requirement provides (the extra lists only distributions named like their module)."""
    return canonicalize_name(requirement.name).replace("-", "_")


def needed_modules(extra: list[Requirement]) -> list[str]:
    """torch and triton first, then the extra's other modules, each once."""
    names = ["torch", "triton", *(import_name(r) for r in extra)]
    return list(dict.fromkeys(names))


def install_command(python: str, missing: list[str], extra: list[Requirement], triton_series: str,
                    *, whole_extra: bool) -> str:
    """One pip command for ``python`` that installs ``missing`` (or the whole extra, when ``whole_extra``).

    Each module is installed by its requirement in the extra; triton is pinned to the series the engine's
    torch pins (``triton_series``), which may differ from the extra's; torch comes from the CPU index.
    """
    by_module = {import_name(r): r for r in extra}
    modules = list(dict.fromkeys([*(by_module if whole_extra else []), *missing]))
    specs = []
    for module in modules:
        if module == "triton":
            specs.append(f"triton~={triton_series}.0")
        elif module in by_module:
            specs.append(str(by_module[module]))
        else:
            specs.append(PIP_NAMES.get(module, module))
    index = f" --extra-index-url {TORCH_CPU_INDEX}" if "torch" in modules else ""
    return f"{shlex.quote(python)} -m pip install{index} " + " ".join(shlex.quote(s) for s in specs)
