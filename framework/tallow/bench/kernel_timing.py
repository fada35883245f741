"""Device time of one kernel launch, for the kernel micro-benchmarks under ``bench/``.

A decode step's GEMVs and GEMMs run from a CUDA graph, each reading its weight from HBM. The
timings here measure them the same way: the launches are captured in one graph (no Python
launch gaps) and rotate over enough weight copies (:data:`L2_ROTATION_BYTES`) that no read
is served from the L2 cache.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch

#: (output features, input features) of Llama-3-8B's linear layers, the shapes the kernel
#: micro-benchmarks are compared on
LLAMA3_8B_SHAPES: dict[str, tuple[int, int]] = {
    "qkv": (6144, 4096),
    "o": (4096, 4096),
    "gate_up": (28672, 4096),
    "down": (4096, 14336),
    "head": (128256, 4096),
}
#: bytes of weight copies to rotate over: well above a data-centre GPU's L2 cache
L2_ROTATION_BYTES = 400_000_000


def rotation_copies(nbytes: int) -> int:
    """How many copies of an ``nbytes`` weight to rotate over so every read comes from HBM."""
    return max(2, L2_ROTATION_BYTES // nbytes + 1)


def graph_bandwidth(fn: Callable[[int], Any], nbytes: int, iters: int = 20) -> float:
    """GB/s of ``iters`` launches of ``fn(i)`` (each moving ``nbytes``) replayed as one CUDA
    graph: no launch gaps from Python, as in the engine's captured decode step."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(3):  # compile and warm
            fn(i)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(iters):
            fn(i)
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return nbytes / (start.elapsed_time(end) / 1e3 / (5 * iters)) / 1e9


def graph_seconds(
    fn: Callable[[int], Any], copies: int, iters: int = 10, device: str = "cuda"
) -> float:
    """Device seconds of one ``fn(i)`` over ``copies`` rotated weights, replayed in a CUDA
    graph; on a CPU (a dry run of a script) the wall clock of one call."""
    if device != "cuda":
        started = time.perf_counter()
        fn(0)
        return time.perf_counter() - started
    return 1.0 / graph_bandwidth(lambda i: fn(i % copies), 1_000_000_000, iters=iters)


def graph_milliseconds(
    fn: Callable[[], Any], iters: int = 10, stream: torch.cuda.Stream | None = None
) -> float:
    """Milliseconds per replay of ``fn`` (a whole step's launches, say) captured in a CUDA
    graph on ``stream`` (a new one by default)."""
    s = stream or torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()  # compile and warm
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters
