"""`t4patch verify marlin`: run the engine's Marlin W4A16 kernels on the GPU against t4patch's references.

Exit codes: 0 pass; 12 VerificationError (accuracy, repack, overflow, redirect); 13 DeterminismError (only
determinism failed); 11 NoGpuError; 10 MissingDependencyError (torch, vLLM's library, SGLang); 9
NotAppliedError (the sglang provider on an unpatched SGLang).

The kernels must run in the interpreter that has the engine and a CUDA torch. With ``--python EXE`` naming
another interpreter, this command re-runs itself there (t4patch is put on that interpreter's PYTHONPATH) and
passes its output and exit code through; ``--site-packages DIR`` puts DIR first on this interpreter's path.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from t4patch.cli_options import add_json_option, add_target_options
from t4patch.environment.target import resolve_target
from t4patch.output import emit_json, say

PROVIDERS = ("vllm", "sglang")


def configure_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "marlin",
        help="check the engine's Marlin W4A16 GEMM and repack on the GPU (Gemma 4 E2B shapes)",
        description=(
            "Run the engine's Marlin repack and GEMM on model shapes and compare them with t4patch's own "
            "references: the Marlin tile layout (exact), an fp16 matmul of the dequantized weights "
            "(mean|out-ref|/mean|ref| <= 0.04), bitwise determinism with atomic-add off, an overflow scan with "
            "Gemma-sized activations, and kernel time against fp16 matmul and the GPU's memory bandwidth."
        ),
    )
    parser.add_argument(
        "--provider",
        choices=PROVIDERS,
        default="vllm",
        help="vllm: vLLM 0.33's ops (or its compiled library); sglang: the patched SGLang functions (the redirect)",
    )
    parser.add_argument("--shapes", default="gemma4-e2b", metavar="TABLE", help="shape table in verify/shapes/")
    parser.add_argument("--m", dest="m_list", metavar="M,M,...", help="batch sizes (default 1,16,64,512; --quick: 1,64)")
    parser.add_argument("--quick", action="store_true", help="fewer batch sizes and timing replays")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic weights and activations")
    parser.add_argument(
        "--vllm-lib",
        metavar="PATH",
        help="vLLM's compiled vllm/_C_stable_libtorch.abi3.so (or .so.xz) to load instead of importing vllm",
    )
    parser.add_argument("--no-speed", action="store_true", help="skip the timing (accuracy checks only)")
    add_target_options(parser)
    add_json_option(parser)
    parser.set_defaults(func=run)
    return parser


def _other_interpreter(python: str) -> bool:
    """Whether ``python`` is a different environment. Venvs symlink the same base interpreter, so paths are
    not compared after resolving; the environment's ``sys.prefix`` is what tells two venvs apart."""
    try:
        proc = subprocess.run(
            [python, "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True, timeout=60, check=False
        )
    except OSError:
        return True  # let the re-run report the unusable interpreter
    if proc.returncode != 0:
        return True
    return Path(proc.stdout.strip()).resolve() != Path(sys.prefix).resolve()


def _forwarded_argv(args: argparse.Namespace) -> list[str]:
    argv = ["verify", "marlin", "--provider", args.provider, "--shapes", args.shapes, "--seed", str(args.seed)]
    if args.m_list:
        argv += ["--m", args.m_list]
    if args.quick:
        argv.append("--quick")
    if args.vllm_lib:
        argv += ["--vllm-lib", str(Path(args.vllm_lib).expanduser().resolve())]
    if args.no_speed:
        argv.append("--no-speed")
    if args.json:
        argv.append("--json")
    return argv


# t4patch's own dependencies; pure Python, lent to the other interpreter only where it lacks them
_OWN_DEPENDENCIES = ("packaging", "unidiff", "pynvml", "tomli")


def _rerun_in(python: str, args: argparse.Namespace) -> int:
    """Run this command again under ``python``: t4patch goes first on its path, t4patch's dependencies last
    (so that interpreter's own torch, packaging, ... win), each through a symlink so nothing else leaks in."""
    import importlib.util
    import tempfile

    from t4patch.errors import TargetEnvironmentError

    with tempfile.TemporaryDirectory(prefix="t4patch-rerun-") as tmp:
        front, back = Path(tmp) / "front", Path(tmp) / "back"
        front.mkdir()
        back.mkdir()
        (front / "t4patch").symlink_to(Path(__file__).resolve().parents[1], target_is_directory=True)
        for name in _OWN_DEPENDENCIES:
            spec = importlib.util.find_spec(name)
            if spec is None or not spec.origin:
                continue
            origin = Path(spec.origin)
            source = origin.parent if origin.name == "__init__.py" else origin
            (back / source.name).symlink_to(source)
        code = (
            f"import sys; sys.path.insert(0, {str(front)!r}); sys.path.append({str(back)!r}); "
            f"from t4patch.cli import main; raise SystemExit(main({_forwarded_argv(args)!r}))"
        )
        try:
            return subprocess.run([python, "-c", code], check=False).returncode
        except OSError as exc:
            raise TargetEnvironmentError(
                f"--python {python}: could not run it ({exc})", hint="pass e.g. --python /path/to/venv/bin/python"
            ) from exc


def run(args: argparse.Namespace) -> int:
    from t4patch.verify.marlin import report, runner

    if args.python and _other_interpreter(args.python):
        resolve_target(args.python, None)  # validates the interpreter with a clear error first
        return _rerun_in(args.python, args)
    target = resolve_target(None, args.site_packages)
    if args.site_packages:
        for root in reversed(target.search_path):
            if str(root) not in sys.path:
                sys.path.insert(0, str(root))
    request = runner.Request(
        provider=args.provider,
        target=target,
        shapes=args.shapes,
        m_values=runner.parse_m_list(args.m_list) if args.m_list else None,
        quick=args.quick,
        seed=args.seed,
        vllm_lib=args.vllm_lib,
        speed=not args.no_speed,
    )
    payload, failures = runner.run(request)
    if args.json:
        emit_json(report.COMMAND, payload)
    else:
        say(report.render_text(payload))
    report.raise_for_failures(failures)
    return 0
