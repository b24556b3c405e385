"""The timing helpers that need no GPU: weight rotation past L2, and the paired host-overhead measurement."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from t4patch.verify.marlin import timing  # noqa: E402


def test_rotating_copies():
    l2 = 60 * 1024 * 1024
    # 3 x L2 of a 19 MiB weight: 10 copies; never fewer than 1, never more than the cap
    assert timing.rotating_copies(19 * 1024 * 1024, l2, 3.0, 512) == 10
    assert timing.rotating_copies(200 * 1024 * 1024, l2, 3.0, 512) == 1
    assert timing.rotating_copies(1024, l2, 3.0, 512) == 512
    assert timing.rotating_copies(0, l2, 3.0, 512) == 1
    assert timing.rotating_copies(1024, 0, 3.0, 512) == 1  # unknown L2: no rotation


def test_host_overhead_sees_a_slower_wrapper():
    def work(n):
        total = 0
        for i in range(n):
            total += i
        return total

    result = timing.host_overhead(lambda: work(200), lambda: work(600), calls=50, rounds=9)
    assert result.rounds == 9 and result.calls_per_round == 50
    assert result.us_b > result.us_a > 0
    assert result.overhead > 0.5  # three times the work; generous for a loaded CI box
    same = timing.host_overhead(lambda: work(300), lambda: work(300), calls=50, rounds=9)
    assert abs(same.overhead) < 0.5
