"""The source archive of a torch-extension recipe: where it is, and its pinned files, refused unless exact.

The archive is named by ``--source PATH``, else by the recipe's environment variable (``source.env``), else it is
looked for in the t4patch cache (``cache_dir("sdists")``). It may also be an unpacked tree. Every pinned file must
hash to its pin: another release, an edited tree or a damaged download is refused (ForeignFileError) before
anything is built.
"""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

from t4patch.builder.extension import ExtensionSpec
from t4patch.errors import ForeignFileError, MissingDependencyError
from t4patch.fileio.cache import cache_dir
from t4patch.fileio.hashing import sha256_bytes, sha256_file


def default_sdist(spec: ExtensionSpec) -> Path:
    return cache_dir("sdists") / spec.sdist


def sdist_hint(spec: ExtensionSpec) -> str:
    return (
        f"put {spec.sdist} (sha256 {spec.sdist_sha256[:12]}...) in {default_sdist(spec).parent}/ or set "
        f"{spec.sdist_env}=PATH (pip download --no-deps --no-binary :all: {spec.distribution}=={spec.version}; "
        "keep the archive from pip's unpack step, docs/build.md 'The Marlin sm_75 extension')"
    )


def sdist_path(spec: ExtensionSpec, explicit: str | Path | None = None) -> Path:
    """Where the archive (or unpacked tree) is expected: ``explicit``, else $<source.env>, else the cache."""
    given = explicit or os.environ.get(spec.sdist_env)
    return Path(given).expanduser().resolve() if given else default_sdist(spec)


def locate_sdist(spec: ExtensionSpec, explicit: str | Path | None = None) -> Path:
    path = sdist_path(spec, explicit)
    if not path.exists():
        raise MissingDependencyError(f"expected the {spec.distribution} {spec.version} sdist at {path}, found nothing",
                                     hint=sdist_hint(spec))
    return path


def read_sources(spec: ExtensionSpec, sdist: Path) -> tuple[dict[str, bytes], dict[str, object]]:
    """The pinned files' bytes, from the archive (its sha256 checked first) or an unpacked tree, and where from."""
    wanted = dict(spec.files)
    found: dict[str, bytes] = {}
    origin: dict[str, object] = {"path": str(sdist)}
    if sdist.is_dir():
        root = sdist / spec.root if (sdist / spec.root).is_dir() else sdist
        origin.update(kind="directory", root=str(root), sdist_sha256=None)
        for rel in wanted:
            try:
                found[rel] = (root / rel).read_bytes()
            except OSError:
                pass
    else:
        digest = sha256_file(sdist)
        origin.update(kind="archive", sdist_sha256=digest)
        if digest != spec.sdist_sha256:
            raise ForeignFileError(
                f"{sdist} hashes to {digest}, expected the {spec.sdist} of the recipe ({spec.sdist_sha256})",
                hint=sdist_hint(spec),
            )
        names = {f"{spec.root}/{rel}": rel for rel in wanted}
        try:
            with tarfile.open(sdist, "r:*") as archive:
                for member in archive:
                    rel_name = names.get(member.name)
                    if rel_name is None or not member.isfile():
                        continue
                    handle = archive.extractfile(member)
                    if handle is not None:
                        found[rel_name] = handle.read()
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise ForeignFileError(f"{sdist}: not a readable sdist archive ({exc})", hint=sdist_hint(spec)) from exc
    missing = sorted(set(wanted) - set(found))
    if missing:
        raise ForeignFileError(f"{sdist}: {len(missing)} pinned file(s) missing, first {missing[0]}", hint=sdist_hint(spec))
    for rel, expected in wanted.items():
        actual = sha256_bytes(found[rel])
        if actual != expected:
            raise ForeignFileError(f"{sdist}: {rel} hashes to {actual}, expected {expected} ({spec.distribution} {spec.version})",
                                   hint=sdist_hint(spec))
    return found, origin
