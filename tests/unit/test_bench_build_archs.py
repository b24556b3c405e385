"""The sm_75-vs-default-list build benchmark: variant planning, ninja log accounting, resumable sittings."""

from __future__ import annotations

import dataclasses
import sys
import textwrap
import time
from pathlib import Path

import pytest

from t4patch.errors import BuildError, T4PatchError
from tools.bench import build_archs
from tools.bench.build_archs import (
    ARCH_FLAG,
    advance,
    default_list_plan,
    parse_ninja_log,
    summarize_edges,
    variant_plan,
    variant_report,
)


def test_default_variant_differs_only_by_the_arch_flag(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    sm75 = variant_plan("sm75", source=tmp_path / "src", work=tmp_path, jobs=16, nvcc="/opt/cuda/bin/nvcc")
    default = variant_plan("default", source=tmp_path / "src", work=tmp_path, jobs=16, nvcc="/opt/cuda/bin/nvcc")
    (c75, b75), (cdef, bdef) = sm75.steps, default.steps
    assert f"{ARCH_FLAG}75" in c75.argv and not any(a.startswith(ARCH_FLAG) for a in cdef.argv)
    assert [a for a in c75.argv if not a.startswith(ARCH_FLAG)] == [
        a.replace(str(tmp_path / "default"), str(tmp_path / "sm75")) for a in cdef.argv]
    assert b75.argv[-4:] == bdef.argv[-4:] and b75.argv[6] == bdef.argv[6] == "16"  # same targets, same jobs
    assert "-DGGML_CUDA=ON" in cdef.argv and "-DGGML_NATIVE=OFF" in cdef.argv  # still a non-native CUDA build


def test_default_list_plan_refuses_a_recipe_without_exactly_one_arch_flag(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    plan = variant_plan("default", source=tmp_path / "src", work=tmp_path, jobs=2, nvcc="nvcc")
    with pytest.raises(T4PatchError, match="found it 0 times"):
        default_list_plan(plan)  # the flag is already gone


def test_parse_ninja_log(tmp_path: Path) -> None:
    log = tmp_path / ".ninja_log"
    log.write_text("# ninja log v6\n0\t1500\t0\tggml/a.cu.o\tdeadbeef\n100\t400\t0\tggml/b.c.o\tcafe\nbroken line\n")
    edges = parse_ninja_log(log)
    assert [(e.output, e.seconds) for e in edges] == [("ggml/a.cu.o", 1.5), ("ggml/b.c.o", 0.3)]
    assert summarize_edges(edges) == {"edges": 2, "edge_seconds": 1.8, "cuda_objects": 1, "cuda_edge_seconds": 1.5,
                                      "longest_edge_seconds": 1.5}
    assert parse_ninja_log(tmp_path / "missing") == []
    log.write_text("# ninja log v4\n")
    with pytest.raises(T4PatchError, match="v5 or later"):
        parse_ninja_log(log)


FAKE_BUILD = textwrap.dedent("""\
    # A stand-in for `cmake --build`: each run finishes one edge and appends it to .ninja_log; the first run then
    # hangs (to be stopped at the deadline), the second one exits 0 with the build complete.
    import os, sys, time
    build = sys.argv[1]
    log = os.path.join(build, ".ninja_log")
    first = not os.path.exists(log)
    with open(log, "a") as fh:
        if first:
            fh.write("# ninja log v7\\n0\\t2000\\t0\\tggml-cuda/mmq.cu.o\\t1\\n")
        else:
            fh.write("0\\t3000\\t0\\tggml-cuda/fattn.cu.o\\t2\\n10\\t500\\t0\\tcommon/arg.cpp.o\\t3\\n")
    if first:
        time.sleep(60)
""")


def fake_plan(tmp_path: Path) -> build_archs.BuildPlan:
    (tmp_path / "src").mkdir(exist_ok=True)
    plan = variant_plan("default", source=tmp_path / "src", work=tmp_path / "work", jobs=2, nvcc="nvcc")
    script = tmp_path / "fake_build.py"
    script.write_text(FAKE_BUILD)
    plan.build_dir.mkdir(parents=True)
    configure = dataclasses.replace(plan.steps[0], argv=(
        sys.executable, "-c", "print('-- Using CMAKE_CUDA_ARCHITECTURES=75-virtual;80-virtual;86-real')"))
    build = dataclasses.replace(plan.steps[1], argv=(sys.executable, str(script), str(plan.build_dir)))
    return dataclasses.replace(plan, steps=(configure, build))


def test_sittings_resume_and_add_up(tmp_path: Path) -> None:
    plan = fake_plan(tmp_path)
    said: list[str] = []
    started = time.monotonic()
    state = advance("default", plan, time.monotonic() + 3.0, said.append)
    assert time.monotonic() - started < 30  # the hanging build was stopped at the deadline, not waited for
    assert not state["done"] and state["cmake_architectures"] == "75-virtual;80-virtual;86-real"
    assert state["sittings"][0]["stopped_at_time_limit"] and state["sittings"][0]["edges"] == 1

    state = advance("default", plan, time.monotonic() + 30.0, said.append)  # configure is not rerun
    assert state["done"] and len(state["sittings"]) == 2
    assert state["sittings"][1] == {**state["sittings"][1], "finished": True, "edges": 2, "edge_seconds": 3.5,
                                    "cuda_edge_seconds": 3.0, "last_edge_end_seconds": 3.0}
    assert sum("configure" in s for s in said) == 1
    assert advance("default", plan, time.monotonic() + 30.0, said.append) == state  # done: nothing runs

    report = variant_report("default", plan, state)
    assert report["edges"] == 3 and report["edge_seconds"] == 5.5 and report["cuda_edge_seconds"] == 5.0
    assert report["sittings"] == 2 and report["wall_is_upper_bound"]
    assert report["busy_seconds"] == pytest.approx(state["configure_seconds"] + 2.0 + 3.0, abs=0.11)
    assert "libggml_cuda" not in report  # nothing was built


def test_a_failing_build_is_a_build_error_and_keeps_the_sitting(tmp_path: Path) -> None:
    plan = fake_plan(tmp_path)
    failing = dataclasses.replace(plan.steps[1], argv=(sys.executable, "-c", "raise SystemExit(4)"))
    plan = dataclasses.replace(plan, steps=(plan.steps[0], failing))
    with pytest.raises(BuildError, match=r"build failed \(exit 4\)"):
        advance("default", plan, time.monotonic() + 30.0, lambda _: None)
    state = build_archs.load_state(plan.out / build_archs.STATE)
    assert not state["done"] and len(state["sittings"]) == 1 and not state["sittings"][0]["finished"]


def write_log(path: Path, rows: list[tuple[int, int, str]]) -> Path:
    path.write_text("# ninja log v7\n" + "".join(f"{a}\t{b}\t0\t{o}\t{i:x}\n" for i, (a, b, o) in enumerate(rows)))
    return path


def test_compare_objects_across_stopped_default_logs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = "ggml/src/ggml-cuda/CMakeFiles/ggml-cuda.dir/"
    sm75 = write_log(tmp_path / "sm75", [(0, 10_000, d + "template-instances/mmq-instance-q4_0.cu.o"),
                                         (0, 4_000, d + "template-instances/fattn-tile-instance-dkq64-dv64.cu.o"),
                                         (0, 2_000, d + "binbcast.cu.o"),
                                         (0, 9_000, "common/arg.cpp.o")])  # host objects are not compared
    first = write_log(tmp_path / "a", [(0, 20_000, d + "template-instances/fattn-tile-instance-dkq64-dv64.cu.o"),
                                       (0, 5_000, d + "binbcast.cu.o")])
    second = write_log(tmp_path / "b", [(0, 12_000, d + "binbcast.cu.o")])  # finished twice: mean 8.5 s
    doc = build_archs.compare_objects(parse_ninja_log(sm75), [parse_ninja_log(first), parse_ninja_log(second)])
    assert doc["sm75_objects"] == 3 and doc["common_objects"] == 2
    assert (doc["sm75_seconds"], doc["default_seconds"], doc["ratio"]) == (6.0, 28.5, 4.75)
    assert doc["per_object_ratio"] == {"median": 4.62, "min": 4.25, "max": 5.0}
    assert doc["families"]["fattn-tile"] == {"objects": 1, "sm75_seconds": 4.0, "default_seconds": 20.0, "ratio": 5.0}
    assert doc["missing"] == {"objects": 1, "sm75_seconds": 10.0, "families": {"mmq-instance": 1}}
    assert doc["estimate"] == {"missing_ratio": 4.75, "ratio_source": "common objects",
                               "default_cuda_seconds": 28.5 + 10.0 * 4.75, "ratio_all_cuda": round(76.0 / 16.0, 2)}
    given = build_archs.compare_objects(parse_ninja_log(sm75), [parse_ninja_log(first)], missing_ratio=2.0)
    assert given["estimate"]["default_cuda_seconds"] == 20.0 + 5.0 + 10.0 * 2.0
    assert given["estimate"]["ratio_source"] == "given (--missing-ratio)"

    assert build_archs.main(["--from-logs", str(sm75), str(first), str(second)]) == 0
    out = capsys.readouterr().out
    assert "all common" in out and "ESTIMATED default CUDA compile time" in out and "mmq-instance 1" in out


def test_from_logs_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = write_log(tmp_path / "sm75", [])
    assert build_archs.main(["--from-logs", str(log)]) == 2
    assert build_archs.main(["--from-logs", str(log), str(tmp_path / "nope")]) == 2
    assert build_archs.main([]) == 2  # neither --source/--work nor --from-logs
    assert build_archs.main(["--from-logs", str(log), str(log), "--missing-ratio", "0"]) == 2
    assert build_archs.main(["--source", ".", "--work", ".", "--missing-ratio", "4"]) == 2
    damaged = tmp_path / "damaged"
    damaged.write_text("# ninja log v5\n12\tabc\t0\tx.cu.o\tff\n")
    assert build_archs.main(["--from-logs", str(log), str(damaged)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 6 and all(line.startswith("error: ") for line in err)
    assert "damaged:2: expected integer start and end times" in err[-1]


def test_from_logs_with_no_common_object_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An early-stopped default sitting may hold host objects only: no traceback, a plain statement."""
    sm75 = write_log(tmp_path / "sm75", [(0, 1000, "ggml-cuda.dir/a.cu.o")])
    host_only = write_log(tmp_path / "default", [(0, 1000, "common/arg.cpp.o")])
    assert build_archs.main(["--from-logs", str(sm75), str(host_only)]) == 0
    assert "no CUDA object finished in both" in capsys.readouterr().out


def test_no_time_left_or_a_stopped_configure_leaves_the_variant_unfinished(tmp_path: Path) -> None:
    plan = fake_plan(tmp_path)
    said: list[str] = []
    state = advance("default", plan, time.monotonic() - 1.0, said.append)  # deadline already passed
    assert state["configure_seconds"] is None and not state["sittings"] and not said
    slow = dataclasses.replace(plan.steps[0], argv=(sys.executable, "-c", "import time; time.sleep(60)"))
    stopped = dataclasses.replace(plan, steps=(slow, plan.steps[1]))
    state = advance("default", stopped, time.monotonic() + 1.5, said.append)
    assert state["configure_seconds"] is None and not state["done"]  # not an error: the next run configures
    state = advance("default", plan, time.monotonic() + 3.0, said.append)
    assert state["configure_seconds"] is not None and state["sittings"][0]["stopped_at_time_limit"]
    assert state["sittings"][0]["wall_seconds"] <= 3.5  # counted up to the deadline, not through the stop


def test_sittings_written_without_settings_are_refused(tmp_path: Path) -> None:
    plan = fake_plan(tmp_path)
    plan.out.mkdir(parents=True, exist_ok=True)
    build_archs.save_state(plan.out / build_archs.STATE, {"configure_seconds": 1.0, "done": False,
                                                          "cmake_architectures": None,
                                                          "sittings": [{"wall_seconds": 5.0}]})
    with pytest.raises(build_archs.UsageError, match="not the settings they were built with"):
        advance("default", plan, time.monotonic() + 30.0, lambda _: None)


def test_a_resumed_build_must_have_the_same_settings(tmp_path: Path) -> None:
    plan = fake_plan(tmp_path)
    advance("default", plan, time.monotonic() + 3.0, lambda _: None)  # first sitting, stopped
    other_jobs = dataclasses.replace(plan.steps[1], argv=plan.steps[1].argv + ("--jobs-changed",))
    changed = dataclasses.replace(plan, steps=(plan.steps[0], other_jobs))
    before = (plan.out / build_archs.STATE).read_text()
    with pytest.raises(build_archs.UsageError, match="the build step differ"):
        advance("default", changed, time.monotonic() + 30.0, lambda _: None)
    other_flags = dataclasses.replace(plan.steps[0], argv=plan.steps[0].argv + ("-DGGML_CUDA_F16=ON",),
                                      env={"CUDAToolkit_ROOT": "/elsewhere"})
    with pytest.raises(build_archs.UsageError, match="the configure step, environment differ"):
        advance("default", dataclasses.replace(plan, steps=(other_flags, plan.steps[1])), time.monotonic() + 30.0,
                lambda _: None)
    assert (plan.out / build_archs.STATE).read_text() == before  # nothing recorded for the refused run


RECORD = Path(__file__).resolve().parents[2] / "docs" / "verification" / "build-llama-cpp-archs-2026-11-29"


def test_recorded_numbers_follow_from_the_kept_ninja_logs() -> None:
    """docs/verification/build-llama-cpp-archs-2026-11-29.md quotes these; the logs it keeps must give them."""
    logs = {p.name: parse_ninja_log(p) for p in RECORD.glob("*.ninja_log")}
    device = build_archs.compare_objects(logs["sm75.ninja_log"], [logs[f"default-sitting-{x}.ninja_log"] for x in "abc"])
    assert (device["sm75_objects"], device["common_objects"], device["ratio"]) == (144, 97, 5.1)
    assert (round(device["sm75_seconds"]), round(device["default_seconds"])) == (1420, 7241)
    assert device["per_object_ratio"]["median"] == 4.03
    assert device["missing"] == {"objects": 47, "sm75_seconds": 1482.8,
                                 "families": {"fattn-mma": 5, "fattn-vec": 4, "mmf-instance": 16, "mmq-instance": 22}}
    assert {k: (f["objects"], round(f["sm75_seconds"]), round(f["default_seconds"]), f["ratio"])
            for k, f in device["families"].items()} == {"fattn-mma": (16, 506, 2851, 5.64),
                                                        "fattn-tile": (13, 344, 2013, 5.85),
                                                        "other": (68, 570, 2376, 4.17)}
    devbox = build_archs.compare_objects(logs["devbox-sm75-47.ninja_log"], [logs["devbox-default-47.ninja_log"]])
    assert (devbox["common_objects"], devbox["ratio"], round(devbox["default_seconds"])) == (47, 4.6, 5290)
    assert round(devbox["sm75_seconds"]) == 1150 and devbox["missing"]["objects"] == 0
    # The record's estimate: the 47 at the ratio measured for them on the 2-core box.
    combined = build_archs.compare_objects(logs["sm75.ninja_log"],
                                           [logs[f"default-sitting-{x}.ninja_log"] for x in "abc"],
                                           missing_ratio=devbox["ratio"])
    assert round(combined["estimate"]["default_cuda_seconds"]) == 14062
    assert combined["estimate"]["ratio_all_cuda"] == 4.84
    whole = summarize_edges(logs["sm75.ninja_log"])
    assert (whole["edges"], round(whole["edge_seconds"]), whole["cuda_objects"]) == (380, 3594, 144)
