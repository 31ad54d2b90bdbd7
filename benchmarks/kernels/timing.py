"""Timing helpers shared by the kernel benchmarks (CUDA events, CUDA graphs, bandwidth, a
switch set for the launches of a block).

Every benchmark reports times against a baseline measured in the same run; these are the
measuring tools: the median of CUDA-event timings, replays of a CUDA graph holding many
calls (so launch overhead is what a graphed model step would see), and the read bandwidth
of the GPU from a large read-only reduction.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Callable, Iterator

import torch


def gpu_slug() -> str:
    """A file-name-friendly GPU name: "NVIDIA H200" -> "h200"."""
    name = torch.cuda.get_device_name()
    return name.lower().replace("nvidia", "").strip().replace(" ", "-") or "gpu"


def event_times_ms(fn: Callable[[], object], reps: int) -> list[float]:
    """Milliseconds of ``reps`` runs of ``fn``, each between two CUDA events."""
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def time_graph(calls: list[Callable[[], object]], replays: int = 15, warm: int | None = None
               ) -> float:
    """Median microseconds per call of a CUDA graph replaying ``calls`` in order
    (``warm``: how many of the calls to run once outside the capture; default all)."""
    for c in calls[:warm]:  # compile and warm up outside the capture
        c()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    graph.replay()
    torch.cuda.synchronize()
    times = event_times_ms(graph.replay, replays)
    del graph
    return statistics.median(times) * 1000.0 / len(calls)


def time_calls(calls: list[Callable[[], object]], cpu: bool) -> float:
    """Microseconds per call: the CUDA graph timing of :func:`time_graph`, or on the CPU (a
    benchmark's ``--cpu-smoke`` run under the Triton interpreter) one call's wall time."""
    if cpu:
        t = time.perf_counter()
        calls[0]()
        return (time.perf_counter() - t) * 1e6
    return time_graph(calls, 10, warm=2)


def time_eager(fn: Callable[[], object], reps: int = 5) -> float:
    """Median microseconds of ``fn`` run eagerly (after one warm-up call)."""
    fn()
    torch.cuda.synchronize()
    return statistics.median(event_times_ms(fn, reps)) * 1000.0


def read_bandwidth_gbps(device: str = "cuda") -> float:
    """GB/s of a read-only fp32 sum over 4 GiB (median of 10)."""
    buf = torch.rand(1 << 30, device=device)
    for _ in range(3):
        buf.sum()
    torch.cuda.synchronize()
    times = event_times_ms(buf.sum, 10)
    gbps = buf.numel() * 4 / (statistics.median(times) * 1e-3) / 1e9
    del buf
    torch.cuda.empty_cache()
    return gbps


def l2_bytes() -> int:
    """The GPU's L2 cache size (inputs are rotated past a multiple of it)."""
    return getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 64 << 20)


@contextlib.contextmanager
def env_setting(name: str, value: str) -> Iterator[None]:
    """The environment variable ``name`` set to ``value`` inside the block (the kernels read
    their VLLM_PRISM_* switches at launch and graph capture), restored after."""
    saved = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved
