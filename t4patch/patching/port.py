"""`t4patch port`: carry a patch set from one release of an engine to another, as a draft for review.

A maintained diff set per engine release is the project's job; this is the tool that makes the next one. It
reads the pristine files of both releases from their wheels (checked against each wheel's RECORD), lands every
hunk of the OLD set on the NEW files (exact, exact context at an offset, already upstream, or a real 3-way
merge: :mod:`t4patch.patching.hunkport`, never fuzz), regenerates each diff against the NEW files, pins the
NEW pristine (= RECORD) and patched sha256, and writes the result as a **draft** patch set
(``draft = true``), which ``apply`` refuses until a maintainer has reviewed it and removed the mark. The draft
is then loaded by the strict manifest reader and proven against the NEW wheel (exact apply, patched hash,
exact revert) and every patched file is compiled, so what the report calls ported is a set that works.
Nothing is published: the draft goes to ``-o DIR`` (a patch-set tree, usable with ``--patches DIR``), which
is checked first (:mod:`t4patch.patching.output_dir`: no symlink, no file, writable, not inside a patch-set
tree that ``list`` reads). A set already at ``DIR/<engine>/<version>/`` is replaced only when it is an earlier
draft of ``t4patch port`` (its manifest loads and says ``draft = true``, and the directory holds only that
manifest and its diffs); anything else there is the user's and is kept. Both wheels go through
:func:`t4patch.fileio.wheeltools.open_release` (the wheel cache is ``cache_dir("wheels")``): NEW's file name,
dist-info and METADATA must all say NEW, so another release renamed to NEW's file name is refused.
"""

from __future__ import annotations

import datetime
import os
import secrets
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import Version

from t4patch.errors import PatchSetError, T4PatchError, UsageError
from t4patch.fileio.hashing import sha256_bytes
from t4patch.fileio.wheeltools import Expected, ReleasedWheel, find_release, open_release
from t4patch.patching.diffwrite import unified_diff
from t4patch.patching.hunkport import FilePort, Merge, git_merge_file, missing_file, port_file_diff
from t4patch.patching.manifest import MANIFEST_NAME, SCHEMA_VERSION, Patch, PatchSet, load_patch_set
from t4patch.patching.manifest_write import render_manifest
from t4patch.patching.output_dir import make_dir, output_dir
from t4patch.patching.registry import find_patch_set, nearest_version, supported_versions
from t4patch.patching.unified_diff import apply_file_diff
from t4patch.patching.wheelproof import prove_against_wheel


@dataclass(frozen=True)
class DiffPort:
    """One diff of the OLD set on the NEW release."""

    old_file: str
    new_file: str | None  # the regenerated diff's name in the draft; None when the diff was dropped
    outcome: str  # "ported" | "partial" | "upstream" | "failed"
    files: tuple[FilePort, ...]
    optional: str | None = None

    @property
    def note(self) -> str:
        if self.outcome == "upstream":
            return "already upstream: the NEW files already contain this diff's result; dropped"
        if self.outcome == "failed":
            return "no hunk landed; dropped from the draft (needs a hand edit)"
        if self.outcome == "partial":
            failed = sum(len(f.failed) for f in self.files)
            return f"{failed} hunk(s) FAILED and are missing from the draft diff (needs a hand edit)"
        methods = sorted({h.method for f in self.files for h in f.hunks})
        return "ported (" + ", ".join(methods) + ")"

    def to_json(self) -> dict[str, Any]:
        return {
            "old_file": self.old_file,
            "new_file": self.new_file,
            "outcome": self.outcome,
            "optional": self.optional,
            "note": self.note,
            "files": [{"path": f.path, "hunks": [h.to_json() for h in f.hunks]} for f in self.files],
        }


