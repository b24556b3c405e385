"""Peak memory of ``t4patch wheel`` against ``pip install --no-deps --target`` of the same wheel, side by side.

Why it exists: issue 22 found ``t4patch wheel vllm==0.33.0`` peaking at 745 MiB where pip's install of the same
336 MB wheel peaks at 59 MiB, because every member was read whole to hash it (and copied whole). The wheel module
(:mod:`t4patch.fileio.wheeltools`) now hashes and copies members in 1 MiB chunks; the bound it promises is
"within 3x pip's peak", and this script measures both in one run on the same machine and the same wheel file.

Each command runs as a child process; its peak resident set size is the ``ru_maxrss`` that ``os.wait4`` reports
for it (Linux: the child and every descendant it waited for, in KiB). pip's byte-compiling is part of pip's
install, so it is left on (the command is the one the issue names). The ratio is t4patch's peak over pip's.

Run from the repository root (the wheel comes from t4patch's wheel cache, downloaded there on first use):

    python -m tools.bench.wheel_memory [--spec vllm==0.33.0] [--wheel PATH] [--repeat N] [--bound 3.0] [--json]

``--t4patch-from DIR`` runs ``t4patch wheel`` from another checkout (in DIR, ``PYTHONPATH=DIR``; that child only), e.g.
a ``git worktree`` of an older commit, to measure the code before a change against pip in the same run.

Exit 0 when every t4patch run is within ``--bound`` times the smallest pip peak, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def _peak_mib(argv: list[str], label: str, checkout: Path | None = None) -> tuple[float, float]:
    """Run ``argv`` (in ``checkout``, first on its path, when given); return (peak RSS in MiB, wall seconds),
    printing a heartbeat while it runs."""
    start = time.monotonic()
    env = None if checkout is None else {**os.environ, "PYTHONPATH": str(checkout)}
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=checkout)
    done = threading.Event()

    def heartbeat() -> None:
        while not done.wait(10.0):
            print(f"  ... {label}: {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)

    threading.Thread(target=heartbeat, daemon=True).start()
    _pid, status, usage = os.wait4(proc.pid, 0)
    done.set()
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode("utf-8", "replace") if proc.stderr else ""
    if proc.returncode != 0:
        raise SystemExit(f"{label} failed (exit {proc.returncode}): {' '.join(argv)}\n{err[-2000:]}")
    return usage.ru_maxrss / 1024, time.monotonic() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.wheel_memory", description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", default="vllm==0.33.0", help="the release to build (default vllm==0.33.0)")
    parser.add_argument("--wheel", type=Path, help="the released wheel file (default: t4patch's wheel cache)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each command (default 1)")
    parser.add_argument("--bound", type=float, default=3.0, help="allowed ratio t4patch / pip (default 3.0)")
    parser.add_argument("--t4patch-from", type=Path, metavar="DIR",
                        help="run t4patch wheel from this checkout (in DIR with PYTHONPATH=DIR; that child only)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args(argv)

    from t4patch.fileio.wheeltools import find_release
    from t4patch.patching.release_spec import exact_release

    name, version = exact_release(args.spec, option="--spec", example="--spec {name}==<version>")
    wheel = find_release(name, version, args.wheel)
    t4patch = [sys.executable, "-m", "t4patch"]
    checkout = args.t4patch_from.resolve() if args.t4patch_from is not None else None
    rows: list[dict[str, object]] = []
    peaks: dict[str, list[float]] = {"pip": [], "t4patch": []}
    with tempfile.TemporaryDirectory(prefix="t4patch-wheel-memory-") as scratch:
        for run in range(1, args.repeat + 1):
            for tool, command in (
                ("pip install --no-deps --target", [sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                                                    "--disable-pip-version-check", "--target",
                                                    f"{scratch}/pip-{run}", str(wheel)]),
                ("t4patch wheel", [*t4patch, "wheel", args.spec, "--from-wheel", str(wheel), "-o",
                                   f"{scratch}/t4patch-{run}"]),
            ):
                print(f"run {run}: {tool} {wheel.name} ...", file=sys.stderr, flush=True)
                peak, wall = _peak_mib(command, tool, None if tool.startswith("pip") else checkout)
                peaks["pip" if tool.startswith("pip") else "t4patch"].append(peak)
                rows.append({"run": run, "tool": tool, "peak_rss_mib": round(peak, 1), "wall_s": round(wall, 1)})
    pip_peak, ours = min(peaks["pip"]), max(peaks["t4patch"])
    ratio = ours / pip_peak
    ok = ratio <= args.bound
    if args.json:
        print(json.dumps({"wheel": str(wheel), "t4patch_from": str(args.t4patch_from or ""), "size_mib": round(wheel.stat().st_size / 2**20, 1), "runs": rows,
                          "ratio": round(ratio, 2), "bound": args.bound, "within_bound": ok}, indent=2))
    else:
        source = f", t4patch from {args.t4patch_from}" if args.t4patch_from else ""
        print(f"{wheel.name} ({wheel.stat().st_size / 2**20:,.0f} MiB), Python {sys.version.split()[0]}{source}")
        print(f"{'run':>3}  {'command':<32} {'peak RSS':>10} {'wall':>8}")
        for r in rows:
            print(f"{r['run']:>3}  {r['tool']!s:<32} {r['peak_rss_mib']:>6} MiB {r['wall_s']:>6} s")
        print(f"ratio t4patch wheel / pip install: {ours:.1f} / {pip_peak:.1f} MiB = {ratio:.2f}x "
              f"({'within' if ok else 'OVER'} the {args.bound:g}x bound)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
