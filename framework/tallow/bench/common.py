"""Shared pieces of the benchmarks: building an engine, timing, percentiles, reporting."""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from functools import partial
from typing import TYPE_CHECKING, Any, Callable

import torch

if TYPE_CHECKING:
    from tallow.config import TallowConfig
    from tallow.engine.builder import EngineParts
    from tallow.engine.core_output import CoreOutput
    from tallow.engine.llm_engine import LLMEngine
    from tallow.kernels.kv_cache import KVFootprint


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    k = (len(values) - 1) * q / 100.0
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def now() -> float:
    return time.perf_counter()


def random_prompts(n: int, lengths: list[int], vocab: int, seed: int = 0) -> list[list[int]]:
    """Token-id prompts (ids ≥ 10 so no special/eos id of the synthetic vocab appears)."""
    rng = random.Random(seed)
    hi = max(11, vocab - 1)
    return [[rng.randint(10, hi) for _ in range(lengths[i])] for i in range(n)]


def lengths(n: int, fixed: int | None, lo: int | None, hi: int | None, seed: int) -> list[int]:
    if lo is not None and hi is not None:
        rng = random.Random(seed)
        return [rng.randint(lo, hi) for _ in range(n)]
    if fixed is None:
        raise ValueError("give a fixed length or a --min/--max range")
    return [fixed] * n


def input_prompts(args: argparse.Namespace, vocab: int) -> tuple[list[int], list[list[int]]]:
    """(lengths, token ids) of ``args.num_prompts`` random inputs of the ``--input-len`` /
    ``--min-input-len``/``--max-input-len`` lengths: the same every run."""
    in_lens = lengths(
        args.num_prompts, args.input_len, args.min_input_len, args.max_input_len, seed=10
    )
    return in_lens, random_prompts(args.num_prompts, in_lens, vocab, seed=12)


def build_config(args: argparse.Namespace) -> TallowConfig:
    from tallow.config import load_config

    return load_config(args)


def build_engine(config: TallowConfig, queued: int = 0) -> LLMEngine:
    """The engine a benchmark measures, with the start-up heap frozen out of the garbage
    collector as ``tallow serve`` does. ``queued``: requests the benchmark adds at once; the
    waiting queue is widened to hold them (a server's limit guards against overload, which an
    offline run is not)."""
    from tallow.engine.builder import freeze_startup_heap
    from tallow.engine.llm_engine import LLMEngine

    config.scheduler.max_waiting = max(config.scheduler.max_waiting, queued)
    engine = LLMEngine.from_config(config)
    engine.core.trace_steps()  # the benchmarks report where a step's time goes
    freeze_startup_heap()
    return engine


def last_step(engine: LLMEngine) -> CoreOutput:
    """What the engine's latest step did (its updates, its timings)."""
    out = engine.last_step
    if out is None:
        raise RuntimeError("the engine has not run a step yet")
    return out


def kv_footprint(parts: EngineParts) -> KVFootprint:
    """The KV cache's cost per token and block (every engine but an embedding one has it)."""
    if parts.kv_footprint is None:
        raise RuntimeError("this engine keeps no KV cache")
    return parts.kv_footprint


def kv_capacity(parts: EngineParts) -> dict[str, Any]:
    """The KV cache of a built engine: its codec, the tokens it holds, and tokens per GiB
    against a 16-bit cache of the same layers (scales included)."""
    cost = kv_footprint(parts)
    blocks = parts.core.scheduler.block_manager.num_total_blocks
    return {
        "kv_codec": parts.kv_codec,
        "kv_blocks": blocks,
        "kv_capacity_tokens": cost.tokens(blocks),
        "kv_bytes_per_token": cost.bytes_per_token,
        "kv_tokens_per_gib": cost.tokens_per_gib,
        "kv_capacity_vs_bf16": cost.vs_bf16,
    }


