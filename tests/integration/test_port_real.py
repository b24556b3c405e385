"""`t4patch port` on the real released wheels: it reproduces the shipped sets (what landed by itself is
byte-identical to what ships; the hand edits are exactly the hunks it reported as failed), and on a release
t4patch does not ship (SGLang 0.5.20, which lacks a file the Marlin redirect targets) it reports the truth
and writes a draft that apply refuses. The transcripts of these runs are in docs/maintaining.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from t4patch.patching.manifest import load_patch_set
from t4patch.patching.registry import find_patch_set
from tests.helpers import extracted_wheel, site_from_extracted, wheel_path

pytestmark = pytest.mark.integration

MOE = "sglang/kernels/ops/moe/moe_wna16_marlin.py"
EXTEND = "sglang/kernels/ops/attention/extend_attention.py"
GEMM = "sglang/kernels/ops/gemm/gptq_marlin.py"


def run_port(cli, tmp_path: Path, spec: str, old: str) -> tuple[dict, Path]:
    name, new = spec.split("==")
    wheel_path(name, new), wheel_path(name, old)  # downloaded through the tests' cache, with progress
    result = cli("port", spec, "--from", f"{name}=={old}", "-o", str(tmp_path / "drafts"), "--json")
    report = json.loads(result.out)
    # a draft that needs a hand edit is exit 17 (IncompletePortError), a complete one 0
    assert result.code == (0 if report["complete"] else 17), result.err
    return report, Path(report["draft"]) if report["draft"] else tmp_path


def hunk_methods(report: dict) -> dict[tuple[str, str], list[str]]:
    return {(d["old_file"], f["path"]): [h["method"] for h in f["hunks"]] for d in report["diffs"] for f in d["files"]}


# 0001's three hunks (compile-first since ff19e09): the clamp helpers, then the 2D and the 3D launch; each lands
# by itself at its own offset
@pytest.mark.parametrize(("spec", "old", "offsets"), [("vllm==0.32.0", "0.33.0", [-13, -28, -28]),
                                                       ("vllm==0.31.0", "0.33.0", [-21, -36, -36]),
                                                       ("vllm==0.33.0", "0.32.0", [13, 28, 28])])
def test_vllm_ports_are_complete_and_equal_the_shipped_sets(cli, tmp_path, spec, old, offsets):
    report, draft = run_port(cli, tmp_path, spec, old)
    assert report["diffs"][0]["old_file"] == "0001-triton-attention-tile-clamp.diff"
    hunks = report["diffs"][0]["files"][0]["hunks"]
    assert [(h["method"], h["offset"]) for h in hunks] == [("offset", o) for o in offsets] and report["complete"]
    shipped = find_patch_set("vllm", spec.split("==")[1])
    ported = load_patch_set(draft)
    assert ported.draft and [(t.path, t.pristine_sha256, t.patched_sha256) for t in ported.targets] == [
        (t.path, t.pristine_sha256, t.patched_sha256) for t in shipped.targets
    ]


@pytest.mark.parametrize("version", ["0.5.22", "0.5.21"])
def test_sglang_ports_need_exactly_the_two_hand_edits_that_ship(cli, tmp_path, version):
    report, draft = run_port(cli, tmp_path, f"sglang=={version}", "0.5.23")
    methods = hunk_methods(report)
    failed = sorted(key for key, hunks in methods.items() if "failed" in hunks)
    # 0005 (norms) was written for 0.5.21 from its own file: its RMSNorm.forward_cuda has no quant_linear argument
    norms = [("0005-norms-native-below-sm80.diff", "sglang/srt/layers/layernorm.py")] if version == "0.5.21" else []
    assert failed == sorted([("0002-marlin-via-vllm-below-sm80.diff", MOE),
                             ("0004-triton-attention-tiles-below-sm80.diff", EXTEND), *norms])
    assert methods[("0002-marlin-via-vllm-below-sm80.diff", MOE)] == ["exact", "failed"]
    # 0004's eight extend hunks: the import hunk conflicts (the older files import context_attention_fwd next to
    # _extract_kv_strides); the tile function's signature, its FMA-path loop, the halving helper, the
    # t4patch_fit=True call and the launch split into fwd_args/fwd_kwargs land at an offset; the compile-first
    # check before the launch lands by a 3-way merge
    assert methods[("0004-triton-attention-tiles-below-sm80.diff", EXTEND)] == ["failed", *["offset"] * 6, "merge"]
    assert report["missing_files"] == [] and not report["complete"]
    if version == "0.5.22":  # 0.5.21 also renames the vLLM release in the added text (it pairs with vLLM 0.32.0)
        shipped = {t.path: t.patched_sha256 for t in find_patch_set("sglang", version).targets}
        ported = {t.path: t.patched_sha256 for t in load_patch_set(draft).targets}
        assert {p for p in shipped if shipped[p] != ported[p]} == {MOE, EXTEND}


def test_sglang_0_5_20_report_is_truthful_and_its_draft_is_refused(cli, tmp_path, monkeypatch):
    report, draft = run_port(cli, tmp_path, "sglang==0.5.20", "0.5.21")
    assert report["missing_files"] == [GEMM], "0.5.20 has no sglang/kernels/ops/gemm/gptq_marlin.py"
    gemm = [f for d in report["diffs"] for f in d["files"] if f["path"] == GEMM]
    assert gemm and all(h["method"] == "failed" and "not in" in h["note"] for h in gemm[0]["hunks"])
    assert not report["complete"] and report["draft"]
    ps = load_patch_set(draft)
    assert ps.draft and GEMM not in {t.path for t in ps.targets}
    site = site_from_extracted(extracted_wheel(wheel_path("sglang", "0.5.20")), tmp_path / "site",
                               [t.path for t in ps.targets])
    before = {t.path: (site / t.path).read_bytes() for t in ps.targets}
    monkeypatch.setenv("T4PATCH_PATCHES", str(tmp_path / "drafts"))  # as --patches DIR, undone after the test
    refused = cli("apply", "sglang==0.5.20", "--site-packages", str(site))
    assert refused.code == 7 and "is a draft written by `t4patch port`" in refused.err
    assert {t.path: (site / t.path).read_bytes() for t in ps.targets} == before
