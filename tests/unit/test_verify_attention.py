"""`verify attention` without compiling anything: data validation, the report, exit codes, engine selection.

The compiles themselves (real vLLM / SGLang wheels, Triton for sm_75) are in
tests/integration/test_attention_fit.py; here the worker's JSON is synthesised so every verdict path runs in
milliseconds.
"""

from __future__ import annotations

import json
import stat
import textwrap
from pathlib import Path

import pytest

from t4patch.commands.engine_table import ENGINES
from t4patch.environment.target import resolve_target
from t4patch.errors import (
    DataFileError,
    MissingDependencyError,
    NotInstalledError,
    T4PatchError,
    UnsupportedVersionError,
    UsageError,
    VerificationError,
)
from t4patch.verify.attention import kernel_path
from t4patch.verify.attention import runner as attention_mod
from t4patch.verify.attention.cases import load_archs, load_cases, resolve_arch
from t4patch.verify.attention.report import AttentionReport, EngineResult, case_results
from t4patch.verify.attention.runner import PATCH_STATE_TEXT, _raise_worker_error, check, run_worker, select_engines
from tests.helpers import make_dist

# --------------------------------------------------------------------------------------------- shipped data


def test_shipped_arch_limits_are_the_cuda_opt_in_limits():
    archs = load_archs()
    limits = {name: a.shared_limit for name, a in archs.items()}
    assert limits == {
        "sm_70": 98304,
        "sm_75": 65536,
        "sm_80": 166912,
        "sm_86": 101376,
        "sm_89": 101376,
        "sm_90": 232448,
    }
    assert archs["sm_75"].capability == 75 and archs["sm_75"].warp_size == 32


@pytest.mark.parametrize("text", ["sm_75", "sm75", "75", "7.5", " SM_75 "])
def test_arch_spellings(text):
    assert resolve_arch(text).name == "sm_75"


def test_unknown_arch_is_a_usage_error():
    with pytest.raises(UsageError) as info:
        resolve_arch("sm_61")
    assert info.value.exit_code == 2
    assert "sm_75" in str(info.value)


def test_shipped_case_table_covers_gemma4_e2b_and_every_vllm_path():
    table = load_cases()
    model = table.model
    assert (model.num_query_heads, model.num_kv_heads, model.dtype, model.kv_block_size) == (8, 1, "float16", 16)
    assert [(l.name, l.head_size, l.sliding_window) for l in model.layers] == [("sliding", 256, 512), ("full", 512, 0)]
    vllm = table.engine("vllm")
    assert vllm is not None and vllm.versions == ("0.31.0", "0.32.0", "0.33.0") and vllm.triton_series == "3.8"
    # each release is compiled with the Triton series its pinned torch requires (torch 2.13.0: triton 3.7.1)
    assert [vllm.for_version(v).triton_series for v in vllm.versions] == ["3.7", "3.7", "3.8"]
    assert {c.path for c in vllm.cases} == {"2d", "3d"}  # 3d also launches reduce_segments
    assert {c.phase for c in vllm.cases} == {"prefill", "decode"}
    assert set(vllm.kernel_tiles) == {"kernel_unified_attention", "reduce_segments", "_attn_packed"}
    int4 = [c for c in vllm.cases if c.kv_cache_dtype == "int4_per_token_head"]
    assert [(c.phase, c.path) for c in int4] == [("prefill", "2d"), ("decode", "3d"), ("decode", "2d")]
    assert all(c.accepted_refusal.startswith("t4patch: the INT4 per-token-head") for c in int4)
    assert all(c.kv_cache_dtype == "auto" and not c.accepted_refusal for c in vllm.cases if c not in int4)
    sglang = table.engine("sglang")
    assert sglang is not None and {c.path for c in sglang.cases} == {"extend", "decode-grouped"}
    assert [sglang.for_version(v).triton_series for v in sglang.versions] == ["3.7", "3.8", "3.8"]


def test_triton_by_version_must_name_listed_versions(tmp_path):
    text = CASES_OK.replace('triton = "3.8"', 'triton = "3.8"\ntriton_by_version = { "0.30.0" = "3.7" }')
    with pytest.raises(DataFileError, match="engine.vllm.triton_by_version.0.30.0: expected a listed version"):
        load_cases(_write(tmp_path, "cases.toml", text))


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


ARCH_OK = """\
schema = 1
[arch.sm_75]
capability = [7, 5]
warp_size = 32
shared_memory_per_block_optin = 65536
gpus = "T4"
"""


@pytest.mark.parametrize(
    "text, problem",
    [
        (ARCH_OK.replace("schema = 1", "schema = 2"), "schema"),
        (ARCH_OK.replace("[7, 5]", "[8, 0]"), "capability"),
        (ARCH_OK.replace("65536", "0"), "shared_memory_per_block_optin"),
        (ARCH_OK.replace("65536", '"64K"'), "shared_memory_per_block_optin"),
        (ARCH_OK.replace("warp_size = 32", "warp_size = 64"), "warp_size"),
        (ARCH_OK.replace("[arch.sm_75]", "[arch.turing]"), "sm_<major><minor>"),
        ("schema = 1\n[arch", "TOML"),
    ],
)
def test_broken_arch_data_is_refused(tmp_path, text, problem):
    with pytest.raises(DataFileError) as info:  # the GPU table is not patch-set data (t4patch.cuda.arch)
        load_archs(_write(tmp_path, "archs.toml", text))
    assert problem in str(info.value)


