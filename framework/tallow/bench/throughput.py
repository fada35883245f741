"""`tallow bench throughput`: N prompts submitted at once, ignore_eos → tokens/s and req/s."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

import torch

from . import constrained
from .common import (
    build_engine,
    copy_bandwidth,
    gemm_flops,
    input_prompts,
    kv_capacity,
    kv_capacity_rows,
    last_step,
    lengths,
    now,
    quantization,
    random_prompts,
    speculative,
    speculative_rows,
    sync,
)

if TYPE_CHECKING:
    from tallow.config import TallowConfig
    from tallow.engine.llm_engine import LLMEngine


def warm_up(engine: LLMEngine) -> None:
    """A small batch before the clock starts: prompt-only steps, then prompts beside decoding
    sequences (mixed steps), so that kernels compile first."""
    from tallow.engine.sampling.params import SamplingParams

    vocab = engine.parts.core.runner.vocab_size
    for i, p in enumerate(random_prompts(4, [32] * 4, vocab, seed=13)):
        engine.add_request(
            engine.next_request_id(),
            p,
            SamplingParams(max_tokens=8, ignore_eos=True, temperature=0.0),
        )
        if i == 1:
            engine.step()
            engine.step()
    while engine.has_unfinished():
        engine.step()


def run(args: argparse.Namespace, config: TallowConfig) -> dict[str, Any]:
    if getattr(args, "json_schema", None):
        return constrained.run(args, config)
    from tallow.engine.sampling.params import SamplingParams

    from tallow.engine.loader import resolve_device

    # The card's own speed first, with nothing else allocated: cards of one model differ by a
    # few percent in GEMM throughput, as much as the changes a run is meant to compare.
    card = _card_speed(resolve_device(config.model.device))
    engine = build_engine(config, queued=args.num_prompts)
    parts = engine.parts
    device = parts.loaded.device
    n = args.num_prompts
    in_lens, prompts = input_prompts(args, parts.core.runner.vocab_size)
    out_lens = lengths(n, args.output_len, args.min_output_len, args.max_output_len, seed=11)
    warm_up(engine)
    sync(device)
    start = now()
    for prompt, out_len in zip(prompts, out_lens):
        engine.add_request(
            engine.next_request_id(),
            prompt,
            SamplingParams(max_tokens=out_len, ignore_eos=True, temperature=0.0),
            stream=False,
        )
    steps = 0
    generated = 0
    phases: dict[str, float] = {}
    while engine.has_unfinished():
        outs = engine.step()
        steps += 1
        for key, value in last_step(engine).timings.items():
            phases[key] = phases.get(key, 0.0) + value
        generated += sum(len(o.outputs[0].token_ids) for o in outs if o.finished)
    sync(device)
    elapsed = now() - start
    stats = engine.stats()
    return {
        "model": config.model.source,
        "weight_bytes": parts.loaded.weight_bytes,
        # weights and bandwidth are those of one rank (its shard) under tensor parallelism
        "tensor_parallel_size": parts.parallel.world_size if parts.parallel else 1,
        "quantization": quantization(parts),
        "num_prompts": n,
        "attention_backend": parts.attention_backend,
        "cuda_graphs": parts.core.runner.graphs is not None,
        "input_tokens": sum(in_lens),
        "output_tokens": generated,
        "elapsed_s": elapsed,
        "steps": steps,
        "output_tok_s": generated / elapsed,
        "total_tok_s": (generated + sum(in_lens)) / elapsed,
        "req_s": n / elapsed,
        "max_num_seqs": config.scheduler.max_num_seqs,
        "max_num_batched_tokens": config.scheduler.max_num_batched_tokens,
        **kv_capacity(parts),
        # sequences whose KV was dropped for lack of blocks and recomputed later
        "preemptions": stats["num_preemptions"],
        # acceptance of speculative decoding, when it is on
        "speculative": speculative(engine),
        # mean seconds per step spent in each phase of the engine step
        "step_phases_s": {k: v / max(1, steps) for k, v in phases.items()},
        **card,
    }


def _card_speed(device: torch.device) -> dict[str, float | None]:
    """bf16 GEMM FLOP/s and copy bandwidth of the CUDA device the engine will use (None
    elsewhere)."""
    if device.type != "cuda":
        return {"card_gemm_flops": None, "card_copy_bytes_per_s": None}
    return {"card_gemm_flops": gemm_flops(device), "card_copy_bytes_per_s": copy_bandwidth(device)}


def rows(r: dict[str, Any]) -> list[tuple[str, Any]]:
    if "constrained_tok_s" in r:
        return constrained.rows(r)
    return (
        [
            ("model", r["model"]),
            ("weights on device (GiB)", r["weight_bytes"] / 2**30),
            ("quantization", r["quantization"]),
            ("prompts", r["num_prompts"]),
            ("attention backend", r["attention_backend"]),
            ("CUDA graphs", r["cuda_graphs"]),
            ("tensor-parallel ranks", r.get("tensor_parallel_size", 1)),
            ("input tokens", r["input_tokens"]),
            ("output tokens", r["output_tokens"]),
            ("elapsed (s)", r["elapsed_s"]),
            ("engine steps", r["steps"]),
            ("output tok/s", r["output_tok_s"]),
            ("total tok/s", r["total_tok_s"]),
            ("requests/s", r["req_s"]),
            *kv_capacity_rows(r),
            ("preemptions (recomputed)", r["preemptions"]),
        ]
        + speculative_rows(r)
        + [(f"step: {k} (ms)", v * 1e3) for k, v in r["step_phases_s"].items()]
        + [
            (name, value)
            for name, value in (
                ("card: bf16 GEMM (TFLOP/s)", _scaled(r["card_gemm_flops"], 1e12)),
                ("card: copy bandwidth (GB/s)", _scaled(r["card_copy_bytes_per_s"], 1e9)),
            )
            if value is not None
        ]
    )


def _scaled(value: float | None, unit: float) -> float | None:
    return None if value is None else value / unit
