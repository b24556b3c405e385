"""The artifact check: does what was built carry code that runs natively on the target GPU?

Run after every build and by ``t4patch verify build PATH``. Rules, for target sm_XY:

* a file with fatbin code must hold SASS for sm_XY, and in every fatbin container (one per CUDA
  translation unit): a container with only PTX is JIT-compiled at first use, a container with SASS for
  other GPUs only does not run at all; a build that is PTX only by design (``--ptx-only``, a torch
  extension) must instead hold PTX for compute_XY and nothing else, no SASS at all;
* PTX text embedded outside fatbins (candle) must target sm_XY or lower (the driver cannot JIT PTX for a
  newer target), and the build must contain some for sm_XY when the recipe requires ``ptx-text``;
* a recipe's ``require`` (``sass`` / ``ptx-text``) must be met somewhere, and the files it names as CUDA
  artifacts must carry CUDA code at all;
* when ``cuobjdump`` is on PATH its ``--list-elf`` / ``--list-ptx`` must name the same architectures.

Anything else fails loudly with VerificationError; nothing is inferred from build flags.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from t4patch.cuda.arch import Arch
from t4patch.cuda.cuobjdump import find_cuobjdump, list_code
from t4patch.cuda.fatbin import FatbinSummary, arch_sorted, cuda_architectures
from t4patch.fileio.hashing import sha256_file

_SKIP_DIRS = frozenset({".git", "CMakeFiles", "deps", "incremental", ".fingerprint"})


@dataclass(frozen=True)
class ArtifactResult:
    path: Path
    size: int
    sha256: str
    summary: FatbinSummary
    cuobjdump: dict[str, list[str]] | None  # {"sass": [...], "ptx": [...]} when cuobjdump ran
    problems: tuple[str, ...]
    notes: tuple[str, ...]

    def to_dict(self) -> dict[str, object]:
        doc: dict[str, object] = {"path": str(self.path), "size": self.size, "sha256": self.sha256}
        doc["cuda"] = self.summary.to_dict()
        if self.cuobjdump is not None:
            doc["cuobjdump"] = self.cuobjdump
        doc["problems"] = list(self.problems)
        doc["notes"] = list(self.notes)
        return doc


@dataclass(frozen=True)
class ArtifactReport:
    arch: Arch
    files: tuple[ArtifactResult, ...]
    problems: tuple[str, ...]  # build-level problems (requirements not met anywhere)
    cuobjdump: str | None  # path of the cuobjdump used, or None
    require: tuple[str, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return not self.problems and all(not f.problems for f in self.files)

    def all_problems(self) -> list[str]:
        out = [f"{f.path.name}: {p}" for f in self.files for p in f.problems]
        return out + list(self.problems)  # the specific (per-file) problems first

    def to_dict(self) -> dict[str, object]:
        return {
            "arch": self.arch.name,
            "ok": self.ok,
            "require": list(self.require),
            "cuobjdump": self.cuobjdump,
            "problems": self.all_problems(),
            "files": [f.to_dict() for f in self.files],
        }


def is_binary_candidate(path: Path) -> bool:
    """ELF files, ar archives and raw fatbins: the files a build check reads."""
    try:
        with path.open("rb") as fh:
            head = fh.read(8)
    except OSError:
        return False
    return head[:4] == b"\x7fELF" or head == b"!<arch>\n" or head[:4] == b"\x50\xed\x55\xba"


def collect_files(paths: list[Path]) -> list[Path]:
    """Expand directories to the ELF/archive/fatbin files inside (recursively); symlinks listed once."""
    seen: dict[Path, None] = {}
    for path in paths:
        if path.is_dir():
            for dirpath, dirnames, filenames in os.walk(path):
                parent = Path(dirpath).name
                # Intermediate outputs (objects, cargo's deps/ and build-script trees) are not artifacts.
                dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS
                                     and not (d == "build" and parent in ("release", "debug")))
                for name in sorted(filenames):
                    full = Path(dirpath) / name
                    if full.is_file() and is_binary_candidate(full):
                        seen.setdefault(full.resolve(), None)
        elif path.is_file():
            seen.setdefault(path.resolve(), None)
    return list(seen)


def check_file(path: Path, arch: Arch, *, cuobjdump: str | None, must_have_cuda: bool = False,
               ptx_only: bool = False) -> ArtifactResult:
    """Check one file for ``arch`` code; ``cuobjdump`` is the tool to cross-check with (None: no cross-check).

    ``ptx_only``: the build is PTX for the arch by design (``--ptx-only``, a torch extension), so its fatbin
    code must be exactly PTX for compute_XY and no SASS at all (any SASS would run instead of the JIT-compiled
    Turing code on the GPU it is for)."""
    size = path.stat().st_size
    digest = sha256_file(path)
    problems: list[str] = []
    notes: list[str] = []
    summary = cuda_architectures(path)  # ELF, archive, fatbin; any other file (a .ptx) is scanned for PTX text
    want_sass = arch.sass
    number = arch.capability
    cuobj = None
    if summary.containers and ptx_only:
        want_ptx = f"compute_{number}"
        if summary.sass:
            problems.append(f"a PTX-only build carries SASS for {', '.join(arch_sorted(summary.sass))}: expected "
                            f"PTX {want_ptx} only")
        if set(summary.ptx) != {want_ptx}:
            found = ", ".join(arch_sorted(summary.ptx)) or "none"
            problems.append(f"expected PTX for {want_ptx} only, found PTX {found}")
    elif summary.containers:
        if want_sass not in summary.sass:
            what = (f"SASS only for {', '.join(arch_sorted(summary.sass))}" if summary.sass
                    else "no SASS at all")
            # The driver JIT-compiles PTX for the GPU's own or an older architecture only: PTX for a target
            # above sm_XY cannot run on it at all.
            jitable = arch_sorted(p for p in summary.ptx if int(re.sub(r"\D", "", p)) <= number)
            newer = arch_sorted(p for p in summary.ptx if int(re.sub(r"\D", "", p)) > number)
            jit = (f"; PTX {', '.join(jitable)} would be JIT-compiled at first run" if jitable else "") + (
                f"; PTX {', '.join(newer)} cannot run on {want_sass}" if newer else "")
            problems.append(f"no {want_sass} SASS in {summary.containers} fatbin container(s) ({what}{jit})")
        else:
            missing = summary.containers_without_sass(number)
            if missing:
                problems.append(f"{missing} of {summary.containers} fatbin containers carry no {want_sass} SASS")
        if summary.undecoded:
            notes.append(f"{summary.undecoded} fatbin entries not decoded (no decoder for "
                         f"{', '.join(summary.decoders_missing) or 'their compression'}); their architectures come "
                         "from the entry headers only")
    newer = arch_sorted(t for t in summary.ptx_text if int(re.sub(r"\D", "", t)) > number)
    if newer:
        problems.append(f"embedded PTX targets {', '.join(newer)}, which an {want_sass} GPU cannot JIT-compile "
                        f"({sum(summary.ptx_text[t] for t in newer)} module(s))")
    if must_have_cuda and not summary.has_cuda_code:
        problems.append("carries no CUDA code at all (no fatbin, no embedded PTX)")
    if cuobjdump and summary.containers:
        listing = list_code(path, tool=cuobjdump)
        if listing is None:
            notes.append(f"cuobjdump could not read {path.name}; no cross-check")
        else:
            cuobj = listing.to_dict()
            mine_sass = arch_sorted(summary.sass)
            mine_ptx = arch_sorted(summary.ptx)
            if cuobj["sass"] != mine_sass or cuobj["ptx"] != mine_ptx:
                problems.append(f"cuobjdump disagrees: it lists SASS {cuobj['sass']} PTX {cuobj['ptx']}, "
                                f"t4patch read SASS {mine_sass} PTX {mine_ptx}")
    return ArtifactResult(path, size, digest, summary, cuobj, tuple(problems), tuple(notes))


def check_artifacts(
    files: list[Path],
    arch: Arch,
    *,
    require: tuple[str, ...] = (),
    cuda_files: tuple[Path, ...] = (),
    use_cuobjdump: bool = True,
    ptx_only: bool = False,
) -> ArtifactReport:
    """Check ``files`` for ``arch`` code (module docstring has the rules)."""
    cuobjdump = find_cuobjdump() if use_cuobjdump else None
    cuda_set = {p.resolve() for p in cuda_files}
    results = [check_file(p, arch, cuobjdump=cuobjdump, must_have_cuda=p.resolve() in cuda_set, ptx_only=ptx_only)
               for p in files]
    problems: list[str] = []
    summaries = [r.summary for r in results]
    if not files:
        problems.append("no files to check")
    elif not any(s.has_cuda_code for s in summaries):
        problems.append(f"none of the {len(files)} file(s) carries CUDA code (no fatbin, no embedded PTX): "
                        "this is not a CUDA build")
    if "sass" in require and not any(arch.sass in s.sass for s in summaries):
        problems.append(f"the build requires {arch.sass} SASS and no file has any")
    if "ptx-text" in require and not any(s.ptx_text.get(arch.sass) for s in summaries):
        found = sorted({t for s in summaries for t in s.ptx_text})
        problems.append(f"the build requires embedded PTX with `.target {arch.sass}` and found "
                        f"{'targets ' + ', '.join(found) if found else 'no embedded PTX'}")
    return ArtifactReport(arch, tuple(results), tuple(problems), cuobjdump, tuple(require))


def render_report(report: ArtifactReport) -> str:
    """Text table + problem lines for people."""
    from t4patch.output import table

    rows = []
    for r in report.files:
        s = r.summary
        if not s.has_cuda_code:
            rows.append((r.path.name, "-", "-", "-", "no CUDA code", _human(r.size)))
            continue
        ptx_text = ", ".join(f"{k} x{s.ptx_text[k]}" for k in arch_sorted(s.ptx_text)) or "-"
        status = "FAIL" if r.problems else "ok"
        rows.append((r.path.name, ", ".join(arch_sorted(s.sass)) or "-", ", ".join(arch_sorted(s.ptx)) or "-", ptx_text, status,
                     _human(r.size)))
    lines = [table(("file", "SASS", "PTX (fatbin)", "PTX text", report.arch.name, "size"), rows)]
    for r in report.files:
        for note in r.notes:
            lines.append(f"note: {r.path.name}: {note}")
    lines.append(f"cross-check: {'cuobjdump ' + report.cuobjdump if report.cuobjdump else 'cuobjdump not on PATH, none'}")
    for problem in report.all_problems():
        lines.append(f"problem: {problem}")
    lines.append(f"result: {report.arch.name} code present" if report.ok else "result: FAILED")
    return "\n".join(lines)


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"