def test_valid_arch_file_loads(tmp_path):
    assert load_archs(_write(tmp_path, "archs.toml", ARCH_OK))["sm_75"].shared_limit == 65536


CASES_OK = """\
schema = 1
[model]
name = "m"
num_query_heads = 8
num_kv_heads = 1
dtype = "float16"
kv_block_size = 16
[[layer]]
name = "full"
head_size = 512
sliding_window = 0
[engine.vllm]
distribution = "vllm"
versions = ["0.33.0"]
driver = "vllm-unified-attention"
triton = "3.8"
files = ["vllm/x.py"]
[engine.vllm.kernel.k]
tiles = ["TILE_SIZE"]
[[engine.vllm.case]]
name = "decode"
phase = "decode"
num_seqs = 4
query_len = 1
context_len = 64
path = "3d"
"""


@pytest.mark.parametrize(
    "old, new, problem",
    [
        ("query_len = 1", "query_len = 2", "decode case has query_len 1"),
        ('driver = "vllm-unified-attention"', 'driver = "nope"', "driver"),
        ('triton = "3.8"', 'triton = "3"', "triton"),
        ('files = ["vllm/x.py"]', 'files = ["/abs/x.py"]', "relative"),
        ("kv_block_size = 16", "kv_block_size = 8", "multiple of 16"),
        ("num_kv_heads = 1", "num_kv_heads = 3", "multiple of num_kv_heads"),
        ('dtype = "float16"', 'dtype = "fp8"', "dtype"),
        ("context_len = 64", "context_len = 0", "context_len"),
        ('tiles = ["TILE_SIZE"]', "tiles = []", "tiles"),
    ],
)
def test_broken_case_table_is_refused(tmp_path, old, new, problem):
    assert old in CASES_OK
    with pytest.raises(DataFileError) as info:  # the case table is not patch-set data
        # the drivers the engine table hands in (the command passes them; the case table may name only these)
        load_cases(_write(tmp_path, "cases.toml", CASES_OK.replace(old, new)), drivers=ENGINES.attention_drivers())
    assert problem in str(info.value)


def test_duplicate_case_names_are_refused(tmp_path):
    text = CASES_OK + CASES_OK[CASES_OK.index("[[engine.vllm.case]]"):]
    with pytest.raises(DataFileError, match="unique"):
        load_cases(_write(tmp_path, "cases.toml", text))


# --------------------------------------------------------------------------------------------- the report

SM75 = load_archs()["sm_75"]
TABLE = load_cases()
VLLM = TABLE.engine("vllm")


def launch(kernel: str, shared: int, **constexprs) -> dict:
    return {
        "kernel": kernel,
        "grid": [1, 1, 1],
        "constexprs": constexprs,
        "num_warps": 4,
        "num_stages": 3,
        "shared_bytes": shared,
        "registers": 64,
        "spills": 10,
    }


def worker_results(full_2d_shared: int, full_path_prefill: str = "2d") -> list[dict]:
    """What the worker returns for the shipped vLLM cases, with the head-512 2D shared bytes as given."""
    out = []
    for layer, head in (("sliding", 256), ("full", 512)):
        two_d = 49152 if head == 256 else full_2d_shared
        three_d = 32768 if head == 256 else 65536
        k2 = launch("kernel_unified_attention", two_d, BLOCK_M=16, TILE_SIZE=32, IS_3D=False)
        k3 = launch("kernel_unified_attention", three_d, BLOCK_M=16, TILE_SIZE=16, IS_3D=True)
        red = launch("reduce_segments", 0, TILE_SIZE=16)
        out.append({"layer": layer, "case": "prefill", "path": full_path_prefill if head == 512 else "2d",
                    "error": None, "launches": [k2]})
        out.append({"layer": layer, "case": "decode-small", "path": "3d", "error": None, "launches": [k3, red]})
        out.append({"layer": layer, "case": "decode-large", "path": "2d", "error": None, "launches": [k2]})
        # --kv-cache-dtype int4_per_token_head: head 256 fits; head 512 is refused by the patched launcher
        p2 = launch("_attn_packed", 51200, BLOCK_M=16, TILE_SIZE=32, IS_3D=False)
        p3 = launch("_attn_packed", 33792, BLOCK_M=16, TILE_SIZE=16, IS_3D=True)
        for case, path, launches in (("int4-prefill", "2d", [p2]), ("int4-decode-small", "3d", [p3, red]),
                                     ("int4-decode-large", "2d", [p2])):
            if head == 512:
                out.append({"layer": layer, "case": case, "path": None, "error": INT4_REFUSAL, "launches": []})
            else:
                out.append({"layer": layer, "case": case, "path": path, "error": None, "launches": launches})
    return out


INT4_REFUSAL = ("RuntimeError: t4patch: the INT4 per-token-head KV cache attention kernel (_attn_packed) needs 98304 B "
                "of shared memory for head size 512 even at the smallest KV tile 16 (BLOCK_M 16), but this GPU allows "
                "65536 B per block")


