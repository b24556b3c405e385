"""The PEP 440 local version label of a wheel patched by t4patch: ``0.33.0+t4patch.N``.

A patched wheel keeps the distribution's real name and release number, so ``vllm==0.33.0`` pins, the engine's
own version lookup and every tool that reads metadata still see vLLM 0.33.0; the local label says "not the
released bytes" and which patch set made them. N is derived from everything the wheel adds to the release (the
applied diffs, the pinned hashes and the state record it carries), so a changed patch set gives a new label
and one label always names one set of bytes.

Installs of such a wheel are installs of the release as far as patch sets go: :func:`release_of` maps the
installed version back to the release its patch set is for, and their RECORD lists the patched hashes.
"""

from __future__ import annotations

import hashlib
import re

from packaging.version import InvalidVersion, Version

from t4patch.fileio.hashing import sha256_bytes
from t4patch.patching.manifest import PatchSet

LABEL_PREFIX = "t4patch"
_LABEL = re.compile(rf"^{LABEL_PREFIX}\.(?P<n>[0-9]+)$")
LABEL_SCHEME = b"t4patch wheel label 1\n"  # bump when what goes into N changes


def label_for(patch_set: PatchSet, record: bytes) -> str:
    """``t4patch.N`` for ``patch_set`` (options as turned on) and the state record the wheel will carry."""
    digest = hashlib.sha256(LABEL_SCHEME)
    digest.update(f"{patch_set.distribution}=={patch_set.version}\n".encode())
    for patch in patch_set.patches:
        text = (patch_set.directory / patch.file).read_bytes()
        digest.update(f"patch {patch.file} {sha256_bytes(text)}\n".encode())
    for target in patch_set.targets:
        digest.update(f"file {target.path} {target.pristine_sha256} {target.patched_sha256}\n".encode())
    digest.update(b"record " + sha256_bytes(record).encode() + b"\n")
    return f"{LABEL_PREFIX}.{int(digest.hexdigest()[:8], 16)}"


def is_t4patch_label(label: str | None) -> bool:
    return label is not None and _LABEL.match(label) is not None


def release_of(version: str) -> str:
    """The release a version is: ``0.33.0+t4patch.N`` -> ``0.33.0``; any other version is returned as it is.

    Only t4patch's own label is dropped: ``2.5.1+cu121`` is another build of the release, not the release.
    """
    try:
        parsed = Version(version)
    except InvalidVersion:
        return version
    return parsed.public if is_t4patch_label(parsed.local) else version


def built_by_t4patch(version: str) -> bool:
    """Whether ``version`` carries t4patch's local label (an install from a ``t4patch wheel`` wheel)."""
    try:
        return is_t4patch_label(Version(version).local)
    except InvalidVersion:
        return False
