"""`t4patch verify llama.cpp BUILD_DIR`: llama.cpp's test-backend-ops on the ops Gemma 4 E2B uses.

Runs the build's own correctness suite (every case compares the backend with llama.cpp's CPU backend) for the
op list in ``cases/llama-cpp-gemma4-e2b.toml``, with progress, and reports per op: passed / failed / not
supported, llama.cpp's own output for each failure, and for every not-supported case at a Gemma 4 E2B shape
what llama.cpp then does. On a T4 it runs the T4's code; a ``75-virtual`` build on a newer GPU runs the
Turing code paths through PTX JIT (ggml dispatches by the highest compiled architecture).

Exit codes: 0 pass; 12 VerificationError (a failing or crashed case, an op that matched no case, ran out of
time, or exited non-zero); 10 MissingDependencyError (no test-backend-ops in BUILD_DIR); 11 NoGpuError (the
CUDA backend was asked for and the build or machine has none).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from t4patch.cli_options import add_json_option
from t4patch.output import emit_json, say


def configure_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "llama.cpp",
        help="run llama.cpp's test-backend-ops on the ops Gemma 4 E2B uses (build with --with-tests)",
        description=(
            "Run llama.cpp's own backend-vs-CPU correctness suite (test-backend-ops) for the ops and layouts Gemma 4 "
            "E2B uses, and report passed / failed / not supported per op."
        ),
    )
    parser.add_argument("build_dir", type=Path, metavar="BUILD_DIR", nargs="?", help="llama.cpp build directory (with bin/test-backend-ops)")
    parser.add_argument("--from-log", type=Path, metavar="FILE", help="re-derive the report from a --log file of an earlier run (runs nothing)")
    parser.add_argument("--backend", default="CUDA0", help="test-backend-ops backend name (default CUDA0; CPU for a CPU build)")
    parser.add_argument("--ops", metavar="NAME,...", help="only these entries of the op list (their names or -o filters)")
    parser.add_argument("--timeout", type=float, default=600.0, metavar="S", help="time limit per op entry (default 600 s)")
    parser.add_argument("--time-budget", type=float, metavar="S", help="seconds for the whole run; ops that cannot start in it are reported as not run")
    parser.add_argument("--log", type=Path, metavar="FILE", help="append every run's command line and llama.cpp's full output here")
    parser.add_argument("--list", action="store_true", help="print the op list and exit")
    add_json_option(parser)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    import sys

    from t4patch.errors import NoGpuError, UsageError
    from t4patch.output import table
    from t4patch.verify.llamacpp import runner

    ops = runner.load_ops()
    if args.from_log:
        return _from_log(args, ops)
    if args.build_dir is None:
        raise UsageError("expected BUILD_DIR (or --from-log FILE)", hint="t4patch verify llama.cpp ./build")
    if args.list:
        say(table(["name", "-o", "-p"], [[s.name, s.o, s.p or ""] for s in ops.ops]))
        return 0
    if args.timeout <= 0:
        raise UsageError(f"--timeout {args.timeout}: expected a positive number of seconds", hint="--timeout 600")
    selected = tuple(x.strip() for x in args.ops.split(",")) if args.ops else ()
    known = {s.name for s in ops.ops} | {s.o for s in ops.ops}
    unknown = [x for x in selected if x not in known]
    if unknown:
        raise UsageError(f"--ops {args.ops}: {', '.join(unknown)} not in the op list", hint="t4patch verify llama.cpp BUILD_DIR --list")
    binary = runner.find_binary(args.build_dir)
    build = runner.build_info(args.build_dir)
    capability, gpu = runner.gpu_capability()
    if args.backend.upper().startswith("CUDA"):
        if build.get("GGML_CUDA", "").upper() in ("OFF", "FALSE", "0"):
            raise NoGpuError(f"{args.build_dir} is a CPU build (GGML_CUDA=OFF): it has no {args.backend} backend",
                             hint="build with CUDA (t4patch build llama.cpp --with-tests), or pass --backend CPU")
        if capability is None:
            raise NoGpuError(f"--backend {args.backend}: no NVIDIA GPU found on this machine", hint="run it on the GPU host, or pass --backend CPU")

    def progress(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    if args.log:
        runner.write_build_info(args.log, {"build": build, "gpu": gpu, "capability": capability, "backend": args.backend,
                                           "binary": str(binary)})
    results = runner.run(binary, args.backend, ops, timeout=args.timeout, selected=selected, progress=progress, log=args.log, budget=args.time_budget)
    op_json = [r.to_json() for r in results]
    if args.backend.upper().startswith("CUDA") and not any(r.parsed.cases for r in results) \
            and all(args.backend not in r.parsed.backends for r in results):
        raise NoGpuError(f"{binary}: test-backend-ops ran no case on {args.backend} (no such backend in this build or machine)",
                         hint="check nvidia-smi, and that the build has GGML_CUDA=ON")
    from t4patch.verify.llamacpp import report

    payload = report.build_payload(ops, op_json, build, capability, gpu, args.backend, str(binary))
    return _emit(args, payload)


def _from_log(args: argparse.Namespace, ops) -> int:
    from t4patch.errors import UsageError
    from t4patch.verify.llamacpp import runner

    try:
        text = args.from_log.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise UsageError(f"--from-log {args.from_log}: cannot read it ({exc})", hint="pass the file a --log run wrote") from exc
    info = runner.read_build_info(text, args.from_log)
    results = runner.from_log(text, ops)
    if not results:
        raise UsageError(f"--from-log {args.from_log}: no op runs in it", hint="pass the file a --log run wrote")
    from t4patch.verify.llamacpp import report

    payload = report.build_payload(ops, [r.to_json() for r in results], info.get("build", {}), info.get("capability"),
                                   info.get("gpu"), info.get("backend") or "?", info.get("binary") or "?")
    payload["derived_from_log"] = str(args.from_log)
    return _emit(args, payload)


def _emit(args: argparse.Namespace, payload: dict) -> int:
    from t4patch.verify.llamacpp import report

    if args.json:
        emit_json(report.COMMAND, payload)
    else:
        say(report.render_text(payload))
    report.raise_for(payload)
    return 0
