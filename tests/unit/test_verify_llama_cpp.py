"""`t4patch verify llama.cpp` on the CPU: the op list, the test-backend-ops output parser on real output, the
judgement of each op, the evidence class, and the CLI re-deriving a report from a recorded log.

Real output, two files under tests/data/ (each a ``--log`` of `t4patch verify llama.cpp`):
- ``llama-cpp-tbo-cpu-0c1e570.log``: the vendored llama.cpp of llama-cpp-python 0.3.36 built for the CPU here,
  ``--backend CPU`` (GELU/GEGLU, SET_ROWS, SCALE, TANH);
- ``llama-cpp-tbo-cuda-fa-sm75ptx-h200.log``: the same tree built with CMAKE_CUDA_ARCHITECTURES=75-virtual,
  flash attention at head 256/512 on the H200 (43 OK, 16 not supported), docs/verification/llama-cpp-test-backend-ops-2026-12-01.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from t4patch import cli
from t4patch.errors import DataFileError
from t4patch.verify.llamacpp import parse, report, runner

DATA = Path(__file__).resolve().parents[1] / "data"
CPU_LOG = DATA / "llama-cpp-tbo-cpu-0c1e570.log"
FA_LOG = DATA / "llama-cpp-tbo-cuda-fa-sm75ptx-h200.log"
GREEN, RED, RESET = "\x1b[1;32m", "\x1b[1;31m", "\x1b[0m"


def test_shipped_op_list_loads_with_the_gemma4_ops():
    ops = runner.load_ops()
    names = [s.o for s in ops.ops]
    for needed in ("MUL_MAT", "FLASH_ATTN_EXT", "ROPE", "SOFT_MAX", "GET_ROWS", "SET_ROWS", "CPY", "SCALE", "TANH"):
        assert needed in names
    assert all(s.on_not_supported and s.graph for s in ops.ops)
    fa = next(s for s in ops.ops if s.o == "FLASH_ATTN_EXT")
    assert fa.is_e2b_shape("hsk=512,hsv=512,nh=4,nr23=[4,1],kv=512,nb=1,mask=1")
    assert not fa.is_e2b_shape("hsk=512,hsv=512,nh=4,nr23=[1,1],kv=512,nb=1,mask=1")  # no GQA: not E2B
    assert not fa.is_e2b_shape("hsk=256,hsv=256,nh=4,nr23=[4,1],kv=113,nb=1,mask=1")  # unpadded KV: not E2B


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('schema = 1\nname = "n"\nmodel = "m"\nllama_cpp = "c"\n[[op]]\nname = "a"\no = "ADD"\ngraph = "g"\non_not_supported = "x"\nsurprise = 1\n', "unknown key 'surprise'"),
        ('schema = 1\nname = "n"\nmodel = "m"\nllama_cpp = "c"\n[[op]]\nname = "a"\no = "ADD"\ngraph = "g"\non_not_supported = "x"\np = "(("\n', "not a regex"),
        ('schema = 1\nname = "n"\nmodel = "m"\nllama_cpp = "c"\n[[op]]\nname = "a"\no = "ADD"\ngraph = "g"\non_not_supported = "x"\n'
         '[[op]]\nname = "a"\no = "MUL"\ngraph = "g"\non_not_supported = "x"\n', "listed twice"),
        ('schema = 2\n[[op]]\nname = "a"\n', "schema = 1"),
    ],
)
def test_bad_op_lists_are_refused(tmp_path, text, message):
    path = tmp_path / "ops.toml"
    path.write_text(text)
    with pytest.raises(DataFileError, match=message):
        runner.load_ops(path)


def test_parser_reads_real_cpu_output():
    text = CPU_LOG.read_text()
    results = runner.from_log(text, runner.load_ops())
    assert [r.spec.o for r in results] == ["GELU,GEGLU", "SET_ROWS", "SCALE", "TANH"]
    gelu = results[0].parsed
    assert gelu.counts()["ok"] == 16 and len(gelu.cases) == 16
    assert gelu.backends == {"CPU": "OK"} and gelu.tests_passed["CPU"] == (16, 16) and gelu.overall == (1, 1)
    assert gelu.cases[0] == parse.Case("GELU", "type=f32,ne_a=[128,2,2,2],v=0", "ok", "", "CPU")
    assert all(not r.parsed.unparsed for r in results), [r.parsed.unparsed for r in results]
    assert all(not r.problems for r in results)


def test_parser_reads_real_gpu_output_with_not_supported_cases():
    (fa,) = runner.from_log(FA_LOG.read_text(), runner.load_ops())
    counts = fa.parsed.counts()
    assert (len(fa.parsed.cases), counts["ok"], counts["not_supported"], counts["fail"]) == (59, 43, 16, 0)
    ns = [c for c in fa.parsed.cases if c.status == "not_supported"]
    assert all(c.params.startswith("hsk=512,hsv=512,nh=4,nr23=[1,1],") for c in ns)  # head 512 without GQA only
    assert fa.e2b_not_supported() == []
    assert fa.to_json()["e2b_shape_cases"] > 0 and not fa.problems
    assert fa.parsed.backends == {"CUDA0": "OK"}


def test_failures_crashes_and_skips_are_classified():
    text = (
        "Backend 1/1: CUDA0\n"
        f"  MUL_MAT(type_a=q4_0,type_b=f32,m=16,n=1,k=256): {GREEN}OK{RESET}\n"
        f"  SOFT_MAX(type=f32,ne=[1024,16,1,1]): [SOFT_MAX] NMSE = 0.000000103 > 0.000000100 {RED}FAIL{RESET}\n"
        "  MUL_MAT(type_a=f16,type_b=f32,m=4096,n=512,k=14336): skipping large tensors for speed \n"
        "  ROPE(type=f32,ne_a=[128,32,2,1],mode=2,inplace=1): not supported [CUDA0] \n"
        "  FLASH_ATTN_EXT(hsk=512,hsv=512): "
    )
    parsed = parse.parse(text)
    assert [c.status for c in parsed.cases] == ["ok", "fail", "skipped", "not_supported", "crashed"]
    assert parsed.cases[1].detail == "[SOFT_MAX] NMSE = 0.000000103 > 0.000000100"
    assert parsed.cases[3].detail == "CUDA0"


def _result(text: str, rc: int | None = 0, timed_out: bool = False, seconds: float = 1.0) -> runner.OpResult:
    spec = runner.load_ops().ops[0]
    result = runner.OpResult(spec, ["tbo"], seconds, rc, timed_out, parse.parse(text), "")
    runner.judge(result, "CUDA0")
    return result


def test_an_op_that_matched_nothing_timed_out_or_exited_badly_is_a_problem():
    assert "matched no case" in _result("Backend 1/1: CUDA0\n  0/0 tests passed\n").problems[0]
    assert "ran out of time" in _result(f"  MUL_MAT(x): {GREEN}OK{RESET}\n", rc=None, timed_out=True).problems[0]
    assert "exited 134 without a failing case" in _result(f"  MUL_MAT(x): {GREEN}OK{RESET}\n", rc=134).problems[0]
    crashed = _result("  MUL_MAT(x): ", rc=134)
    assert crashed.problems == [] and [c.status for c in crashed.failed_cases()] == ["crashed"]
    assert report.failures([crashed.to_json()]) == ["MUL_MAT q4_0/f16: MUL_MAT(x): CRASHED"]


def test_evidence_classes():
    virtual = {"CMAKE_CUDA_ARCHITECTURES": "75-virtual"}
    assert report.evidence_class(virtual, "9.0", "CUDA0").startswith("sm_75 code executed on sm_90 through PTX JIT")
    assert "NOT emulated" in report.evidence_class(virtual, "9.0", "CUDA0")
    assert report.evidence_class({"CMAKE_CUDA_ARCHITECTURES": "75"}, "7.5", "CUDA0").startswith("measured on a T4")
    assert "not the Turing code paths" in report.evidence_class({"CMAKE_CUDA_ARCHITECTURES": "90"}, "9.0", "CUDA0")
    assert "no GPU code ran" in report.evidence_class({}, None, "CPU")
    assert any("real compute capability" in line for line in report.scope(report.evidence_class(virtual, "9.0", "CUDA0")))


def test_cli_rederives_a_report_from_a_recorded_log(capsys):
    assert cli.main(["verify", "llama.cpp", "--from-log", str(FA_LOG), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "pass" and doc["totals"]["cases"] == 59 and doc["totals"]["not_supported"] == 16
    assert doc["evidence_class"].startswith("sm_75 code executed on sm_90 through PTX JIT")
    assert doc["derived_from_log"] == str(FA_LOG)


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ("{not json", "header is not JSON"),
        ("[1, 2]", "JSON list, expected an object"),
        ('{"build": "x"}', "'build' is not an object"),
        ('{"build": {}, "backend": 3}', "'backend' is not a string"),
    ],
)
def test_cli_refuses_a_log_with_a_malformed_header_in_one_line(tmp_path, capsys, header, message):
    """A --log file is read back from disk: a damaged header line is exit 2 with one line, never a traceback."""
    log = tmp_path / "bad.log"
    log.write_text(runner.BUILD_INFO + header + "\n" + FA_LOG.read_text().split("\n", 1)[1])
    assert cli.main(["verify", "llama.cpp", "--from-log", str(log)]) == 2
    err = capsys.readouterr().err
    assert message in err and f"--from-log {log}: line 1:" in err and "Traceback" not in err


def test_build_info_round_trips_through_a_log(tmp_path):
    log = tmp_path / "run.log"
    info = {"build": {"GGML_CUDA": "ON"}, "gpu": None, "capability": "9.0", "backend": "CUDA0", "binary": "/b/tbo"}
    runner.write_build_info(log, info)
    assert runner.read_build_info(log.read_text(), log) == info
    assert runner.read_build_info("no header here\n", log) == {}


def test_cli_exits_12_on_a_failing_case(tmp_path, capsys):
    log = tmp_path / "fail.log"
    log.write_text(
        "==== MUL_MAT q4_0/f16: $ tbo test -b CUDA0 -o MUL_MAT -p x\n==== exit 1, 2.0 s\n"
        "Backend 1/1: CUDA0\n"
        f"  MUL_MAT(type_a=q4_0,type_b=f32,m=16,n=1,k=256): [MUL_MAT] NMSE = 0.5 > 0.0005 {RED}FAIL{RESET}\n"
        "==== stderr\n\n"
    )
    assert cli.main(["verify", "llama.cpp", "--from-log", str(log)]) == 12
    err = capsys.readouterr().err
    assert "NMSE = 0.5 > 0.0005" in err


def test_cli_refuses_a_missing_binary_and_a_cpu_build_for_cuda(tmp_path, capsys):
    assert cli.main(["verify", "llama.cpp", str(tmp_path)]) == 10
    (tmp_path / "bin").mkdir()
    binary = tmp_path / "bin" / "test-backend-ops"
    binary.write_text("#!/bin/sh\nexit 0\n")
    binary.chmod(0o755)
    (tmp_path / "CMakeCache.txt").write_text("GGML_CUDA:BOOL=OFF\n")
    assert cli.main(["verify", "llama.cpp", str(tmp_path)]) == 11
    assert cli.main(["verify", "llama.cpp", str(tmp_path), "--ops", "NOPE"]) == 2


def test_time_budget_marks_unstarted_ops_as_not_run(tmp_path):
    binary = tmp_path / "tbo"
    binary.write_text("#!/bin/sh\nsleep 2\necho 'Backend 1/1: CPU'\necho '  ADD(type=f32): OK'\n")
    binary.chmod(0o755)
    ops = runner.load_ops()
    results = runner.run(binary, "CPU", ops, timeout=30, selected=("ADD,MUL", "SCALE"), progress=lambda s: None, budget=6.0)
    assert results[0].parsed.counts()["ok"] == 1
    # ~2 s used, under 5 s left: the second op is not started, and that is a problem, not a pass
    assert [r.spec.o for r in results] == ["ADD,MUL", "SCALE"]
    assert any("not run" in p for p in results[-1].problems) and not results[-1].parsed.cases