def test_a_clear_refusal_the_table_accepts_is_reported_apart_and_is_not_a_failure():
    report = report_for(worker_results(65536))
    refused = [(c.layer, c.case) for e in report.engines for c in e.cases if c.refused]
    assert refused == [("full", "int4-prefill"), ("full", "int4-decode-small"), ("full", "int4-decode-large")]
    assert report.ok
    check(report)
    doc = report.to_json()
    case = next(c for c in doc["engines"][0]["cases"] if c["case"] == "int4-prefill" and c["layer"] == "full")
    assert case["ok"] and case["problems"] == [] and case["refused"].startswith("t4patch: the INT4")
    text = report.render_text()
    assert "REFUSED full/int4-prefill (clearly, before launch): t4patch: the INT4" in text
    assert "9 of 12 cases fit sm_75; 3 refused clearly by the patched engine" in text


def test_a_refusal_the_table_does_not_accept_fails_the_case():
    results = worker_results(65536)
    other = next(r for r in results if r["layer"] == "full" and r["case"] == "prefill")
    other.update(error=INT4_REFUSAL, path=None, launches=[])  # core-kernel case: no refusal accepted
    wrong = next(r for r in results if r["layer"] == "full" and r["case"] == "int4-decode-large")
    wrong["error"] = "RuntimeError: t4patch: something else"  # not the accepted message
    report = report_for(results)
    assert sorted((c.layer, c.case) for _, c in report.failures()) == [("full", "int4-decode-large"), ("full", "prefill")]


def test_case_table_kv_cache_dtype_and_accepted_refusal_keys(tmp_path):
    text = CASES_OK + 'kv_cache_dtype = "int4_per_token_head"\naccepted_refusal = "t4patch: the kernel needs"\n'
    (case,) = load_cases(_write(tmp_path, "cases.toml", text)).engines[0].cases
    assert (case.kv_cache_dtype, case.accepted_refusal) == ("int4_per_token_head", "t4patch: the kernel needs")
    assert case.to_json()["kv_cache_dtype"] == "int4_per_token_head"
    (plain,) = load_cases(_write(tmp_path, "plain.toml", CASES_OK)).engines[0].cases
    assert (plain.kv_cache_dtype, plain.accepted_refusal) == ("auto", "")
    assert "kv_cache_dtype" not in plain.to_json() and "accepted_refusal" not in plain.to_json()
    with pytest.raises(DataFileError, match="accepted_refusal"):
        load_cases(_write(tmp_path, "bad.toml", CASES_OK + 'accepted_refusal = "Triton said no"\n'))
    with pytest.raises(DataFileError, match="kv_cache_dtype"):
        load_cases(_write(tmp_path, "bad2.toml", CASES_OK + 'kv_cache_dtype = "Int 4"\n'))


def report_for(results: list[dict], state: str = "stock, patch set not applied") -> AttentionReport:
    engine = EngineResult(
        key="vllm", distribution="vllm", version="0.33.0", site_packages="/site", patch_state=state,
        patch_overall={v: k for k, v in PATCH_STATE_TEXT.items()}.get(state),
        interpreter="/usr/bin/python3", versions={"python": "3.11", "torch": "2.13.0+cpu", "triton": "3.8.0"},
        loader={"route": "real package import"}, files={"vllm/x.py": "ab" * 32},
        cases=case_results(results, VLLM, TABLE.model, SM75),
    )
    return AttentionReport(arch=SM75, model=TABLE.model, target={"description": "site-packages /site"}, engines=(engine,))


def test_exactly_the_limit_fits_one_byte_more_does_not():
    at_limit = report_for(worker_results(65536))
    assert at_limit.ok
    check(at_limit)  # no exception
    over = report_for(worker_results(65537))
    assert not over.ok
    assert [(c.layer, c.case) for _, c in over.failures()] == [("full", "prefill"), ("full", "decode-large")]


def test_stock_misfit_raises_verification_error_naming_cases_and_the_fix():
    report = report_for(worker_results(98304))
    with pytest.raises(VerificationError) as info:
        check(report)
    err = info.value
    assert err.exit_code == 12
    assert "2 attention case(s) do not fit sm_75" in err.message
    assert "full/prefill" in err.message and "98,304 B" in err.message
    assert err.hint == "t4patch apply vllm==0.33.0"


def test_misfit_on_a_patched_install_does_not_suggest_apply():
    report = report_for(worker_results(98304), state="patch set applied")
    with pytest.raises(VerificationError) as info:
        check(report)
    assert "apply" not in (info.value.hint or "")


def test_wrong_path_and_compile_error_and_no_launch_fail_the_case():
    results = worker_results(65536, full_path_prefill="3d")
    results[1]["error"] = "CompilationError: boom"
    results[2]["launches"] = []
    report = report_for(results)
    problems = {(c.layer, c.case): c.problems for _, c in report.failures()}
    assert problems[("full", "prefill")] == ("took path 3d, the case table expects 2d",)
    assert problems[("sliding", "decode-small")][0] == "did not compile: CompilationError: boom"
    assert problems[("sliding", "decode-large")] == ("launched no kernel",)