def kv_capacity_rows(r: dict[str, Any]) -> list[tuple[str, Any]]:
    return [
        ("KV codec", r["kv_codec"]),
        ("KV blocks", r["kv_blocks"]),
        ("KV capacity (tokens)", r["kv_capacity_tokens"]),
        ("KV tokens per GiB", r["kv_tokens_per_gib"]),
        ("KV capacity vs a 16-bit cache", f"{r['kv_capacity_vs_bf16']:.2f}x"),
    ]


def speculative(engine: LLMEngine) -> dict[str, Any]:
    """Speculative decoding's counters of the engine's run (empty without it): proposals
    verified, tokens proposed and kept, acceptance rate and mean accepted length."""
    stats = engine.core.stats()
    return {key[len("spec_") :]: value for key, value in stats.items() if key.startswith("spec_")}


def speculative_rows(r: dict[str, Any]) -> list[tuple[str, Any]]:
    spec = r.get("speculative") or {}
    if not spec:
        return []
    return [
        ("speculative: proposals verified", spec["num_proposals"]),
        (
            "speculative: tokens proposed / kept",
            f"{spec['num_proposed_tokens']} / {spec['num_accepted_tokens']}",
        ),
        ("speculative: acceptance rate", spec["acceptance_rate"]),
        ("speculative: mean accepted length", spec["mean_accepted_length"]),
    ]


def quantization(parts: EngineParts) -> str:
    """What holds the weights: the quant scheme's summary, or the dense dtype."""
    quant = parts.loaded.quant
    summary = getattr(quant, "summary", None)
    if summary is not None:
        return summary()
    if quant is not None:
        return type(quant).__name__
    return "none (" + str(parts.loaded.dtype).replace("torch.", "") + ")"


def print_report(
    title: str, rows: list[tuple[str, Any]], as_json: bool, payload: dict[str, Any]
) -> None:
    if as_json:
        print(json.dumps(payload, indent=2, default=float))
        return
    width = max(len(k) for k, _ in rows)
    print(title)
    print("-" * (width + 24))
    for key, value in rows:
        if isinstance(value, float):
            value = f"{value:,.2f}"
        print(f"{key:<{width}}  {value}")


def copy_bandwidth(device: torch.device, nbytes: int = 2 << 30, iters: int = 20) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting the read and the write."""
    if device.type != "cuda":
        return float("nan")
    n = nbytes // 2
    src = torch.empty(n, dtype=torch.float16, device=device)
    dst = torch.empty_like(src)
    seconds = _seconds_per_call(device, partial(dst.copy_, src), iters)
    del src, dst  # frees the buffers before the cache is emptied
    torch.cuda.empty_cache()
    return 2 * nbytes / seconds


def _seconds_per_call(device: torch.device, fn: Callable[[], Any], iters: int) -> float:
    """Device time of one ``fn()`` on ``device`` (CUDA events), after three untimed calls."""
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    sync(device)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    sync(device)
    return start.elapsed_time(end) / 1000.0 / iters


def gemm_flops(
    device: torch.device,
    dtype: torch.dtype = torch.bfloat16,
    shape: tuple[int, int, int] = (8192, 4096, 14336),
    iters: int = 20,
) -> float | None:
    """Dense matmul throughput of ``device`` in FLOP/s, for ``[M, K] @ [K, N]`` of ``shape``
    (by default a llama-3-8b MLP projection over an 8,192-token prompt step): the card's own
    speed on the work that bounds prompt steps, recorded beside a run so that runs on
    different cards of one model compare. None off CUDA."""
    if device.type != "cuda":
        return None
    m, k, n = shape
    a = torch.randn(m, k, dtype=dtype, device=device)
    b = torch.randn(k, n, dtype=dtype, device=device)
    seconds = _seconds_per_call(device, partial(torch.matmul, a, b), iters)
    del a, b  # frees the operands before the cache is emptied
    torch.cuda.empty_cache()
    return 2.0 * m * k * n / seconds
