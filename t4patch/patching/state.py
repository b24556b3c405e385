"""The human-readable state record: which patch set t4patch applied to a distribution, when, with what.

It lives in the distribution's own ``.dist-info`` directory (``t4patch.json``), so reinstalling the engine
discards it together with the patched files. The file hashes are the truth; this record only lets `status`
say when and by which t4patch version a patch set was applied, and with which optional diffs (``options``:
the names turned on by ``apply --with`` / ``wheel --with``, or found applied and left so), and it is never
trusted over the hashes.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from t4patch import __version__
from t4patch.environment.target import InstalledDistribution
from t4patch.fileio.atomic import write_bytes_atomic
from t4patch.patching.manifest import PatchSet

RECORD_NAME = "t4patch.json"
RECORD_SCHEMA = 1


@dataclass(frozen=True)
class StateRecord:
    patch_set: str
    applied_at: str
    t4patch_version: str
    raw: dict[str, Any]
    options: tuple[str, ...] = ()  # the optional diffs on when it was written (absent in older records: none)


def record_path(dist: InstalledDistribution) -> Path:
    return dist.dist_info / RECORD_NAME


def record_bytes(patch_set: PatchSet) -> bytes:
    """The record's bytes for ``patch_set`` applied now (the commit stages them with the patched files)."""
    return record_document(patch_set, applied_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))


def record_document(patch_set: PatchSet, *, applied_at: str, t4patch_version: str = __version__) -> bytes:
    """The record's bytes with every field given: a pure function, so a built wheel can carry a record that
    does not depend on when it was built (``t4patch wheel``)."""
    doc = {
        "schema": RECORD_SCHEMA,
        "patch_set": patch_set.spec,
        "applied_at": applied_at,
        "t4patch_version": t4patch_version,
        "options": list(patch_set.options_on),
        "patches": [p.file for p in patch_set.patches],
        "files": [
            {"path": t.path, "pristine_sha256": t.pristine_sha256, "patched_sha256": t.patched_sha256}
            for t in patch_set.targets
        ],
    }
    return (json.dumps(doc, indent=2) + "\n").encode("utf-8")


def write_record(patch_set: PatchSet, dist: InstalledDistribution) -> None:
    write_bytes_atomic(record_path(dist), record_bytes(patch_set))


def read_record(dist: InstalledDistribution) -> StateRecord | None:
    """The record, or None when absent or unreadable (it is informational; hashes decide)."""
    path = record_path(dist)
    if path.is_symlink() or not path.is_file():
        return None  # never follow a planted link or block on a FIFO for an informational file
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict) or raw.get("schema") != RECORD_SCHEMA:
        return None
    options = raw.get("options", [])
    if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
        options = []  # a damaged field of an informational file: the hashes still say what is applied
    return StateRecord(
        str(raw.get("patch_set")), str(raw.get("applied_at")), str(raw.get("t4patch_version")), raw,
        tuple(options),
    )


RECORD_KEYS = frozenset({"schema", "patch_set", "applied_at", "t4patch_version", "options", "patches", "files"})
RECORD_MAX_BYTES = 1 << 20  # a record lists a set's files: kilobytes; anything far larger is not one


def record_problem(data: bytes, spec: str) -> str | None:
    """Why ``data`` is not a state record t4patch writes for the patch set ``spec`` (None: it is one).

    Recovery renames a staged record into place or deletes one only when this says it is t4patch's own
    (:func:`record_document`'s exact shape), so a planted journal cannot use the record's name to install or
    remove anything else."""
    if len(data) > RECORD_MAX_BYTES:
        return f"{len(data)} bytes, more than a state record ever holds"
    try:
        doc = json.loads(data.decode("utf-8"))
    except ValueError as exc:
        return f"not UTF-8 JSON ({exc})"
    if not isinstance(doc, dict) or set(doc) != RECORD_KEYS:
        found = sorted(doc) if isinstance(doc, dict) else type(doc).__name__
        return f"not a state record (expected the keys {sorted(RECORD_KEYS)}, found {found})"
    if doc["schema"] != RECORD_SCHEMA or doc["patch_set"] != spec:
        return f"a state record of {doc['patch_set']!r} schema {doc['schema']!r}, not of {spec} schema {RECORD_SCHEMA}"
    strings = [doc["applied_at"], doc["t4patch_version"], *_listed(doc["options"]), *_listed(doc["patches"])]
    files = doc["files"] if isinstance(doc["files"], list) else [None]
    if not all(isinstance(v, str) for v in strings) or not all(
        isinstance(f, dict) and set(f) == {"path", "pristine_sha256", "patched_sha256"}
        and all(isinstance(v, str) for v in f.values()) for f in files
    ):
        return "a state record with fields of the wrong type"
    return None


def _listed(value: object) -> list[object]:
    return list(value) if isinstance(value, list) else [None]


def remove_record(dist: InstalledDistribution) -> None:
    record_path(dist).unlink(missing_ok=True)