@dataclass(frozen=True)
class PortReport:
    distribution: str
    old_version: str
    new_version: str
    old_wheel: Path
    new_wheel: Path
    record_checked: tuple[str, ...]  # NEW files read and found equal to the NEW wheel's RECORD
    missing: tuple[str, ...]  # target files the NEW wheel does not have
    diffs: tuple[DiffPort, ...]
    draft_dir: Path | None  # None when nothing landed (no draft written)
    proof: tuple[str, ...] = ()  # the draft proven against the NEW wheel, one line a file
    compiled: tuple[str, ...] = ()  # patched files compiled (Python syntax) without error
    compile_errors: tuple[str, ...] = ()  # "path:line: message" of patched files that do not compile
    command: str = ""

    @property
    def complete(self) -> bool:
        return (
            self.draft_dir is not None
            and not self.compile_errors
            and all(d.outcome in ("ported", "upstream") for d in self.diffs)
        )

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for d in self.diffs:
            for f in d.files:
                for h in f.hunks:
                    out[h.method] = out.get(h.method, 0) + 1
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "distribution": self.distribution,
            "from": f"{self.distribution}=={self.old_version}",
            "to": f"{self.distribution}=={self.new_version}",
            "old_wheel": str(self.old_wheel),
            "new_wheel": str(self.new_wheel),
            "record_checked": list(self.record_checked),
            "missing_files": list(self.missing),
            "hunks": self.counts(),
            "diffs": [d.to_json() for d in self.diffs],
            "draft": str(self.draft_dir) if self.draft_dir else None,
            "complete": self.complete,
            "proof": list(self.proof),
            "compiled": list(self.compiled),
            "compile_errors": list(self.compile_errors),
        }

    def lines(self) -> list[str]:
        """The human report: the table a maintainer reads (and pastes into docs/maintaining.md)."""
        out = [
            f"port {self.distribution} {self.old_version} -> {self.new_version}",
            f"  OLD {self.old_wheel.name}; NEW {self.new_wheel.name}: "
            f"{len(self.record_checked)} target file(s) = RECORD"
            + (f", MISSING in NEW: {', '.join(self.missing)}" if self.missing else ""),
        ]
        for d in self.diffs:
            name = f"{d.old_file} -> {d.new_file}" if d.new_file else f"{d.old_file} (dropped)"
            out.append(f"  {name}{f' [optional {d.optional}]' if d.optional else ''}: {d.note}")
            for f in d.files:
                out.append(f"    {f.path}")
                for h in f.hunks:
                    out.append(f"      {h.describe()}")
                    if h.method == "failed":
                        out.extend(f"        {line}" for line in h.around)
        counts = self.counts()
        out.append("  hunks: " + ", ".join(f"{counts[k]} {k}" for k in sorted(counts)))
        if self.draft_dir is None:
            out.append("  no draft written: no diff landed")
        else:
            out.append(f"  draft: {self.draft_dir} (draft = true; apply refuses it until reviewed)")
            out.append(f"  proof on {self.new_wheel.name}: {len(self.proof)} file(s) pristine = RECORD, apply "
                       f"exactly, patched hash ok, revert exactly; {len(self.compiled)} compiled")
            out.extend(f"  DOES NOT COMPILE: {e}" for e in self.compile_errors)
            out.append("  COMPLETE: every hunk landed or is upstream; review the draft" if self.complete
                       else "  INCOMPLETE: hunks above need a hand edit before this set can ship")
        return out


def nearest_shipped(distribution: str, version: str) -> str:
    """The shipped release to port from (:func:`t4patch.patching.registry.nearest_version`), never ``version``."""
    target = Version(version)
    versions = [v for v in supported_versions(distribution) if Version(v) != target]
    if not versions:
        raise UsageError(
            f"expected a shipped patch set of {distribution} to port from, found none",
            hint="t4patch list",
        )
    return nearest_version(versions, version)


