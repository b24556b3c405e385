"""t4patch.verify.marlin.probe: the helpers the shared checks and the engines' providers share."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from t4patch.verify.marlin import probe  # noqa: E402


def test_err_is_one_bounded_line():
    assert probe.err(ValueError("first\nsecond")) == "ValueError: first"
    assert len(probe.err(RuntimeError("x" * 1000))) == probe.ERROR_CHARS


def test_rounded_and_distinct():
    assert probe.rounded(0.000123456) == 0.0001235 and probe.rounded(float("nan")) is None and probe.rounded(None) is None
    nan = torch.tensor([float("nan")]).half()
    assert probe.distinct([nan, nan.clone(), torch.tensor([1.0]).half()]) == 2  # NaN payloads equal bitwise
    assert not probe.bitwise_equal(torch.tensor([0.0]).half(), torch.tensor([-0.0]).half())
    assert probe.device_for("cpu").type == "cpu"
    probe.sync(torch.device("cpu"))  # a no-op without a GPU
