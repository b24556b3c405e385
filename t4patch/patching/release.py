"""A released wheel's files, read without installing it and checked against its own RECORD.

`t4patch port` needs the pristine files of two releases (the one a patch set was made for, and the one it is
ported to). A release is found as ``--wheel PATH``, or in the wheel cache (``$T4PATCH_WHEEL_CACHE``, default
``~/.cache/t4patch/wheels``, the cache the integration tests use), or downloaded into it with
``pip download --no-deps`` (nothing is installed, nothing of the engine is imported). Every file read is
hashed against the wheel's RECORD: a wheel whose bytes are not what it says is refused.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import canonicalize_name

from t4patch.environment.target import parse_record
from t4patch.errors import PatchSetError, UsageError
from t4patch.fileio.hashing import sha256_bytes


def wheel_cache() -> Path:
    return Path(os.environ.get("T4PATCH_WHEEL_CACHE", "~/.cache/t4patch/wheels")).expanduser()


def _cached(name: str, version: str, cache: Path) -> Path | None:
    prefix = f"{canonicalize_name(name).replace('-', '_')}-{version}-"
    hits = sorted(w for w in cache.glob("*.whl") if w.name.lower().startswith(prefix))
    return hits[0] if hits else None


def find_wheel(name: str, version: str, explicit: str | None = None) -> Path:
    """The wheel of ``name==version``: ``explicit``, the cached one, or one ``pip download --no-deps`` fetches."""
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file() or path.suffix != ".whl":
            raise UsageError(f"--wheel {explicit}: expected a .whl file, found " + ("a directory" if path.is_dir()
                             else "nothing"), hint=f"pip download --no-deps -d DIR {name}=={version}")
        return path
    cache = wheel_cache()
    found = _cached(name, version, cache) if cache.is_dir() else None
    if found is not None:
        return found
    cache.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
         "--disable-pip-version-check", "-d", str(cache), f"{name}=={version}"],
        capture_output=True, text=True, check=False,
    )
    found = _cached(name, version, cache)
    if proc.returncode != 0 or found is None:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise UsageError(
            f"expected the released wheel of {name}=={version}, pip download found none ({tail[0]})",
            hint=f"download it yourself and pass --wheel: pip download --no-deps -d DIR {name}=={version}",
        )
    return found


@dataclass
class ReleaseFiles:
    """Read access to one wheel's files, each checked against the wheel's RECORD."""

    wheel: Path
    record: dict[str, str | None] = field(default_factory=dict)

    @classmethod
    def open(cls, wheel: Path) -> ReleaseFiles:
        with zipfile.ZipFile(wheel) as zf:
            name = next((n for n in zf.namelist() if n.endswith(".dist-info/RECORD")), None)
            if name is None:
                raise PatchSetError(f"{wheel}: expected a wheel with a .dist-info/RECORD, found none")
            record = parse_record(zf.read(name).decode("utf-8"))
        return cls(wheel, record)

    def has(self, path: str) -> bool:
        return path in self.record

    def read(self, path: str) -> bytes:
        """The file's bytes; refuses a file whose sha256 is not its RECORD's."""
        expected = self.record.get(path)
        with zipfile.ZipFile(self.wheel) as zf:
            data = zf.read(path)
        if expected is None or sha256_bytes(data) != expected:
            raise PatchSetError(
                f"{self.wheel.name}: {path} hashes to {sha256_bytes(data)}, expected its RECORD sha256 {expected}",
                hint="download the wheel again (pip download --no-deps)",
            )
        return data
