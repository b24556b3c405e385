"""What ``t4patch verify build`` takes from a build: the record's rules, and where to look when a path is wrong.

Pointed at one build output directory holding ``build-record.json``, the check applies that build's recipe rules
(which files must carry CUDA code, SASS required or not, a PTX-only build). The record is read back from disk,
so it goes through :func:`t4patch.builder.record.read_record`: a damaged record is a one-line UsageError.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from t4patch.builder.record import RECORD_FILE, read_record

_OUTPUT_NAME = re.compile(r"^(?P<recipe>.+?)-(?:sm(?P<arch>\d+)(?P<virtual>-virtual)?|cpu)$")


@dataclass(frozen=True)
class RecordRules:
    arch: str | None  # the record's arch ("75"), None without a record
    require: tuple[str, ...]
    cuda_files: tuple[Path, ...]
    recipe: str | None
    ptx_only: bool


NO_RECORD = RecordRules(None, (), (), None, False)


def record_rules(paths: list[Path]) -> RecordRules:
    """The rules of the build whose output directory is the single argument, or NO_RECORD."""
    if len(paths) != 1 or not paths[0].is_dir() or not (paths[0] / RECORD_FILE).is_file():
        return NO_RECORD
    from t4patch.builder.recipe import load_recipe

    record = read_record(paths[0] / RECORD_FILE, hint="pass the artifact files themselves, or rebuild into "
                         "that directory")
    recipe = load_recipe(record.recipe)
    build_dir = Path(record.build_dir)
    if not build_dir.is_dir():  # the output directory was moved: the record's build dir is relative to it
        build_dir = paths[0] / recipe.build_dir
    cuda_files = tuple(Path(p).resolve() for pattern in recipe.cuda_artifacts for p in build_dir.glob(pattern))
    # a PTX-only build carries PTX by design: the recipe's SASS requirement does not apply to it
    require = tuple(r for r in recipe.require if not (record.ptx_only and r == "sass"))
    return RecordRules(record.arch, require, cuda_files, recipe.name, record.ptx_only)


def missing_path_hint(path: Path, arch: str | None, cwd: Path | None = None) -> str:
    """The next command for ``verify build PATH`` when PATH does not exist, from what the user gave.

    A path named like a build output (``<recipe>-sm<NN>[-virtual]``) gets the build that makes it there; otherwise
    the build outputs that do exist under ./t4patch-build/ are offered; the user's ``--arch`` is kept."""
    from t4patch.builder.recipe import load_recipe, recipe_names

    names = recipe_names()
    arch_opt = f" --arch {arch}" if arch else ""
    quoted = shlex.quote(str(path))
    match = _OUTPUT_NAME.match(path.name)
    if match and match.group("recipe") in names:
        target = arch or match.group("arch") or "cpu"
        extra = " --ptx-only" if match.group("virtual") else ""
        return (f"nothing was built there yet; build it: t4patch build {match.group('recipe')} --arch {target}{extra} "
                f"--out {quoted}; then: t4patch verify build {quoted}{arch_opt}")
    if path.parent.name in names and load_recipe(path.parent.name).extension is not None:
        return f"it builds into {path.parent}/<key> and prints the library's path: t4patch build {path.parent.name}"
    outputs = sorted(d for d in ((cwd or Path.cwd()) / "t4patch-build").glob("*") if (d / RECORD_FILE).is_file())
    if outputs:
        shown = ", ".join(str(d) for d in outputs[:4]) + (f" (+{len(outputs) - 4} more)" if len(outputs) > 4 else "")
        return f"check the path (build outputs here: {shown}); e.g.: t4patch verify build {shlex.quote(str(outputs[0]))}{arch_opt}"
    return (f"check the path: pass a build output directory or the built files; a build writes one under "
            f"./t4patch-build/: t4patch build llama.cpp{arch_opt}")
