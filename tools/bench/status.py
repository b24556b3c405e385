"""Wall time of `t4patch status` against `pip show vllm sglang`, side by side in one run.

Both are whole-process runs on the same environment, alternated so that caches and machine load affect them
alike; the report gives medians and the ratio (goal: t4patch status <= 1.0x pip show). Run:

    python -m tools.bench.status [--site-packages DIR | --python EXE] [--runs 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from t4patch.commands.engine_table import ENGINES


def timed(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode not in (0, 1):  # pip show exits 1 when a name is not installed
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()[-300:]}")
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--site-packages", metavar="DIR")
    group.add_argument("--python", metavar="EXE", default=None)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args(argv)

    env = dict(os.environ)
    py = args.python or sys.executable
    target = ["--python", py]
    if args.site_packages:
        # pip show looks at sys.path; PYTHONPATH puts the directory there for both commands alike.
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [args.site_packages, env.get("PYTHONPATH", "")]))
        target = ["--site-packages", args.site_packages]
    t4 = [sys.executable, "-m", "t4patch", "status", *target]
    pip = [py, "-m", "pip", "show", "--disable-pip-version-check", *(engine.name for engine in ENGINES)]
    if args.site_packages:
        pip = [sys.executable, *pip[1:]]

    timed(t4, env), timed(pip, env)  # warm the page cache for both
    t4_times, pip_times = [], []
    for _ in range(args.runs):
        t4_times.append(timed(t4, env))
        pip_times.append(timed(pip, env))
    t4_med, pip_med = statistics.median(t4_times), statistics.median(pip_times)
    print(f"runs: {args.runs} each, alternated")
    print(f"t4patch status     median {t4_med * 1000:7.1f} ms  (min {min(t4_times) * 1000:.1f})")
    print(f"pip show engines   median {pip_med * 1000:7.1f} ms  (min {min(pip_times) * 1000:.1f})")
    print(f"ratio t4patch/pip: {t4_med / pip_med:.2f}x  (goal <= 1.00x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
