"""``build-record.json``: what one build did, written by the pipeline and read back as untrusted input.

The pipeline fills a :class:`BuildRecord` as the build goes and writes it on success *and* on failure (status
``failed`` / ``interrupted``), so a broken build still leaves evidence next to its log. Readers (``t4patch verify
build DIR``, the cache lookup of a torch extension) get it back through :func:`read_record`, which checks the type
of every field they may use: a record that was edited, truncated or is some other JSON file is a one-line
UsageError naming the file and the field, never a traceback. Keys this t4patch does not know are ignored (a newer
t4patch may add some); the JSON a build prints (``build --json``) is :meth:`BuildRecord.to_dict`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from t4patch.errors import UsageError

RECORD_SCHEMA = 1
RECORD_KIND = "t4patch-build-record"
RECORD_FILE = "build-record.json"
STATUSES = ("running", "ok", "failed", "interrupted")


@dataclass
class BuildRecord:
    """One build, in the order the JSON file lists it. ``extension`` only for a torch-extension build."""

    t4patch: str
    command: str
    recipe: str
    recipe_sha256: str | None
    arch: str  # "75", or "cpu"
    cuda: bool
    features: list[str]
    with_tests: bool
    ptx_only: bool  # PTX for the arch, no SASS: a newer GPU runs the Turing code through JIT
    jobs: int
    out: str
    build_dir: str
    log: str
    requested: dict[str, Any]  # mode, repository, ref, path
    env: dict[str, str]
    flags: dict[str, list[str]]
    tools: dict[str, str]
    host: dict[str, Any]
    started: str
    schema: int = RECORD_SCHEMA
    kind: str = RECORD_KIND
    status: str = "running"
    error: str | None = None
    finished: str | None = None
    source: dict[str, Any] | None = None  # SourceIdentity.to_dict()
    steps: list[dict[str, Any]] = field(default_factory=list)  # StepResult.to_dict() of every command
    durations: dict[str, float] = field(default_factory=dict)
    artifacts: list[dict[str, Any]] = field(default_factory=list)
    verification: dict[str, Any] | None = None  # ArtifactReport.to_dict(), or why there was none
    extension: dict[str, Any] | None = None  # a torch extension's facts (source hash, cache key, library, ...)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        head = ("schema", "kind", "t4patch", "command", "recipe", "recipe_sha256", "arch", "cuda", "features",
                "with_tests", "ptx_only", "jobs", "out", "build_dir", "log", "requested", "env", "flags", "tools", "host",
                "started")
        doc = {name: getattr(self, name) for name in head}
        doc.update(status=self.status, error=self.error, finished=self.finished, source=self.source, steps=self.steps,
                   durations=self.durations, artifacts=self.artifacts, verification=self.verification)
        if self.extension is not None:
            doc["extension"] = self.extension
        return doc


# field -> (accepted JSON types, required); "nullable" adds None
_STR, _INT, _BOOL, _DICT, _LIST = (str,), (int,), (bool,), (dict,), (list,)
_FIELDS: dict[str, tuple[tuple[type, ...], bool, bool]] = {
    # name: (types, required, nullable)
    "t4patch": (_STR, True, False),
    "command": (_STR, True, False),
    "recipe": (_STR, True, False),
    "recipe_sha256": (_STR, False, True),
    "arch": (_STR, True, False),
    "cuda": (_BOOL, True, False),
    "features": (_LIST, False, False),
    "with_tests": (_BOOL, False, False),  # records before --with-tests have none
    "ptx_only": (_BOOL, False, False),
    "jobs": (_INT, True, False),
    "out": (_STR, True, False),
    "build_dir": (_STR, True, False),
    "log": (_STR, True, False),
    "requested": (_DICT, False, False),
    "env": (_DICT, False, False),
    "flags": (_DICT, False, False),
    "tools": (_DICT, False, False),
    "host": (_DICT, False, False),
    "started": (_STR, True, False),
    "status": (_STR, True, False),
    "error": (_STR, False, True),
    "finished": (_STR, False, True),
    "source": (_DICT, False, True),
    "steps": (_LIST, False, False),
    "durations": (_DICT, False, False),
    "artifacts": (_LIST, False, False),
    "verification": (_DICT, False, True),
    "extension": (_DICT, False, True),
}


class RecordProblem(ValueError):
    """What is wrong with a record document (the reader turns it into one UsageError line)."""


def _type_name(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
            dict: "an object", type(None): "null"}.get(type(value), type(value).__name__)


def parse_record(doc: Any) -> BuildRecord:
    """A :class:`BuildRecord` from a parsed JSON document; RecordProblem says what does not fit."""
    if not isinstance(doc, dict):
        raise RecordProblem(f"expected a JSON object, found {_type_name(doc)}")
    if doc.get("kind") != RECORD_KIND:
        raise RecordProblem(f"expected kind {RECORD_KIND!r}, found {doc.get('kind')!r}")
    schema = doc.get("schema")
    if schema != RECORD_SCHEMA or isinstance(schema, bool):
        raise RecordProblem(f"expected schema {RECORD_SCHEMA}, found {schema!r} (written by another t4patch?)")
    values: dict[str, Any] = {}
    for name, (types, required, nullable) in _FIELDS.items():
        if name not in doc:
            if required:
                raise RecordProblem(f"'{name}' is missing")
            continue
        value = doc[name]
        if value is None and nullable:
            values[name] = None
            continue
        # a JSON true is a Python bool, which is also an int: an integer field takes no boolean
        if not isinstance(value, types) or (types == _INT and isinstance(value, bool)):
            raise RecordProblem(f"'{name}' is {_type_name(value)}, expected {_type_name(types[0]())}")
        values[name] = value
    if values["status"] not in STATUSES:
        raise RecordProblem(f"'status' is {values['status']!r}, expected one of {', '.join(STATUSES)}")
    if not all(isinstance(f, str) for f in values.get("features", [])):
        raise RecordProblem("'features' must list strings")
    defaults = {"features": [], "with_tests": False, "ptx_only": False, "requested": {}, "env": {}, "flags": {},
                "tools": {}, "host": {}}
    known = {f.name for f in fields(BuildRecord)}
    return BuildRecord(**{**defaults, **{k: v for k, v in values.items() if k in known}})


def read_record(path: Path, *, hint: str) -> BuildRecord:
    """Read ``path`` as a build record; a missing, unreadable or malformed one is a UsageError with ``hint``."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path} is not a readable t4patch build record ({exc})", hint=hint) from exc
    except ValueError as exc:
        raise UsageError(f"{path} is not a t4patch build record (not JSON: {exc})", hint=hint) from exc
    try:
        return parse_record(doc)
    except RecordProblem as exc:
        raise UsageError(f"{path} is not a t4patch build record ({exc})", hint=hint) from exc