def port(
    distribution: str,
    new_version: str,
    out: Path,
    *,
    old_version: str | None = None,
    wheel: str | None = None,
    from_wheel: str | None = None,
    merge: Merge = git_merge_file,
) -> PortReport:
    """Port the OLD set of ``distribution`` to ``new_version``; write a draft under ``out``; return the report."""
    name = canonicalize_name(distribution)
    Version(new_version)  # the command parsed it; a bad one here is a bug
    old_version = old_version or nearest_shipped(name, new_version)
    if Version(old_version) == Version(new_version):
        raise UsageError(f"--from {name}=={old_version}: expected another release than the one ported to")
    old_set = find_patch_set(name, old_version)
    command = f"t4patch port {name}=={new_version} --from {name}=={old_version}"
    retry = f"{command} -o DIR"
    output_dir(out, option="-o", retry=retry)
    _check_draft_place(out / old_set.distribution / str(Version(new_version)), retry)
    old_path = find_release(name, old_version, Path(from_wheel) if from_wheel else None, role="--from-wheel")
    new_path = find_release(name, new_version, Path(wheel) if wheel else None, role="--wheel")
    old_role = "--from-wheel" if from_wheel else "OLD's wheel"
    new_role = "--wheel" if wheel else "NEW's wheel"
    with open_release(old_path, Expected(name, old_version, role=old_role)) as old_files, \
            open_release(new_path, Expected(name, new_version, role=new_role)) as new_files:
        return _port(old_set, new_version, out, old_files, new_files, command, merge)


def _port(old_set: PatchSet, new_version: str, out: Path, old_files: ReleasedWheel, new_files: ReleasedWheel,
          command: str, merge: Merge) -> PortReport:
    every_target = old_set.targets + old_set.optional_targets
    old_state: dict[str, bytes] = {}
    new_state: dict[str, bytes | None] = {}
    checked, missing = [], []
    for target in every_target:
        if not old_files.has(target.path):
            raise PatchSetError(f"{old_set.spec}: {target.path} is not in {old_files.path.name}'s RECORD",
                                hint="the patch set is broken; check it with: t4patch validate")
        data = old_files.read(target.path)
        if sha256_bytes(data) != target.pristine_sha256:
            raise PatchSetError(
                f"{old_set.spec}: {target.path} in {old_files.path.name} is not the pristine file the set pins",
                hint=f"pass the wheel {old_set.spec} was made from with --from-wheel",
            )
        old_state[target.path] = data
        if new_files.has(target.path):
            new_state[target.path] = new_files.read(target.path)
            checked.append(target.path)
        else:
            new_state[target.path] = None
            missing.append(target.path)
    new_pristine = {p: d for p, d in new_state.items() if d is not None}

    results: list[tuple[Patch, list[FilePort]]] = []
    for patch in old_set.all_patches:
        ports: list[FilePort] = []
        for fd in patch.diffs:
            old_after = apply_file_diff(old_state[fd.path], fd)
            current = new_state[fd.path]
            if current is None:
                ports.append(missing_file(fd, f"{fd.path} is not in {new_files.path.name} (its RECORD has no such "
                                              "file)"))
            else:
                ported = port_file_diff(fd, old_state[fd.path], current, merge)
                ports.append(ported)
                new_state[fd.path] = ported.after
            old_state[fd.path] = old_after
        results.append((patch, ports))

    diffs, kept = _outcomes(results)
    report = PortReport(
        distribution=old_set.distribution, old_version=old_set.version, new_version=new_version,
        old_wheel=old_files.path, new_wheel=new_files.path, record_checked=tuple(checked), missing=tuple(missing),
        diffs=tuple(diffs), draft_dir=None, command=command,
    )
    if not kept:
        return report
    draft = _write_draft(old_set, new_version, out, kept, new_pristine, diffs, report.command)
    proven = load_patch_set(draft)
    with_all = proven.with_options(proven.option_names)
    proof = tuple(p.line for p in prove_against_wheel(with_all, new_files))
    compiled, errors = _compile(with_all, new_files)
    return replace(report, draft_dir=draft, proof=proof, compiled=tuple(compiled), compile_errors=tuple(errors))


