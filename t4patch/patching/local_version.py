"""The PEP 440 local version label of a wheel patched by t4patch: ``0.33.0+t4patch.0.1.0.h1a2b3c4d``.

A patched wheel keeps the distribution's real name and release number, so ``vllm==0.33.0`` pins, the engine's
own version lookup and every tool that reads metadata still see vLLM 0.33.0; the local label says "not the
released bytes", which t4patch release built it and which set of bytes it is:

- ``t4patch.<t4patch release>.h<hash>`` for the shipped set (its default diffs): ``+t4patch.0.1.0.h1a2b3c4d``;
- ``t4patch.with.<option>[.with.<option>...].<t4patch release>.h<hash>`` with optional diffs turned on
  (``--with decode-sliding-window`` -> ``+t4patch.with.decode.sliding.window.0.1.0.h5e6f7a8b``).

The order is the point (PEP 440 compares local labels segment by segment, a number above any word): right
after ``t4patch`` the plain label has a number (the t4patch release) where an optional one has the word
``with``, so **a plain wheel always sorts above every optional-diff wheel of the same release**, whatever
t4patch built them. A directory holding both therefore gives ``pip install --find-links DIR vllm==0.33.0`` (and
uv) the plain one; the optional one is installed only by its full label. Among plain wheels, a newer t4patch
release sorts higher (so does a rebuild by a newer t4patch); two builds by the same t4patch release differ only
in the hash, which does not order them (publish one label per release, docs/fleet.md).

The hash is the first 8 hex digits of a sha256 of everything the wheel adds to the release (the applied diffs,
the pinned hashes, the state record it carries, which names the t4patch version): the same inputs give the same
label and bytes, a changed patch set a new label. Labels of older t4patch builds (``t4patch.N``) are still
recognised.

Installs of such a wheel are installs of the release as far as patch sets go: :func:`release_of` maps the
installed version back to the release its patch set is for, and their RECORD lists the patched hashes.
"""

from __future__ import annotations

import hashlib
import re

from packaging.version import InvalidVersion, Version

from t4patch import __version__
from t4patch.fileio.hashing import sha256_bytes
from t4patch.patching.manifest import PatchSet

LABEL_PREFIX = "t4patch"
_WORD = r"[a-z0-9]+"
_LABEL = re.compile(
    rf"^{LABEL_PREFIX}\.(?:[0-9]+|(?:with(?:\.{_WORD})+\.)?[0-9]+(?:\.[0-9]+)*\.h[0-9a-f]{{8}})$"
)
LABEL_SCHEME = b"t4patch wheel label 2\n"  # bump when what goes into the hash changes


def _segments(name: str) -> str:
    """An option name as local-label segments (PEP 440 allows letters and digits between dots)."""
    return ".".join(s for s in re.split(r"[^a-z0-9]+", name.lower()) if s)


def label_for(patch_set: PatchSet, record: bytes, t4patch_version: str = __version__) -> str:
    """The label for ``patch_set`` (options as turned on) and the state record the wheel will carry."""
    digest = hashlib.sha256(LABEL_SCHEME)
    digest.update(f"{patch_set.distribution}=={patch_set.version}\n".encode())
    for patch in patch_set.patches:
        text = (patch_set.directory / patch.file).read_bytes()
        digest.update(f"patch {patch.file} {sha256_bytes(text)}\n".encode())
    for target in patch_set.targets:
        digest.update(f"file {target.path} {target.pristine_sha256} {target.patched_sha256}\n".encode())
    digest.update(b"record " + sha256_bytes(record).encode() + b"\n")
    release = ".".join(str(n) for n in Version(t4patch_version).release)
    options = "".join(f"with.{_segments(o)}." for o in patch_set.options_on)
    label = f"{LABEL_PREFIX}.{options}{release}.h{digest.hexdigest()[:8]}"
    if not is_t4patch_label(label):  # an option name with nothing PEP 440 can carry
        raise AssertionError(f"t4patch made the label {label!r}, which it does not recognise (a t4patch bug)")
    return label


def is_t4patch_label(label: str | None) -> bool:
    return label is not None and _LABEL.match(label) is not None


def release_of(version: str) -> str:
    """The release a version is: ``0.33.0+t4patch.0.1.0.h1a2b3c4d`` -> ``0.33.0``; any other version is returned
    as it is.

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
