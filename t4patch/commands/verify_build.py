"""`t4patch verify build PATH...`: does a built library/binary carry code that runs natively on sm_75?

Reads the CUDA fatbin sections and embedded PTX of each ELF file (or of every ELF file under a directory)
in Python, cross-checks with cuobjdump when it is on PATH, and fails with VerificationError when sm_75 code
is missing. Pointed at a build output directory holding ``build-record.json``, it applies that build's
recipe rules (which files must carry CUDA code, SASS or PTX text required).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from t4patch.cli_options import add_json_option
from t4patch.output import emit_json, say


def configure_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "build", help="check built libraries/binaries for sm_75 SASS / PTX (fatbin reader, cuobjdump cross-check)",
        description="Check that built artifacts carry GPU code for the target architecture (default sm_75).",
    )
    parser.add_argument("paths", nargs="+", type=Path, metavar="PATH",
                        help="ELF library/binary, .a archive, .fatbin, or a directory (searched recursively)")
    parser.add_argument("--arch", default=None, help="architecture to require: 75, sm_75 or 7.5, one of the GPU table's "
                        "(default: the build record's, else 75)")
    parser.add_argument("--require", action="append", choices=("sass", "ptx-text"), default=None,
                        help="require sm_XY SASS / embedded PTX text somewhere (default: the build record's rules)")
    parser.add_argument("--no-cuobjdump", action="store_true", help="skip the cuobjdump cross-check")
    add_json_option(parser)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from t4patch.cuda.arch import parse_build_target
    from t4patch.errors import UsageError, VerificationError
    from t4patch.verify.artifacts.check import check_artifacts, collect_files, is_binary_candidate, render_report
    from t4patch.verify.artifacts.missing import advice

    for path in args.paths:
        if not path.exists():
            raise UsageError(f"{path} does not exist", hint="t4patch verify build ./t4patch-build/llama.cpp-sm75")
    recorded, require, cuda_files, engine = _record_rules(args.paths)
    arch = parse_build_target(args.arch if args.arch is not None else recorded or "75")
    if arch is None:
        raise UsageError("--arch cpu has no GPU code to verify", hint="t4patch verify build PATH --arch 75")
    if args.require is not None:
        require = tuple(args.require)
    files = collect_files(list(args.paths))
    rebuild = f"t4patch build {engine or 'llama.cpp'} --arch {arch.digits}"
    if not any(is_binary_candidate(f) or f.suffix == ".ptx" for f in files):
        # Nothing a build produces was found (an empty directory, a text file): a wrong path, not a failed
        # architecture check. A .ptx file passed by name is read as PTX text.
        where = ", ".join(str(p) for p in args.paths)
        raise UsageError(f"no ELF/.a/.fatbin files under {where}",
                         hint=f"pass a build output directory or its libraries/binaries, or build first: {rebuild}")
    report = check_artifacts(files, arch, require=require, cuda_files=cuda_files, use_cuobjdump=not args.no_cuobjdump)
    if args.json:
        emit_json("verify build", {"ok": report.ok, **report.to_dict()})
    else:
        say(render_report(report))
    if not report.ok:
        problems = report.all_problems()
        raise VerificationError(
            f"{arch.name} check failed: {problems[0]}" + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""),
            hint=advice([(r.path.name, r.summary) for r in report.files if r.problems], arch.capability,
                        rebuild if engine else None),
        )
    return 0


def _record_rules(paths: list[Path]) -> tuple[str | None, tuple[str, ...], tuple[Path, ...], str | None]:
    """(arch, require, CUDA artifact files, engine) from a build-record.json in a single directory argument."""
    if len(paths) != 1 or not paths[0].is_dir() or not (paths[0] / "build-record.json").is_file():
        return None, (), (), None
    from t4patch.builder.recipe import load_recipe
    from t4patch.errors import UsageError

    record_path = paths[0] / "build-record.json"
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
        recipe = load_recipe(str(record["recipe"]))
        arch = str(record["arch"])
        build_dir = Path(record["build_dir"])
    except (OSError, ValueError, KeyError) as exc:
        raise UsageError(f"{record_path} is not a t4patch build record ({exc})",
                         hint="pass the artifact files themselves") from exc
    if not build_dir.is_dir():  # the output directory was moved: the record's build dir is relative to it
        build_dir = paths[0] / recipe.build_dir
    cuda_files = tuple(Path(p).resolve() for pattern in recipe.cuda_artifacts for p in build_dir.glob(pattern))
    # a --ptx-only build carries PTX by design: the recipe's SASS requirement does not apply to it
    require = tuple(r for r in recipe.require if not (record.get("ptx_only") and r == "sass"))
    return arch, require, cuda_files, recipe.name
