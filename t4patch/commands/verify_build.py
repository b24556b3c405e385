"""`t4patch verify build PATH...`: does a built library/binary carry code that runs natively on sm_75?

Reads the CUDA fatbin sections and embedded PTX of each ELF file (or of every ELF file under a directory)
in Python, cross-checks with cuobjdump when it is on PATH, and fails with VerificationError when sm_75 code
is missing. Pointed at a build output directory holding ``build-record.json``, it applies that build's
recipe rules (which files must carry CUDA code, SASS or PTX text required).
"""

from __future__ import annotations

import argparse
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
    from t4patch.builder.artifacts import missing_path_hint, record_rules
    from t4patch.cuda.arch import parse_build_target
    from t4patch.errors import UsageError, VerificationError
    from t4patch.verify.artifacts.check import check_artifacts, collect_files, is_binary_candidate, render_report
    from t4patch.verify.artifacts.missing import advice

    for path in args.paths:
        if not path.exists():
            raise UsageError(f"{path} does not exist", hint=missing_path_hint(path, args.arch))
    rules = record_rules(args.paths)
    recorded, require, cuda_files, engine = rules.arch, rules.require, rules.cuda_files, rules.recipe
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
    report = check_artifacts(files, arch, require=require, cuda_files=cuda_files, use_cuobjdump=not args.no_cuobjdump,
                             ptx_only=rules.ptx_only)
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
