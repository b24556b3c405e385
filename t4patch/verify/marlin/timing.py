"""Kernel times that are kernel times: CUDA graphs timed with CUDA events, weights rotated past L2.

A Python loop of m = 1 GEMMs measures the launch path (~10-40 us a call), not the kernel. So a batch of calls
is captured into one CUDA graph and its replays are timed with events; the median replay divided by the number
of calls is the per-call device time. Each call in the batch reads a different copy of the weights, enough
copies to exceed the L2 cache several times, so a memory-bound GEMM is charged for DRAM traffic rather than
reading a cached weight. When capture fails (an op that synchronizes), back-to-back launches between two events
are timed instead and the method says so.

Host overhead (what a Python wrapper such as the SGLang redirect adds) is a different quantity: it is measured
with eager calls on a host clock, interleaving the two contenders round by round.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class KernelTime:
    us_per_call: float
    method: str  # "cuda-graph" or "events-back-to-back"
    calls_per_replay: int
    replays: int
    spread: float  # (max - min) / median of the replay times
    graph_error: str | None = None


def rotating_copies(bytes_per_copy: int, l2_bytes: int, over_l2: float, max_copies: int) -> int:
    """How many distinct weight copies make one pass exceed ``over_l2`` times the L2 size (at least 1)."""
    if bytes_per_copy <= 0:
        return 1
    needed = int(over_l2 * l2_bytes // bytes_per_copy) + 1
    return max(1, min(max_copies, needed))


def time_kernel(call: Callable[[int], object], copies: int, replays: int, min_calls: int = 16) -> KernelTime:
    """Median device time of ``call(i)`` (i indexes the rotating copy), per call."""
    import torch

    calls = max(copies, min_calls)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up on a side stream, as graph capture requires
        for i in range(min(calls, 3)):
            call(i % copies)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph_error = None
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(calls):
                call(i % copies)
        graph.replay()
        torch.cuda.synchronize()

        def run_once() -> None:
            graph.replay()

        method = "cuda-graph"
    except Exception as exc:  # noqa: BLE001 - any capture failure: fall back and report why
        graph_error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
        torch.cuda.synchronize()

        def run_once() -> None:
            for i in range(calls):
                call(i % copies)

        method = "events-back-to-back"
    samples = []
    for _ in range(replays):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        run_once()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1000.0 / calls)
    median = statistics.median(samples)
    spread = (max(samples) - min(samples)) / median if median > 0 else 0.0
    return KernelTime(median, method, calls, replays, spread, graph_error)


@dataclass(frozen=True)
class HostOverhead:
    us_a: float  # median per-call wall time of a
    us_b: float  # median per-call wall time of b
    diff_us: float  # median of the per-round paired differences b - a
    diff_iqr_us: float  # interquartile range of those differences: the resolution of this measurement
    rounds: int
    calls_per_round: int

    @property
    def overhead(self) -> float:
        """Median paired (b - a) relative to a: the extra time of b per call."""
        return self.diff_us / self.us_a if self.us_a > 0 else float("nan")


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def host_overhead(call_a: Callable[[], object], call_b: Callable[[], object], calls: int, rounds: int) -> HostOverhead:
    """Per-call wall time of eager calls of ``a`` and ``b`` in paired rounds (ABBA order, garbage collector off).

    A round times ``calls`` back-to-back calls of each, synchronizing the GPU around each batch. The host
    clock is right here: at m = 1 an eager Marlin call is bound by the Python and dispatch path, which is
    exactly what a wrapper adds to. Paired differences cancel most of the machine's drift between rounds.
    """
    import gc

    import torch

    cuda = torch.cuda.is_available()

    def batch(call: Callable[[], object]) -> float:
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        if cuda:
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e6 / calls

    for _ in range(2):  # warm-up: caches, allocator, lazy imports inside the wrappers
        batch(call_a)
        batch(call_b)
    collecting = gc.isenabled()
    gc.disable()
    a_times: list[float] = []
    b_times: list[float] = []
    try:
        for index in range(rounds):
            if index % 2 == 0:
                a_times.append(batch(call_a))
                b_times.append(batch(call_b))
            else:
                b_times.append(batch(call_b))
                a_times.append(batch(call_a))
    finally:
        if collecting:
            gc.enable()
    diffs = [b - a for a, b in zip(a_times, b_times)]
    return HostOverhead(
        us_a=statistics.median(a_times),
        us_b=statistics.median(b_times),
        diff_us=statistics.median(diffs),
        diff_iqr_us=_quantile(diffs, 0.75) - _quantile(diffs, 0.25),
        rounds=rounds,
        calls_per_round=calls,
    )


def copy_bandwidth_gb_per_s(nbytes: int = 1 << 30, repeats: int = 5) -> float:
    """Measured device-to-device copy rate (bytes read + bytes written, per second): the practical ceiling
    of a memory-bound kernel on this GPU, next to the datasheet figure."""
    import torch

    free, _ = torch.cuda.mem_get_info()
    nbytes = max(1 << 20, min(nbytes, free // 8))
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    src.fill_(1)
    dst = torch.empty_like(src)
    dst.copy_(src)
    samples = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1000.0)
    del src, dst
    return 2 * nbytes / statistics.median(samples) / 1e9