def test_a_case_missing_from_the_worker_result_fails():
    results = [r for r in worker_results(65536) if not (r["layer"] == "full" and r["case"] == "decode-small")]
    report = report_for(results)
    assert [(c.layer, c.case) for _, c in report.failures()] == [("full", "decode-small")]


def test_json_document_carries_everything_a_script_needs():
    doc = report_for(worker_results(98304)).to_json()
    assert doc["arch"]["name"] == "sm_75" and doc["arch"]["shared_memory_per_block_optin"] == 65536
    assert doc["ok"] is False and doc["failed_cases"] == 2
    engine = doc["engines"][0]
    assert engine["patch_state"].startswith("stock") and engine["versions"]["triton"] == "3.8.0"
    full_prefill = next(c for c in engine["cases"] if (c["layer"], c["case"]) == ("full", "prefill"))
    kernel = full_prefill["kernels"][0]
    assert kernel == {
        "kernel": "kernel_unified_attention", "grid": [1, 1, 1],
        "tiles": {"BLOCK_M": 16, "BLOCK_Q": None, "TILE_SIZE": 32, "HEAD_SIZE_PADDED": None,
                  "NUM_SEGMENTS_PER_SEQ": None},
        "num_warps": 4, "num_stages": 3, "shared_bytes": 98304, "limit_bytes": 65536,
        "registers": 64, "spills": 10, "fits": False,
        # the dot path (issue 21.2): not reported by this synthetic worker result, so unknown, never guessed
        "dot_path": None, "mma_sync": None, "fma_rn_f32": None, "fp16_dots": 0, "fp16_dots_on_fma": 0,
        "dot_types": [], "ok": False,
    }
    json.dumps(doc)  # serialisable as is


def test_text_report_is_an_aligned_table_with_fail_lines():
    text = report_for(worker_results(98304)).render_text()
    lines = text.splitlines()
    header = next(l for l in lines if "shared B" in l)
    rows = [l for l in lines if l.startswith(("  sliding", "  full"))]
    assert len(rows) == 15  # 8 core-kernel launches, 4 INT4 head-256 launches, 3 refused INT4 head-512 cases
    column = header.index("shared B")
    launched = [r for r in rows if not r.endswith("REFUSED")]
    assert len(launched) == 12
    assert all(r[column:].split()[0].replace(",", "").isdigit() for r in launched)  # aligned under the header
    assert "FAIL full/prefill: kernel_unified_attention needs 98,304 B of shared memory > limit 65,536 B" in text
    assert "7 of 12 cases fit sm_75; 2 do not; 3 refused clearly by the patched engine" in text
    assert "none was run" in text
    assert max(len(line) for line in lines) <= 120  # fits a 120-column terminal
    assert any(line.strip().startswith("tiles: BLOCK_M=16") for line in lines)  # tiles under their kernel
    spills = " ".join(line.strip() for line in lines[lines.index(next(l for l in lines if "spills: " in l)):])
    assert "never correctness" in spills and "do not decide 'ok' / 'FAIL'" in spills


# --------------------------------------------------------------------------------------------- engine selection


def test_selection_finds_installed_engines_and_refuses_others(tmp_path):
    site = make_dist(tmp_path / "site", name="vllm", version="0.33.0", files={"vllm/__init__.py": ""})
    target = resolve_target(site_packages=str(site))
    assert [e.cases.key for e in select_engines([], TABLE, target)] == ["vllm"]
    assert [e.dist.version for e in select_engines(["vllm"], TABLE, target)] == ["0.33.0"]
    with pytest.raises(NotInstalledError) as info:
        select_engines(["sglang"], TABLE, target)
    assert info.value.exit_code == 4
    with pytest.raises(UsageError):
        select_engines(["tgi"], TABLE, target)


def test_selection_refuses_an_undriven_version(tmp_path):
    site = make_dist(tmp_path / "site", name="vllm", version="0.30.0", files={"vllm/__init__.py": ""})
    target = resolve_target(site_packages=str(site))
    with pytest.raises(UnsupportedVersionError) as info:
        select_engines(["vllm"], TABLE, target)
    assert info.value.exit_code == 5 and "0.31.0, 0.32.0, 0.33.0" in str(info.value)
    with pytest.raises(NotInstalledError):  # nothing verifiable installed when no engine is named
        select_engines([], TABLE, target)


# --------------------------------------------------------------------------------------------- worker errors


def _engine(tmp_path):
    site = make_dist(tmp_path / "site", name="vllm", version="0.33.0", files={"vllm/__init__.py": ""})
    return select_engines(["vllm"], TABLE, resolve_target(site_packages=str(site)))[0]


def test_missing_engine_dependency_names_the_module_and_the_install_command(tmp_path):
    engine = _engine(tmp_path)
    with pytest.raises(MissingDependencyError) as info:
        _raise_worker_error(engine, "/venv/bin/python", {"kind": "missing-dependency", "module": "zmq",
                                                         "message": "importing vllm needs zmq"})
    assert info.value.exit_code == 10
    assert info.value.hint == "/venv/bin/python -m pip install pyzmq"
    with pytest.raises(MissingDependencyError) as info:
        _raise_worker_error(engine, "/venv/bin/python", {"kind": "missing-dependency", "module": "triton",
                                                         "message": "cannot import triton"})
    assert "'triton~=3.8.0'" in info.value.hint