def _outcomes(results: list[tuple[Patch, list[FilePort]]]) -> tuple[list[DiffPort], list[tuple[Patch, str, list[FilePort]]]]:
    diffs: list[DiffPort] = []
    kept: list[tuple[Patch, str, list[FilePort]]] = []
    for patch, ports in results:
        hunks = [h for f in ports for h in f.hunks]
        if hunks and all(h.method == "upstream" for h in hunks):
            diffs.append(DiffPort(patch.file, None, "upstream", tuple(ports), patch.optional))
            continue
        changed = [f for f in ports if f.before != f.after]
        if not changed:
            diffs.append(DiffPort(patch.file, None, "failed", tuple(ports), patch.optional))
            continue
        slug = patch.file.split("-", 1)[1]
        new_name = f"{len(kept) + 1:04d}-{slug}"
        outcome = "partial" if any(h.method == "failed" for h in hunks) else "ported"
        diffs.append(DiffPort(patch.file, new_name, outcome, tuple(ports), patch.optional))
        kept.append((patch, new_name, changed))
    return diffs, kept


def _compile(patch_set: PatchSet, files: ReleasedWheel) -> tuple[list[str], list[str]]:
    """Compile every patched ``.py`` target (syntax only, nothing is run): a merge can land cleanly and still
    leave code that does not parse, and that must be in the report, not found at import time."""
    from t4patch.patching.plan import transform_bytes

    done, errors = [], []
    for target in patch_set.targets:
        if not target.path.endswith(".py"):
            continue
        data = transform_bytes(patch_set, target.path, files.read(target.path), "apply")
        try:
            compile(data, target.path, "exec", dont_inherit=True)
        except SyntaxError as exc:
            errors.append(f"{target.path}:{exc.lineno}: {exc.msg}")
            continue
        done.append(target.path)
    return done, errors


def _write_draft(
    old_set: PatchSet,
    new_version: str,
    out: Path,
    kept: list[tuple[Patch, str, list[FilePort]]],
    new_pristine: dict[str, bytes],
    diffs: list[DiffPort],
    command: str,
) -> Path:
    """Write ``out/<distribution>/<new_version>/`` (manifest + diffs) atomically; never over a reviewed set."""
    final = out / old_set.distribution / str(Version(new_version))
    final_state: dict[str, bytes] = {}
    diff_texts: dict[str, str] = {}
    for _patch, new_name, ports in kept:
        diff_texts[new_name] = "".join(unified_diff(f.path, f.before, f.after) for f in ports)
        for f in ports:
            final_state[f.path] = f.after
    doc: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "distribution": old_set.distribution,
        "version": new_version,
        "packages": list(old_set.packages),
        "summary": old_set.summary,
        "draft": True,
        "requires": [
            {"distribution": c.distribution, "version": c.version, "why": c.why, "library": c.library}
            for c in old_set.requires
        ],
        "patch": [],
        "target": [],
    }
    for patch, new_name, _ports in kept:
        entry: dict[str, Any] = {"file": new_name, "title": patch.title, "fixes": patch.fixes, "gpus": patch.gpus}
        if patch.references:
            entry["references"] = list(patch.references)
        if patch.optional:
            entry["optional"] = patch.optional
        if patch.upstream:
            entry["upstream"] = patch.upstream.to_json()
        doc["patch"].append(entry)
    for path in sorted(final_state, key=lambda p: [t.path for t in old_set.targets + old_set.optional_targets].index(p)):
        doc["target"].append({
            "path": path,
            "pristine_sha256": sha256_bytes(new_pristine[path]),
            "patched_sha256": sha256_bytes(final_state[path]),
        })
    if not doc["requires"]:
        del doc["requires"]
    header = [
        f"t4patch patch set DRAFT: {old_set.distribution} {new_version}, written by `{command}`",
        f"on {datetime.date.today().isoformat()} from the {old_set.spec} set. apply refuses it while `draft = true`",
        "is set: review every diff against the NEW code, check that every title, fixes text and [[requires]]",
        f"below still holds for {new_version}, then delete the draft line (docs/maintaining.md).",
        "Port results:",
        *[f"  {d.old_file} -> {d.new_file or 'dropped'}: {d.note}" for d in diffs],
    ]
    header.extend(_old_header(old_set))
    try:
        _place(final, render_manifest(doc, header), diff_texts)
    except OSError as exc:  # ENOSPC, EIO, a directory made read-only meanwhile: one line, the old state kept
        raise T4PatchError(f"-o {out}: writing the draft {final} failed ({exc.strerror or exc}); what was there "
                           "is kept", hint=f"free space or fix permissions there, then: {command} -o {out}") from None
    return final


