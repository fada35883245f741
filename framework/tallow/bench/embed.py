"""`tallow bench embed`: N inputs submitted at once to an engine built to embed → inputs/s
and tokens/s.

Any model runs: an encoder (``random:all-minilm-l6-v2``) embeds by itself, a decoder
(``random:qwen3-0.6b``) is built for embeddings here as with ``--task embed``.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from .common import (
    build_engine,
    input_prompts,
    last_step,
    now,
    quantization,
    random_prompts,
    sync,
)

if TYPE_CHECKING:
    from tallow.config import TallowConfig
    from tallow.engine.llm_engine import LLMEngine

_WARM_UP_INPUTS = 64


def _embed_all(engine: LLMEngine, prompts: list[list[int]]) -> tuple[int, dict[str, float], int]:
    """(steps, summed step phases, outputs) of embedding ``prompts``, all added at once."""
    from tallow.engine.embedding import PoolingParams

    params = PoolingParams()
    for prompt in prompts:
        engine.add_request(engine.next_request_id(), prompt, params)
    first, done = engine.core.steps, 0
    phases: dict[str, float] = {}
    while engine.has_unfinished():
        done += len(engine.step())
        for key, value in last_step(engine).timings.items():
            phases[key] = phases.get(key, 0.0) + value
    return engine.core.steps - first, phases, done


def run(args: argparse.Namespace, config: TallowConfig) -> dict[str, Any]:
    if config.model.task == "generate":
        raise ValueError("tallow bench embed measures the embed task; drop --task generate")
    config.model.task = "embed"
    engine = build_engine(config, queued=max(args.num_prompts, _WARM_UP_INPUTS))
    parts = engine.parts
    embedding = parts.embedding
    if embedding is None:
        raise RuntimeError("the engine was built without its embedding setup")
    device = parts.loaded.device
    vocab = parts.core.runner.vocab_size
    n = args.num_prompts
    in_lens, prompts = input_prompts(args, vocab)
    _embed_all(
        engine,
        random_prompts(
            _WARM_UP_INPUTS, [min(32, parts.max_model_len)] * _WARM_UP_INPUTS, vocab, seed=13
        ),
    )
    sync(device)
    start = now()
    steps, phases, done = _embed_all(engine, prompts)
    sync(device)
    elapsed = now() - start
    if done != n:
        raise RuntimeError(f"{done} embeddings came back for {n} inputs")
    tokens = sum(in_lens)
    return {
        "model": config.model.source,
        "weight_bytes": parts.loaded.weight_bytes,
        "quantization": quantization(parts),
        "num_prompts": n,
        "attention_backend": parts.attention_backend,
        "input_tokens": tokens,
        "elapsed_s": elapsed,
        "steps": steps,
        "inputs_s": n / elapsed,
        "total_tok_s": tokens / elapsed,
        "embedding": embedding.describe(),
        "max_num_seqs": config.scheduler.max_num_seqs,
        "max_num_batched_tokens": parts.core.scheduler.max_num_batched_tokens,
        "kv_blocks": parts.core.scheduler.block_manager.num_total_blocks,
        "step_phases_s": {k: v / max(1, steps) for k, v in phases.items()},
    }


def rows(r: dict[str, Any]) -> list[tuple[str, Any]]:
    emb = r["embedding"]
    return [
        ("model", r["model"]),
        ("weights on device (GiB)", r["weight_bytes"] / 2**30),
        ("quantization", r["quantization"]),
        ("inputs", r["num_prompts"]),
        (
            "pooling",
            f"{emb['pooling']}, {'normalized' if emb['normalize'] else 'raw'}, "
            f"{emb['dimensions']} dimensions",
        ),
        ("attention backend", r["attention_backend"]),
        ("input tokens", r["input_tokens"]),
        ("elapsed (s)", r["elapsed_s"]),
        ("engine steps", r["steps"]),
        ("inputs/s", r["inputs_s"]),
        ("tokens/s", r["total_tok_s"]),
        ("step token budget", r["max_num_batched_tokens"]),
        ("KV blocks", r["kv_blocks"]),
    ] + [(f"step: {k} (ms)", v * 1e3) for k, v in r["step_phases_s"].items()]
