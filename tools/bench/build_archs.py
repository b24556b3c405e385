"""Build time of llama.cpp for sm_75 (the recipe) against llama.cpp's own default CUDA architecture list.

Why it exists: the recipe sets ``CMAKE_CUDA_ARCHITECTURES=75`` because llama.cpp's non-native default list carries
Turing only as ``75-virtual`` (PTX, JIT-compiled at the first run). This benchmark measures what that choice
costs or saves in build time, and shows with the artifact check what each build ships for a T4.

Both variants are planned by ``t4patch.builder.plan`` from the same recipe, source and job count; the only
difference is that the ``default`` variant's configure command leaves ``CMAKE_CUDA_ARCHITECTURES`` unset, so
ggml-cuda's CMakeLists picks its default list (logged by CMake as ``Using CMAKE_CUDA_ARCHITECTURES=...``).

A build of the default list can outlast one sitting (a CI job, a lent machine's 10-minute call), so the run is
resumable: ``--time-limit`` stops the build at a deadline (ninja keeps every finished object) and the same
command continues later. Two measures are reported per variant:

* wall time: configure plus the wall time of every build sitting. A stopped sitting throws away the compiles in
  flight, so a variant built in several sittings is reported as an upper bound;
* compile time: the sum of ninja's per-edge durations from ``.ninja_log`` (finished edges only), which does not
  depend on how the build was split. CUDA objects (``*.cu.o``) are also summed on their own.

Run (repeat the same command until it prints the comparison; it exits 75 while a build is unfinished):

    python -m tools.bench.build_archs --source LLAMA_CPP_DIR --work DIR [--jobs N] [--time-limit S] [--json]

``--from-logs SM75_LOG DEFAULT_LOG...`` builds nothing and compares saved ``.ninja_log`` files object by object
(how docs/verification's numbers are re-derived from the logs kept there), including default-list builds that
were stopped early: the objects they did not finish are listed, and the total is then only an estimate.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from t4patch.builder.plan import BuildPlan, plan_build
from t4patch.errors import BuildError, T4PatchError, UsageError
from t4patch.fileio.atomic import write_json_atomic

RECIPE = "llama.cpp"
ARCH_FLAG = "-DCMAKE_CUDA_ARCHITECTURES="
VARIANTS = ("sm75", "default")
TARGET = "sm_75"  # the architecture both variants must run on (parsed by t4patch.cuda.arch)
STATE = "bench-state.json"
EXIT_UNFINISHED = 75  # sysexits EX_TEMPFAIL: stopped at --time-limit, run the same command again
_CMAKE_ARCHS = re.compile(r"Using CMAKE_CUDA_ARCHITECTURES=(\S+)")


@dataclass(frozen=True)
class NinjaEdge:
    start_ms: int
    end_ms: int
    output: str
    command_hash: str

    @property
    def seconds(self) -> float:
        return (self.end_ms - self.start_ms) / 1000.0


def parse_ninja_log(path: Path) -> list[NinjaEdge]:
    """The edges of a ``.ninja_log`` (v5 and later: start, end, mtime, output, command hash; tab-separated)."""
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    if not lines or not re.fullmatch(r"# ninja log v(\d+)", lines[0].strip()) or int(lines[0].split("v")[-1]) < 5:
        raise T4PatchError(f"{path}: expected a ninja log v5 or later, found {lines[0][:40] if lines else 'an empty file'!r}",
                           hint="pass a .ninja_log written by ninja 1.10 or newer (or delete that build directory)")
    edges = []
    for number, line in enumerate(lines[1:], 2):
        fields = line.split("\t")
        if len(fields) != 5:
            continue  # a line cut short when ninja was killed mid-write
        try:
            edges.append(NinjaEdge(int(fields[0]), int(fields[1]), fields[3], fields[4]))
        except ValueError:
            raise T4PatchError(f"{path}:{number}: expected integer start and end times, found "
                               f"{fields[0][:20]!r} and {fields[1][:20]!r}",
                               hint="the file is damaged or not a ninja log; pass the build directory's .ninja_log") from None
    return edges


def edge_key(edge: NinjaEdge) -> str:
    return f"{edge.output}\t{edge.command_hash}\t{edge.start_ms}\t{edge.end_ms}"


def summarize_edges(edges: list[NinjaEdge]) -> dict[str, float | int]:
    """Compile time of finished edges: all of them, and the CUDA objects alone."""
    cuda = [e for e in edges if e.output.endswith(".cu.o")]
    return {
        "edges": len(edges),
        "edge_seconds": round(sum(e.seconds for e in edges), 1),
        "cuda_objects": len(cuda),
        "cuda_edge_seconds": round(sum(e.seconds for e in cuda), 1),
        "longest_edge_seconds": round(max((e.seconds for e in edges), default=0.0), 1),
    }


def object_family(output: str) -> str:
    """The kind of CUDA translation unit, for the per-family ratios (template instances dominate the build)."""
    name = output.rsplit("/", 1)[-1]
    for family in ("fattn-mma", "fattn-tile", "fattn-vec", "mmq-instance", "mmf-instance"):
        if name.startswith(family):
            return family
    return "other"


def compare_objects(sm75: list[NinjaEdge], default: list[list[NinjaEdge]], *,
                    missing_ratio: float | None = None) -> dict:
    """Per-object compile times of CUDA objects finished in both variants.

    ``default`` may hold several logs (sittings, or builds stopped early): an object finished in more than one
    counts with its mean time. Objects the sm75 log has and no default log has are listed as missing with
    their sm75 time, and the default build's total CUDA compile time is estimated: the missing objects' sm75
    time times ``missing_ratio`` (a ratio measured for them elsewhere) or, without it, times the common ratio.
    The estimate is None when nothing is missing or there is nothing to scale by."""
    base = {e.output: e.seconds for e in sm75 if e.output.endswith(".cu.o")}
    runs: dict[str, list[float]] = {}
    for log in default:
        for e in log:
            if e.output.endswith(".cu.o"):
                runs.setdefault(e.output, []).append(e.seconds)
    other = {k: sum(v) / len(v) for k, v in runs.items()}
    common = sorted(k for k in other if k in base)
    missing = sorted(k for k in base if k not in other)
    a, b = sum(base[k] for k in common), sum(other[k] for k in common)
    per_object = sorted(other[k] / base[k] for k in common if base[k] > 0)
    families: dict[str, list[float]] = {}
    for k in common:
        f = families.setdefault(object_family(k), [0, 0.0, 0.0])
        f[0] += 1
        f[1] += base[k]
        f[2] += other[k]
    doc: dict = {
        "sm75_objects": len(base),
        "common_objects": len(common),
        "sm75_seconds": round(a, 1),
        "default_seconds": round(b, 1),
        "ratio": round(b / a, 2) if a else None,
        "per_object_ratio": {"median": round(statistics.median(per_object), 2) if per_object else None,
                             "min": round(per_object[0], 2) if per_object else None,
                             "max": round(per_object[-1], 2) if per_object else None},
        "families": {name: {"objects": n, "sm75_seconds": round(x, 1), "default_seconds": round(y, 1),
                            "ratio": round(y / x, 2) if x else None}
                     for name, (n, x, y) in sorted(families.items())},
        "missing": {"objects": len(missing), "sm75_seconds": round(sum(base[k] for k in missing), 1),
                    "families": {f: sum(1 for k in missing if object_family(k) == f)
                                 for f in sorted({object_family(k) for k in missing})}},
    }
    scale = missing_ratio if missing_ratio is not None else (b / a if a else None)
    doc["estimate"] = None
    if missing and scale is not None:
        total = b + sum(base[k] for k in missing) * scale
        doc["estimate"] = {"missing_ratio": round(scale, 2),
                           "ratio_source": "given (--missing-ratio)" if missing_ratio is not None else "common objects",
                           "default_cuda_seconds": round(total, 1),
                           "ratio_all_cuda": round(total / sum(base.values()), 2)}
    return doc


def default_list_plan(plan: BuildPlan) -> BuildPlan:
    """The same plan with ``-DCMAKE_CUDA_ARCHITECTURES=...`` dropped from the configure step (exactly once)."""
    steps = []
    removed = 0
    for step in plan.steps:
        if step.name == "configure":
            kept = tuple(a for a in step.argv if not (isinstance(a, str) and a.startswith(ARCH_FLAG)))
            removed += len(step.argv) - len(kept)
            step = dataclasses.replace(step, argv=kept)
        steps.append(step)
    if removed != 1:
        raise T4PatchError(f"the {plan.recipe.name} recipe's configure step should set {ARCH_FLAG}... once; found it "
                           f"{removed} times", hint="fix recipes/llama.cpp.toml or this benchmark together")
    return dataclasses.replace(plan, steps=tuple(steps))


def variant_plan(variant: str, *, source: Path, work: Path, jobs: int, nvcc: str | None) -> BuildPlan:
    from t4patch.builder.recipe import load_recipe

    plan = plan_build(load_recipe(RECIPE), arch=TARGET, jobs=jobs, out=work / variant, source_dir=source, nvcc=nvcc)
    return default_list_plan(plan) if variant == "default" else plan


def load_state(path: Path) -> dict:
    if path.exists():
        return json.loads(path.read_text())
    return {"configure_seconds": None, "sittings": [], "done": False, "cmake_architectures": None}


def save_state(path: Path, state: dict) -> None:
    write_json_atomic(path, state)


def run_until(argv: tuple[str, ...], cwd: Path, env: dict[str, str], log: Path, deadline: float) -> tuple[int | None, float]:
    """Run one command with its output appended to ``log``; stop its process group at ``deadline``.

    Returns (exit code or None when stopped, seconds). For a stopped command the seconds end at the deadline,
    not after the stop, so that a stopped sitting's time is the time the build really had."""
    from t4patch.builder.runner import stop_process_group

    started = time.monotonic()
    with log.open("ab") as fh:
        fh.write(f"\n### bench {time.strftime('%Y-%m-%d %H:%M:%S')} argv: {argv!r}\n".encode())
        fh.flush()
        proc = subprocess.Popen(list(argv), cwd=cwd, env={**os.environ, **env}, stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            return proc.wait(timeout=max(1.0, deadline - time.monotonic())), time.monotonic() - started
        except subprocess.TimeoutExpired:
            stopped_at = time.monotonic() - started
            stop_process_group(proc)
            return None, stopped_at
        except BaseException:
            stop_process_group(proc)
            raise


def advance(variant: str, plan: BuildPlan, deadline: float, say) -> dict:
    """Configure (once) and build ``variant`` until done or ``deadline``; the state is saved after each sitting."""
    plan.out.mkdir(parents=True, exist_ok=True)
    state_path = plan.out / STATE
    state = load_state(state_path)
    configure, build = (next(s for s in plan.steps if s.name == n) for n in ("configure", "build"))
    # Sittings only add up when they continue the same build: same source, flags, targets and job count.
    settings = {"configure": list(configure.bind({})), "build": list(build.bind({})), "env": dict(sorted(configure.env.items()))}
    if state["sittings"] and "settings" not in state:
        raise UsageError(f"{state_path} records sittings but not the settings they were built with (an older "
                         "t4patch wrote it); they cannot be checked against this run",
                         hint=f"use another --work directory, or delete {plan.out}")
    if state.setdefault("settings", settings) != settings:
        differ = ", ".join(f"{k} step" if k != "env" else "environment" for k in settings
                           if state["settings"].get(k) != settings[k])
        raise UsageError(f"{plan.out} holds a {variant} build made with other settings (the {differ} differ: source, "
                         "flags or --jobs changed); its sittings cannot be added to this one",
                         hint=f"use another --work directory, or delete {plan.out}")
    if state["done"]:
        return state
    log = plan.out / "build.log"
    if state["configure_seconds"] is None:
        if time.monotonic() >= deadline:
            return state  # no time left: the next run configures
        say(f"{variant}: configure")
        code, seconds = run_until(configure.bind({}), configure.cwd, configure.env, log, deadline)
        if code is None:
            return state  # stopped at the time limit: the next run configures again from the start
        if code != 0:
            raise BuildError(f"{variant}: configure failed (exit {code}); log: {log}",
                             hint="read the log's last lines, fix the cause, then run the same command again")
        match = None
        for match in _CMAKE_ARCHS.finditer(log.read_text(errors="replace")):  # noqa: B007 - the last one wins
            pass
        state["configure_seconds"] = round(seconds, 1)
        state["cmake_architectures"] = match.group(1) if match else None
        save_state(state_path, state)
    if time.monotonic() >= deadline:
        return state
    ninja_log = plan.build_dir / ".ninja_log"
    before = {edge_key(e) for e in parse_ninja_log(ninja_log)}
    say(f"{variant}: build (sitting {len(state['sittings']) + 1}, CMAKE_CUDA_ARCHITECTURES={state['cmake_architectures']})")
    code, seconds = run_until(build.bind({}), build.cwd, build.env, log, deadline)
    new = [e for e in parse_ninja_log(ninja_log) if edge_key(e) not in before]
    state["sittings"].append({
        "wall_seconds": round(seconds, 1),
        "finished": code == 0,
        "stopped_at_time_limit": code is None,
        "last_edge_end_seconds": round(max((e.end_ms for e in new), default=0) / 1000.0, 1),
        **summarize_edges(new),
    })
    if code not in (0, None):
        save_state(state_path, state)
        raise BuildError(f"{variant}: build failed (exit {code}); log: {log}", hint="read the log's last lines")
    state["done"] = code == 0
    save_state(state_path, state)
    return state


def variant_report(variant: str, plan: BuildPlan, state: dict) -> dict:
    from t4patch.cuda.cuobjdump import find_cuobjdump
    from t4patch.verify.artifacts.check import check_file

    edges = parse_ninja_log(plan.build_dir / ".ninja_log")
    sittings = state["sittings"]
    wall = (state["configure_seconds"] or 0.0) + sum(s["wall_seconds"] for s in sittings)
    report = {
        "variant": variant,
        "cmake_architectures": state["cmake_architectures"],
        "configure_argv": list(next(s for s in plan.steps if s.name == "configure").argv),
        "sittings": len(sittings),
        "wall_seconds": round(wall, 1),
        "wall_is_upper_bound": len(sittings) > 1,
        "busy_seconds": round((state["configure_seconds"] or 0.0) + sum(s["last_edge_end_seconds"] for s in sittings), 1),
        **summarize_edges(edges),
    }
    library = plan.build_dir / "bin" / "libggml-cuda.so"
    if library.exists():
        assert plan.arch is not None  # both variants are sm_75 plans (variant_plan)
        result = check_file(library.resolve(), plan.arch, cuobjdump=find_cuobjdump(), must_have_cuda=True)
        s = result.summary
        report["libggml_cuda"] = {
            "file": str(result.path), "size": result.size, "sha256": result.sha256, "containers": s.containers,
            "sass": sorted(s.sass), "ptx": sorted(s.ptx), "cuobjdump": result.cuobjdump,
            "sm75_sass_in_every_container": not result.problems, "problems": list(result.problems),
        }
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, help="llama.cpp source tree")
    parser.add_argument("--work", type=Path, help="directory for both builds and the resumable state")
    parser.add_argument("--from-logs", nargs="+", type=Path, metavar="LOG",
                        help="build nothing: compare the CUDA objects of saved .ninja_log files, the sm75 build's "
                             "first, then one or more default-list logs (finished or stopped)")
    parser.add_argument("--missing-ratio", type=float, metavar="R",
                        help="with --from-logs: estimate the objects no default log finished at R times their sm75 "
                             "time (a ratio measured for them elsewhere) instead of the common objects' ratio")
    parser.add_argument("--jobs", "-j", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--time-limit", type=float, default=None, metavar="S",
                        help="stop building after S seconds (the next run resumes)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="order to build them in (default: sm75,default)")
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON")
    args = parser.parse_args(argv)

    def say(message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    try:
        if args.from_logs:
            return _from_logs(args.from_logs, args.json, args.missing_ratio)
        if args.missing_ratio is not None:
            raise UsageError("--missing-ratio only applies to --from-logs", hint="python -m tools.bench.build_archs "
                             "--from-logs SM75_LOG DEFAULT_LOG --missing-ratio R")
        if args.source is None or args.work is None:
            raise UsageError("--source and --work are required (or --from-logs to compare saved logs)",
                             hint="python -m tools.bench.build_archs --source LLAMA_CPP_DIR --work DIR")
        return _run(args, say)
    except T4PatchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code


def _from_logs(logs: list[Path], as_json: bool, missing_ratio: float | None) -> int:
    if len(logs) < 2:
        raise UsageError("--from-logs needs the sm75 log and at least one default-list log",
                         hint="python -m tools.bench.build_archs --from-logs sm75/.ninja_log default/.ninja_log")
    for log in logs:
        if not log.is_file():
            raise UsageError(f"--from-logs {log}: expected a .ninja_log file, found nothing there",
                             hint="pass the build directories' .ninja_log files")
    if missing_ratio is not None and missing_ratio <= 0:
        raise UsageError(f"--missing-ratio {missing_ratio}: expected a positive ratio such as 4.6",
                         hint="python -m tools.bench.build_archs --from-logs ... --missing-ratio 4.6")
    doc = compare_objects(parse_ninja_log(logs[0]), [parse_ninja_log(p) for p in logs[1:]],
                          missing_ratio=missing_ratio)
    print(json.dumps(doc, indent=2) if as_json else render_objects(doc))
    return 0


def render_objects(doc: dict) -> str:
    from t4patch.output import table

    rows = [(name, str(f["objects"]), f"{f['sm75_seconds']:.0f}", f"{f['default_seconds']:.0f}", f"{f['ratio']}x")
            for name, f in doc["families"].items()]
    rows.append(("all common", str(doc["common_objects"]), f"{doc['sm75_seconds']:.0f}", f"{doc['default_seconds']:.0f}",
                 f"{doc['ratio']}x"))
    if not doc["common_objects"]:
        return (f"no CUDA object finished in both: the sm75 log has {doc['sm75_objects']}, the default log(s) "
                "none of them; nothing to compare")
    p = doc["per_object_ratio"]
    lines = [table(("CUDA objects", "n", "sm75 s", "default s", "default/sm75"), rows),
             f"per object: median {p['median']}x, min {p['min']}x, max {p['max']}x"]
    m, e = doc["missing"], doc["estimate"]
    if m["objects"]:
        lines.append(f"not finished in any default log: {m['objects']} of {doc['sm75_objects']} objects "
                     f"({', '.join(f'{k} {v}' for k, v in m['families'].items())}; {m['sm75_seconds']:.0f} s in the "
                     "sm75 build)")
        if e is not None:
            lines.append(f"ESTIMATED default CUDA compile time, missing objects at {e['missing_ratio']}x "
                         f"({e['ratio_source']}): {e['default_cuda_seconds']:.0f} s, {e['ratio_all_cuda']}x the sm75 "
                         "build's CUDA compile time")
    return "\n".join(lines)


def _run(args: argparse.Namespace, say) -> int:
    from t4patch.builder.preflight import enforce, find_nvcc, run_preflight
    from t4patch.builder.preflight import line as preflight_line

    variants = tuple(v.strip() for v in args.variants.split(","))
    if sorted(variants) != sorted(VARIANTS):
        raise UsageError(f"--variants {args.variants!r}: expected both of {', '.join(VARIANTS)} in some order",
                         hint="python -m tools.bench.build_archs --variants sm75,default ...")
    nvcc = find_nvcc()
    work = args.work.resolve()
    plans = {v: variant_plan(v, source=args.source, work=work, jobs=args.jobs, nvcc=nvcc) for v in variants}
    checks = run_preflight(plans["sm75"])
    for check in checks:
        if not check.ok:
            say(preflight_line(check))
    enforce(checks, command="python -m tools.bench.build_archs " + " ".join(sys.argv[1:]))
    deadline = time.monotonic() + (args.time_limit if args.time_limit is not None else float("inf"))
    states = {}
    for variant in variants:
        states[variant] = advance(variant, plans[variant], deadline, say)
        if not states[variant]["done"]:
            say(f"{variant}: stopped at the time limit; run the same command again to continue")
            return EXIT_UNFINISHED
    reports = [variant_report(v, plans[v], states[v]) for v in VARIANTS]
    base, other = reports
    ratios = {key: round(other[key] / base[key], 2) if base[key] else None
              for key in ("wall_seconds", "edge_seconds", "cuda_edge_seconds")}
    objects = compare_objects(parse_ninja_log(plans["sm75"].build_dir / ".ninja_log"),
                              [parse_ninja_log(plans["default"].build_dir / ".ninja_log")])
    doc = {"jobs": args.jobs, "source": str(args.source.resolve()), "variants": reports,
           "ratio_default_over_sm75": ratios, "cuda_objects": objects}
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(render(doc))
    return 0


def render(doc: dict) -> str:
    from t4patch.output import table

    rows = []
    for r in doc["variants"]:
        lib = r.get("libggml_cuda") or {}
        rows.append((r["variant"], r["cmake_architectures"] or "?",
                     f"{r['wall_seconds']:.0f}{'*' if r['wall_is_upper_bound'] else ''}",
                     f"{r['edge_seconds']:.0f}", f"{r['cuda_edge_seconds']:.0f} ({r['cuda_objects']})",
                     ", ".join(lib.get("sass", [])) or "-", ", ".join(lib.get("ptx", [])) or "-",
                     "yes" if lib.get("sm75_sass_in_every_container") else "NO"))
    lines = [f"llama.cpp build, {doc['jobs']} jobs, source {doc['source']}",
             table(("variant", "CMAKE_CUDA_ARCHITECTURES", "wall s", "compile s", "CUDA compile s (objects)",
                    "SASS", "PTX", "sm_75 SASS"), rows)]
    if any(r["wall_is_upper_bound"] for r in doc["variants"]):
        lines.append("* built in several sittings: wall time includes compiles thrown away at each stop (upper bound)")
    ratios = doc["ratio_default_over_sm75"]
    upper = " (an upper bound: built in several sittings)" if any(r["wall_is_upper_bound"] for r in doc["variants"]) else ""
    lines.append("default list / sm75: " + ", ".join(f"{k.replace('_seconds', '')} {v}x" for k, v in ratios.items())
                 + upper)
    lines.append(render_objects(doc["cuda_objects"]))
    for r in doc["variants"]:
        for problem in (r.get("libggml_cuda") or {}).get("problems", []):
            lines.append(f"{r['variant']}: {problem}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