def _is_earlier_draft(place: Path) -> bool:
    """Whether ``place`` holds only what ``t4patch port`` writes: a manifest that loads with ``draft = true``
    and the diffs it names, nothing else (a user's notes or a reviewed set there are never replaced)."""
    try:
        found = load_patch_set(place)
    except T4PatchError:
        return False
    names = {MANIFEST_NAME, *(p.file for p in found.all_patches)}
    return found.draft and all(e.is_file() and not e.is_symlink() and e.name in names for e in place.iterdir())


def _check_draft_place(final: Path, retry: str) -> None:
    """Refuse before any work if ``DIR/<engine>/<version>/`` (or ``DIR/<engine>``) is not a place a draft may go."""
    engine_dir = final.parent
    for path in (engine_dir, final):
        if path.is_symlink():
            raise UsageError(f"-o: expected {path} to be a directory t4patch may write into, found a symlink (to "
                             f"{os.readlink(path)}); nothing was written", hint=retry)
        if path.exists() and not path.is_dir():
            raise UsageError(f"-o: expected {path} to be a directory t4patch may write into, found a file; nothing "
                             "was written", hint=retry)
    if final.is_dir() and not _is_earlier_draft(final):
        reviewed = (final / MANIFEST_NAME).is_file() and not _loads_as_draft(final)
        raise UsageError(
            f"{final} holds " + ("a reviewed patch set (no `draft = true`)" if reviewed else
                                 "files that are not an earlier draft of t4patch port") +
            ": expected an empty place for the draft (or an earlier draft, which is replaced); it is kept and "
            "nothing was written",
            hint="pass another -o DIR (the draft goes to DIR/<engine>/<version>/): " + retry,
        )


def _loads_as_draft(place: Path) -> bool:
    try:
        return load_patch_set(place).draft
    except T4PatchError:
        return False


def _place(final: Path, manifest: str, diff_texts: dict[str, str]) -> None:
    """Write the draft beside ``final`` and rename it into place; an earlier draft there (checked by
    :func:`_check_draft_place`) is renamed aside first and removed only after the new one is in place."""
    parent = final.parent
    parent.mkdir(parents=True, exist_ok=True)  # 0777 minus the umask, as every directory here
    staging = parent / f".t4patch-port-{secrets.token_hex(8)}"
    make_dir(staging)
    old = parent / f".t4patch-port-old-{secrets.token_hex(8)}"
    try:
        (staging / MANIFEST_NAME).write_text(manifest, encoding="utf-8")
        for new_name, text in diff_texts.items():
            (staging / new_name).write_text(text, encoding="utf-8")
        if final.exists():
            final.rename(old)
        staging.rename(final)
    except BaseException:
        if old.exists() and not final.exists():
            old.rename(final)  # the earlier draft back, as it was
        raise
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    if old.exists():
        shutil.rmtree(old)


def _old_header(old_set: PatchSet) -> list[str]:
    lines = []
    for line in (old_set.directory / MANIFEST_NAME).read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[1:].lstrip() if line.startswith("# ") or line == "#" else line[1:])
    return ([f"The {old_set.spec} set's header (check it for {old_set.distribution} as ported):"]
            + [f"  {line}" for line in lines]) if lines else []


__all__ = ["DiffPort", "PortReport", "nearest_shipped", "port"]
