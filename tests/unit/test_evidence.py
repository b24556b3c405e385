"""t4patch.evidence: the one home of the evidence classes, worded as the reports and docs/verification print them."""

from __future__ import annotations

from t4patch import evidence


def test_each_class_in_its_words():
    assert evidence.COMPILED_ON_CPU == "compiled for sm_75 on the CPU"
    assert evidence.ran_on((9, 0)) == "ran on sm_90"
    assert evidence.ptx_jit((9, 0)) == "sm_75 code executed on sm_90 through PTX JIT, T4 host parameters emulated"
    assert evidence.ptx_jit((8, 9), host_emulated=False) == "sm_75 code executed on sm_89 through PTX JIT"
    assert evidence.measured_on_t4() == "measured on a T4"


def test_for_run_picks_the_class_from_what_ran_where():
    assert evidence.for_run(None) == evidence.COMPILED_ON_CPU
    assert evidence.for_run((7, 5), sm75_ptx_only=True) == evidence.measured_on_t4()
    assert evidence.for_run((9, 0), sm75_ptx_only=True, host_emulated=True) == evidence.ptx_jit((9, 0))
    assert evidence.for_run((9, 0)) == "ran on sm_90"
    assert evidence.parse_capability("9.0") == (9, 0) and evidence.sm_name((7, 5)) == "sm_75"