def test_wrong_triton_and_engine_code_errors(tmp_path):
    engine = _engine(tmp_path)
    with pytest.raises(MissingDependencyError) as info:
        _raise_worker_error(engine, "py", {"kind": "triton-version", "message": "triton 3.7.1 is installed"})
    assert info.value.hint == "py -m pip install 'triton~=3.8.0'"
    with pytest.raises(VerificationError):
        _raise_worker_error(engine, "py", {"kind": "engine-code", "message": "no unified_attention()"})
    with pytest.raises(T4PatchError) as info:
        _raise_worker_error(engine, "py", {"kind": "internal", "message": "KeyError"})
    assert info.value.exit_code == 1


def test_a_worker_that_dies_without_a_result_is_reported(tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'Segmentation fault in libtriton' >&2\nexit 139\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    request = {"engine": {"distribution": "vllm"}, "result_path": str(tmp_path / "result.json")}
    with pytest.raises(T4PatchError) as info:
        run_worker(str(fake), request, tmp_path)
    assert "exited 139 without a result: Segmentation fault in libtriton" in str(info.value)


# --------------------------------------------------------------------------------------------- the command


@pytest.mark.parametrize("shared, code", [(65536, 0), (98304, 12)])
def test_cli_exit_code_and_json(tmp_path, monkeypatch, cli, shared, code):
    site = make_dist(tmp_path / "site", name="vllm", version="0.33.0", files={"vllm/__init__.py": ""})
    seen = {}

    def fake_verify(names, arch, target, *, python=None, site_packages=None, **kwargs):
        seen.update(names=names, arch=arch.name, python=python, site_packages=site_packages)
        return report_for(worker_results(shared))

    monkeypatch.setattr(attention_mod, "verify_attention", fake_verify)
    result = cli("verify", "attention", "vllm", "--site-packages", str(site), "--json")
    assert result.code == code, result.err
    doc = json.loads(result.out)
    assert doc["schema"] == 1 and doc["command"] == "verify attention" and doc["ok"] is (code == 0)
    assert seen == {"names": ["vllm"], "arch": "sm_75", "python": None, "site_packages": str(site.resolve())}
    if code:
        assert "do not fit sm_75" in result.err and "next: t4patch apply vllm==0.33.0" in result.err


def test_cli_text_output_and_arch_option(tmp_path, monkeypatch, cli):
    site = make_dist(tmp_path / "site", name="vllm", version="0.33.0", files={"vllm/__init__.py": ""})
    monkeypatch.setattr(attention_mod, "verify_attention", lambda *a, **k: report_for(worker_results(65536)))
    result = cli("verify", "attention", "--arch", "sm_80", "--site-packages", str(site))
    assert result.code == 0
    assert "kernel_unified_attention" in result.out
    bad = cli("verify", "attention", "--arch", "sm_61", "--site-packages", str(site))
    assert bad.code == 2 and "expected one of" in bad.err


def test_worker_progress_reaches_the_terminal_line(tmp_path):
    """The worker's per-case progress lines are shown while it runs, on a terminal only."""
    import io
    import sys

    from t4patch.verify.attention.runner import TerminalProgress

    script = tmp_path / "fake_worker.py"
    script.write_text(textwrap.dedent("""
        import json, sys, time
        request = json.load(open(sys.argv[-1]))
        for i in range(3):
            with open(request["progress_path"], "a") as f:
                f.write(f"{i}/3 cases\\n")
            time.sleep(0.5)
        open(request["result_path"], "w").write(json.dumps({"ok": True}))
    """))
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nfor last; do :; done\nexec "{sys.executable}" "{script}" "$last"\n')
    python.chmod(0o755)
    request = {"engine": {"distribution": "x"}, "result_path": str(tmp_path / "result.json"),
               "progress_path": str(tmp_path / "progress.txt")}
    seen: list[str] = []
    assert run_worker(str(python), request, tmp_path, progress=seen.append) == {"ok": True}
    assert seen and seen[0].endswith("/3 cases") and seen == sorted(seen)

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty, pipe = Tty(), io.StringIO()
    for stream in (tty, pipe):
        line = TerminalProgress(stream)
        line.show("verify attention: x 1.0 for sm_75: compiling, 1/3 cases done, 0 s")
        line.clear()
    assert "\r" in tty.getvalue() and "1/3 cases" in tty.getvalue() and tty.getvalue().endswith("\r")
    assert pipe.getvalue() == ""  # never in logs or pipes


# --------------------------------------------------------------------------------------------- dot path (issue 21.2)
# Shaped like what Triton 3.8 writes for an fp16 attention dot compiled for sm_75: TTIR keeps the author's types,
# TTGIR on the FMA path widens the operands to f32 under a blocked layout, on tensor cores the result is #mma.
TTIR_FP16 = """
    %qk = tt.dot %q, %k, %cst, inputPrecision = tf32 : tensor<16x512xf16> * tensor<512x16xf16> -> tensor<16x16xf32> loc(#loc9)
    %acc = tt.dot %p, %v, %acc_in {maxNumImpreciseAcc = 0 : i32} : tensor<16x16xf16> * tensor<16x512xf16> -> tensor<16x512xf32> loc(#loc10)
"""
TTIR_FP32 = """
    %s = tt.dot %q, %k, %cst, inputPrecision = tf32 : tensor<16x256xf32> * tensor<256x32xf32> -> tensor<16x32xf32> loc(#l)
"""
TTGIR_FMA = """
#blocked2 = #ttg.blocked<{sizePerThread = [1, 4], threadsPerWarp = [4, 8], warpsPerCTA = [4, 1], order = [1, 0]}>
    %qk = tt.dot %a, %b, %c, inputPrecision = tf32 : tensor<16x512xf32, #ttg.dot_op<{opIdx = 0, parent = #blocked2}>> * tensor<512x16xf32, #ttg.dot_op<{opIdx = 1, parent = #blocked2}>> -> tensor<16x16xf32, #blocked2> loc(#loc9)
    %acc = tt.dot %p, %v, %d, inputPrecision = tf32 : tensor<16x16xf32, #ttg.dot_op<{opIdx = 0, parent = #blocked2}>> * tensor<16x512xf32, #ttg.dot_op<{opIdx = 1, parent = #blocked2}>> -> tensor<16x512xf32, #blocked2> loc(#loc10)
"""
TTGIR_MMA = """
#mma = #ttg.nvidia_mma<{versionMajor = 2, versionMinor = 1, warpsPerCTA = [4, 1], instrShape = [16, 8]}>
    %qk = tt.dot %a, %b, %c, inputPrecision = tf32 : tensor<16x512xf16, #ttg.dot_op<{opIdx = 0, parent = #mma, kWidth = 2}>> * tensor<512x16xf16, #ttg.dot_op<{opIdx = 1, parent = #mma, kWidth = 2}>> -> tensor<16x16xf32, #mma> loc(#loc9)
    %acc = tt.dot %p, %v, %d, inputPrecision = tf32 : tensor<16x16xf16, #ttg.dot_op<{opIdx = 0, parent = #mma, kWidth = 2}>> * tensor<16x512xf16, #ttg.dot_op<{opIdx = 1, parent = #mma, kWidth = 2}>> -> tensor<16x512xf32, #mma> loc(#loc10)
"""
PTX_MMA = """
\tmma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 { %r53, %r54, %r55, %r56 }, { %r33, %r34 }, { %r35 }, { %r53, %r54, %r55, %r56 };
\t@%p7 mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 { %r1, %r2, %r3, %r4 }, { %r5, %r6 }, { %r7 }, { %r1, %r2, %r3, %r4 };
\tfma.rn.f32 \t%f1, %f2, %f3, %f4;
\tfma.rn.ftz.f32 \t%f1, %f2, %f3, %f4;
\tfma.rn.f32x2 \t%f1, %f2, %f3, %f4;
\t// mma.sync in a comment is not an instruction
"""
PTX_FMA = "\tfma.rn.f32 \t%f1, %f2, %f3, %f4;\n" * 7 + "\tmul.f32 %f1, %f2, %f3;\n"


def test_ptx_counts_only_the_instructions_named():
    assert kernel_path.count_mma_sync(PTX_MMA) == 2  # with and without a predicate; not the comment
    assert kernel_path.count_fma_f32(PTX_MMA) == 1  # not .ftz, not the f32x2 form
    assert (kernel_path.count_mma_sync(PTX_FMA), kernel_path.count_fma_f32(PTX_FMA)) == (0, 7)


def test_the_path_of_a_kernel_is_read_from_its_ir():
    fma = kernel_path.analyse(TTIR_FP16, TTGIR_FMA, PTX_FMA)
    assert fma.path == "fma" and fma.fp16_dots_on_fma == 2 and fma.has_fp16_dot
    assert [(d.a, d.b, d.acc) for d in fma.dots] == [("f16", "f16", "f32")] * 2  # TTIR types, not TTGIR's f32
    mma = kernel_path.analyse(TTIR_FP16, TTGIR_MMA, PTX_MMA)
    assert (mma.path, mma.fp16_dots_on_fma, mma.mma_sync, mma.fma_f32) == ("mma", 0, 2, 1)
    assert kernel_path.analyse("tt.return", "tt.return", "ret;").path == "none"
    fp32 = kernel_path.analyse(TTIR_FP32, TTGIR_FMA.split("\n    %acc")[0], PTX_FMA)
    assert fp32.path == "fma" and not fp32.has_fp16_dot and fp32.fp16_dots_on_fma == 0
    mixed = kernel_path.analyse(TTIR_FP16, TTGIR_MMA.split("\n    %acc")[0] + TTGIR_FMA.split("loc(#loc9)")[1], None)
    assert mixed.path == "mixed" and mixed.fp16_dots_on_fma == 1 and mixed.mma_sync is None


def test_ir_that_does_not_line_up_claims_nothing():
    # TTIR has two dots, TTGIR one: no dot is said to be on tensor cores, so a patched check cannot pass on it
    unsure = kernel_path.analyse(TTIR_FP16, TTGIR_MMA.split("\n    %acc")[0], PTX_MMA)
    assert unsure.path is None and unsure.fp16_dots_on_fma == 2
    assert kernel_path.analyse(None, None, None).path == "none" and kernel_path.analyse(None, None, None).mma_sync is None
    hopper = kernel_path.analyse(None, "%0 = ttng.warp_group_dot %a, %b, %c : ...", None)
    assert hopper.path == "mma" and hopper.dots[0].a == "?"


def _dot_launch(name: str, nbytes: int, path: str, *, spills: int = 0, fp16: bool = True, **tiles) -> dict:
    base = launch(name, nbytes, **tiles)
    kind = "f16" if fp16 else "f32"
    on_cores = path == "mma"
    base.update(spills=spills, dot_path=path, mma_sync=128 if on_cores else 0, fma_rn_f32=6 if on_cores else 4102,
                dots=[{"a": kind, "b": kind, "acc": "f32", "tensor_cores": on_cores}] * 2)
    return base


def _no_dot(name: str, nbytes: int, **tiles) -> dict:
    return {**launch(name, nbytes, **tiles), "dot_path": "none", "mma_sync": 0, "fma_rn_f32": 17, "dots": []}


def _two_pass(patched_path: str = "mma", stock_path: str = "fma", spills: int = 0) -> tuple[list[dict], list[dict]]:
    patched, stock = [], []
    for layer in ("sliding", "full"):
        for case in ("prefill", "decode-large"):
            patched.append({"layer": layer, "case": case, "path": "2d", "error": None, "launches": [
                _dot_launch("kernel_unified_attention", 49152, patched_path, spills=spills, BLOCK_M=16, TILE_SIZE=16)]})
            stock.append({"layer": layer, "case": case, "path": "2d", "error": None, "launches": [
                _dot_launch("kernel_unified_attention", 65536, stock_path, spills=690, BLOCK_M=16, TILE_SIZE=16)]})
        for case in ("decode-small",):
            launches = [_dot_launch("kernel_unified_attention", 49152, patched_path, BLOCK_M=16, TILE_SIZE=16),
                        _no_dot("reduce_segments", 0, TILE_SIZE=16)]
            patched.append({"layer": layer, "case": case, "path": "3d", "error": None, "launches": launches})
            stock.append({"layer": layer, "case": case, "path": "3d", "error": None, "launches": [
                _dot_launch("kernel_unified_attention", 65536, stock_path, BLOCK_M=16, TILE_SIZE=16),
                _no_dot("reduce_segments", 0, TILE_SIZE=16)]})
        for case, path in (("int4-prefill", "2d"), ("int4-decode-small", "3d"), ("int4-decode-large", "2d")):
            packed = [_dot_launch("_attn_packed", 33792, "fma", spills=94, fp16=False, BLOCK_M=16, TILE_SIZE=16)]
            for out in (patched, stock):  # fp32 dots by design: FMA on both, never required on tensor cores
                out.append({"layer": layer, "case": case, "path": path, "error": None, "launches": packed})
    return patched, stock


def _report_two_pass(patched: list[dict], stock: list[dict] | None, *, arch=SM75, applied: bool = True):
    engine = EngineResult(
        key="vllm", distribution="vllm", version="0.33.0", site_packages="/site", patch_state="patch set applied",
        patch_overall="applied", interpreter="/usr/bin/python3",
        versions={"python": "3.11", "torch": "2.13.0+cpu", "triton": "3.8.0"}, loader={"route": "real package import"},
        files={}, cases=case_results(patched, VLLM, TABLE.model, arch, stock_results=stock,
                                     require_mma=applied and arch.name in TABLE.compiler.mma_archs,
                                     stock_required_fma=applied and arch.capability < 80),
        compiler={"distribution": "triton", "version": "3.8.0", "root": "/site", "t4patch_set": "applied",
                  "passes": ["patched", "stock"] if stock is not None else ["as-installed"],
                  "stock_env": {"T4PATCH_TRITON_MMA": "0"}, "environment": {"T4PATCH_TRITON_MMA": None}},
    )
    return AttentionReport(arch=arch, model=TABLE.model, target={}, engines=(engine,))


def test_shipped_case_table_names_the_compiler_switch():
    assert TABLE.compiler is not None and TABLE.compiler.distribution == "triton"
    assert TABLE.compiler.stock_env == {"T4PATCH_TRITON_MMA": "0"} and TABLE.compiler.mma_archs == ("sm_75",)


def test_patched_triton_on_tensor_cores_passes_and_shows_stock_beside_it():
    report = _report_two_pass(*_two_pass())
    assert report.ok, report.failures()
    check(report)
    rendered = report.render_text()
    assert all(len(line) <= 120 for line in rendered.splitlines())
    text = " ".join(rendered.split())  # wrapped to 120 columns
    assert "t4patch's Triton set applied: every launch compiled as patched (rows) and with T4PATCH_TRITON_MMA=0" in text
    assert "tiles: BLOCK_M=16 TILE_SIZE=16; dots 2 f16*f16->f32; mma.sync 128, fma.rn.f32 6" in text
    assert "dots 2 f32*f32->f32; mma.sync 0, fma.rn.f32 4,102" in text  # the INT4 kernel's dots are fp32
    assert "stock Triton: fma, mma.sync 0, fma.rn.f32 4,102, 65,536 B (fits), 64 regs, 690 spills" in text
    assert "dot paths: 6 fma, 6 mma, 2 none; stock Triton (set switched off): 12 fma, 2 none" in text
    kernel = report.to_json()["engines"][0]["cases"][0]["kernels"][0]
    assert (kernel["dot_path"], kernel["mma_sync"], kernel["fp16_dots"], kernel["fp16_dots_on_fma"]) == ("mma", 128, 2, 0)
    assert kernel["stock"]["dot_path"] == "fma" and kernel["stock"]["spills"] == 690


def test_patched_fp16_dot_on_fma_or_spilling_fails_with_exit_12():
    on_fma = _report_two_pass(*_two_pass(patched_path="fma"))
    problems = [p for _, c in on_fma.failures() for p in c.problems]
    assert len(on_fma.failures()) == 6 and all("fp16 tl.dot on the FMA path" in p for p in problems)
    assert "2 of 2 fp16 tl.dot on the FMA path with t4patch's Triton set applied (mma.sync 0, fma.rn.f32 4,102)" in problems[0]
    with pytest.raises(VerificationError) as info:
        check(on_fma)
    assert info.value.exit_code == 12 and "6 attention case(s) fail on sm_75" in info.value.message
    assert "tensor cores without spilling" in (info.value.hint or "")
    spilling = _report_two_pass(*_two_pass(spills=12))
    assert {c.case for _, c in spilling.failures()} == {"prefill", "decode-large"}
    assert "kernel_unified_attention spills 12 words per thread on the patched compile" in spilling.failures()[0][1].problems[0]


def test_stock_compile_with_tensor_cores_is_a_cache_key_mixup():
    patched, stock = _two_pass(stock_path="mma")
    report = _report_two_pass(patched, stock)
    problems = [p for _, c in report.failures() for p in c.problems]
    assert problems and all("a patched kernel was reused from Triton's cache" in p for p in problems)


def test_without_the_triton_set_fma_and_spills_do_not_fail():
    patched, _ = _two_pass(patched_path="fma", spills=600)
    report = _report_two_pass(patched, None, applied=False)
    assert report.ok
    assert "spills cost speed, never correctness" in " ".join(report.render_text().split())


def test_the_set_is_required_only_where_it_serves():
    sm70 = load_archs()["sm_70"]  # Volta: the set is gated on exactly cc 7.5, so FMA there is expected
    patched, stock = _two_pass(patched_path="fma")
    assert not [p for _, c in _report_two_pass(patched, stock, arch=sm70).failures() for p in c.problems
                if "FMA path" in p]


def test_missing_modules_are_named_at_once_with_the_verify_extra(tmp_path):
    engine = _engine(tmp_path)
    error = {"kind": "missing-dependency", "module": "torch", "modules": ["torch", "triton", "regex"],
             "message": "cannot import torch, triton, regex"}
    with pytest.raises(MissingDependencyError) as info:
        _raise_worker_error(engine, "/t4/bin/python", error)
    message, hint = info.value.message, info.value.hint
    assert "cannot import torch, triton, regex" in message and "verify extra" in message
    assert hint.startswith("/t4/bin/python -m pip install --extra-index-url https://download.pytorch.org/whl/cpu ")
    for spec in ("'torch>=2.4'", "'triton~=3.8.0'", "numpy", "regex"):  # the whole extra in one command
        assert spec in hint.split(), (spec, hint)
    # a release whose torch pins triton 3.7: the same command with that series, said in the message
    old = select_engines(["vllm"], TABLE, resolve_target(site_packages=str(
        make_dist(tmp_path / "old", name="vllm", version="0.32.0", files={"vllm/__init__.py": ""}))))[0]
    with pytest.raises(MissingDependencyError) as info:
        _raise_worker_error(old, "/t4/bin/python", error)
    assert "'triton~=3.7.0'" in info.value.hint.split() and "triton 3.7.x for vllm 0.32.0" in info.value.message
    # the target's interpreter (--python): only what is missing, never a second torch into the serving env
    with pytest.raises(MissingDependencyError) as info:
        _raise_worker_error(engine, "/srv/bin/python", {**error, "modules": ["regex"]}, own_interpreter=False)
    assert info.value.hint == "/srv/bin/python -m pip install regex"


def test_the_worker_looks_for_every_needed_module_before_importing(tmp_path, monkeypatch):
    from t4patch.verify.attention import worker

    request = {"engine": {"packages": ["vllm"], "triton_series": "3.8", "distribution": "vllm", "version": "0.33.0"},
               "root": str(tmp_path), "needs": ["torch", "triton", "numpy", "regex"]}
    monkeypatch.setattr(worker.sys, "path", list(worker.sys.path))
    monkeypatch.setattr(worker.sys, "meta_path", list(worker.sys.meta_path))
    monkeypatch.setattr(worker, "_findable", lambda name: name == "triton")  # torch, numpy, regex missing
    result = worker.run_request(request)
    assert result["ok"] is False and result["error"]["kind"] == "missing-dependency"
    # the extra's other modules are named together with torch/triton (or with the engine's own failed import)
    assert result["error"]["modules"] == ["torch", "numpy", "regex"]
