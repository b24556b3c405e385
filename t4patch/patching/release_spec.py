"""One home for what "one exact release" means on a command line.

``t4patch wheel`` and ``t4patch port`` (both its ``ENGINE==NEW`` and its ``--from ENGINE==OLD``) work on exactly
one released version: ``==`` or ``===`` with one PEP 440 version, no wildcard, no local label (a local version
such as ``0.33.0+t4patch.5`` or ``2.5.1+cu121`` is a build, not the release a patch set is made for).
"""

from __future__ import annotations

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from t4patch.errors import UsageError
from t4patch.patching.selection import parse_spec


def exact_release(spec: str, *, option: str, example: str) -> tuple[str, str]:
    """``ENGINE==VERSION`` -> (canonical name, version as written); ``option`` names where it was typed
    (``wheel``, ``port``, ``--from``) and ``example`` is a command line to paste instead."""
    req = parse_spec(spec)
    pins = list(req.specifier)
    name = canonicalize_name(req.name)
    if len(pins) != 1 or pins[0].operator not in ("==", "===") or "*" in pins[0].version:
        raise UsageError(
            f"{option} {spec}: expected ENGINE==VERSION (one exact release), found "
            f"{'no version' if not pins else str(req.specifier)}",
            hint=f"{example.format(name=name)}  (t4patch list shows the releases)",
        )
    version = pins[0].version
    try:
        parsed = Version(version)
    except InvalidVersion:  # `===` takes any string
        raise UsageError(f"{option} {spec}: expected a PEP 440 release, found {version!r}",
                         hint=f"{example.format(name=name)}  (t4patch list shows the releases)") from None
    if parsed.local is not None:
        raise UsageError(
            f"{option} {spec}: expected a released version, found the local version {version}",
            hint=example.format(name=name).replace("<version>", parsed.public),
        )
    return name, version
