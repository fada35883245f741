"""`tallow bench latency`: one batch, fixed input and output lengths → TTFT, decode speed, ITL,
and how much of the card's memory bandwidth a decode step uses."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

import torch

from tallow.layers import FusedMoE, LMHead, VocabEmbedding

from .common import (
    build_engine,
    copy_bandwidth,
    kv_capacity,
    kv_capacity_rows,
    kv_footprint,
    last_step,
    mean,
    now,
    percentile,
    quantization,
    random_prompts,
    speculative,
    speculative_rows,
    sync,
)
from .hf_compare import hf_latency

if TYPE_CHECKING:
    from tallow.config import TallowConfig
    from tallow.engine.llm_engine import LLMEngine


def expert_fraction_read(num_experts: int, top_k: int, batch: int) -> float:
    """The share of a mixture-of-experts layer's experts that a decode step of ``batch`` tokens
    reads, expected when each token picks ``top_k`` of ``num_experts`` uniformly:
    ``1 - (1 - top_k / num_experts) ** batch`` (one token reads exactly ``top_k``)."""
    return 1.0 - (1.0 - top_k / num_experts) ** max(1, batch)


def weight_bytes_per_step(model: torch.nn.Module, batch: int) -> int:
    """Bytes of weights a decode step reads: every parameter and buffer once (quantized
    storage included), except that a token embedding the head does not share is only gathered
    (``batch`` rows), the rotary tables are only indexed, and of a mixture-of-experts layer's
    routed experts only the expected share the step's tokens pick is read
    (:func:`expert_fraction_read`)."""
    shared = {id(m._tied_to[0]) for m in model.modules() if isinstance(m, LMHead) and m.tied}
    gathered: set[int] = set()
    total = 0
    for module in model.modules():
        if isinstance(module, VocabEmbedding) and id(module) not in shared:
            own = [*module.parameters(recurse=False), *module.buffers(recurse=False)]
            gathered.update(id(t) for t in own)
            nbytes = sum(t.numel() * t.element_size() for t in own)
            total += nbytes * min(batch, module.rows_per_rank) // max(1, module.rows_per_rank)
        elif isinstance(module, FusedMoE):
            own = [*module.experts.parameters(), *module.experts.buffers()]
            gathered.update(id(t) for t in own)
            nbytes = sum(t.numel() * t.element_size() for t in own)
            share = expert_fraction_read(module.experts.num_experts, module.router.top_k, batch)
            total += int(nbytes * share)
    for tensor in {id(t): t for t in model.parameters()}.values():
        if id(tensor) not in gathered:
            total += tensor.numel() * tensor.element_size()
    for name, buf in model.named_buffers():
        if id(buf) in gathered or "cos_sin" in name or "inv_freq" in name:
            continue  # rotary tables: a few rows are read per step
        total += buf.numel() * buf.element_size()
    return total


def prefill_only(engine: LLMEngine, prompts: list[list[int]]) -> dict[str, float]:
    """Run ``prompts`` for one token each; their full KV blocks stay in the prefix cache for a
    second pass over the same prompts. Seconds from the start to each first token."""
    from tallow.engine.sampling.params import SamplingParams

    params = SamplingParams(max_tokens=1, ignore_eos=True, temperature=0.0)
    sync(engine.parts.loaded.device)
    start = now()
    for prompt in prompts:
        engine.add_request(engine.next_request_id(), prompt, params, stream=False)
    first: dict[str, float] = {}
    while engine.has_unfinished():
        engine.step()
        for update in last_step(engine).updates:
            first.setdefault(update.request_id, now() - start)
    return first


def register_synthetic_context(
    engine: LLMEngine, prompts: list[list[int]], output_len: int
) -> list[list[int]]:
    """Keep as many of ``prompts`` as the KV cache holds with their outputs, and register
    their full blocks in the prefix cache without computing them (synthetic K/V: the cache's
    current contents), so each sequence computes only its last block and then decodes over
    its whole context. Decode work depends on the context length and the KV codec, not on the
    cached values; this skips minutes of prefill at 32k tokens."""
    manager = engine.core.scheduler.block_manager
    fits = manager.num_total_blocks // manager.blocks_for(len(prompts[0]) + output_len)
    kept = prompts[: max(1, fits)]
    for prompt in kept:
        manager.register_uncomputed_prefix(prompt)
    manager.reset_stats()
    return kept


def measure(
    engine: LLMEngine,
    *,
    batch: int,
    input_len: int,
    output_len: int,
    seed: int = 0,
    prefill_first: bool = False,
    synthetic_context: bool = False,
) -> dict[str, Any]:
    """Run one batch and time it. With ``prefill_first`` every prompt is first run for one
    token (TTFT is taken there) and the timed batch then finds its prompts in the prefix
    cache, so its sequences decode together as far as the cache holds them, instead of the
    first ones finishing while the last ones still prefill. With ``synthetic_context`` the
    prompts' blocks are registered uncomputed instead (:func:`register_synthetic_context`):
    only as many sequences run as the cache holds, and TTFT is not measured."""
    from tallow.engine.sampling.params import SamplingParams

    device = engine.parts.loaded.device
    vocab = engine.parts.core.runner.vocab_size
    params = SamplingParams(max_tokens=output_len, ignore_eos=True, temperature=0.0)
    prompts = random_prompts(batch, [input_len] * batch, vocab, seed)
    if prefill_first and synthetic_context:
        raise ValueError(
            "prefill_first and synthetic_context exclude each other: the one "
            "computes the prompts, the other skips them"
        )
    if synthetic_context:
        prompts = register_synthetic_context(engine, prompts, output_len)
    prefilled = prefill_only(engine, prompts) if prefill_first else None
    ids = [engine.next_request_id() for _ in prompts]
    sync(device)
    start = now()
    for rid, prompt in zip(ids, prompts):
        engine.add_request(rid, prompt, params, stream=False)
    first: dict[str, float] = {}
    step_times: list[float] = []  # decode steps only (no prompt computed in them)
    step_tokens = 0  # tokens those steps produced
    step_seqs = 0  # sequences those steps advanced (a verify step emits several tokens each)
    parts: dict[str, list[float]] = {}
    peak_running = 0
    scheduler = engine.core.scheduler
    while engine.has_unfinished():
        t0 = now()
        engine.step()
        t1 = now()
        peak_running = max(peak_running, scheduler.num_running)
        step = last_step(engine)
        for update in step.updates:  # tokens the device produced this step
            if update.request_id not in first:
                first[update.request_id] = t1 - start
        if step.decode_only and step.updates:
            step_times.append(t1 - t0)
            step_tokens += len(step.updates)
            step_seqs += len({(u.request_id, u.index) for u in step.updates})
            for key, value in step.timings.items():
                parts.setdefault(key, []).append(value)
    total = now() - start
    itl = step_times
    if prefilled is not None:
        first = prefilled
    if synthetic_context:
        first = {}  # the prompts were never computed: no time to first token to report
    return {
        "ttft_s": mean(list(first.values())) if first else float("nan"),
        "ttft_max_s": max(first.values()) if first else float("nan"),
        "itl_mean_s": mean(itl),
        "itl_p50_s": percentile(itl, 50),
        "itl_p99_s": percentile(itl, 99),
        # tokens per sequence and step over the step time: 1 / ITL without speculation
        "decode_tok_s_per_seq": step_tokens / step_seqs / mean(itl) if itl else float("nan"),
        # tokens over time of the decode steps: the batch times the rate per sequence when
        # every sequence fits at once, fewer when the KV cache holds only some of them
        "decode_tok_s_total": step_tokens / sum(itl) if itl else float("nan"),
        "e2e_s": total,
        "decode_steps": len(itl),
        # sequences a decode step advanced, on average: what its KV reads are counted for
        "decode_running_mean": step_seqs / len(itl) if itl else float("nan"),
        # tokens a sequence gained per decode step (above 1 with speculative decoding)
        "tokens_per_seq_step": step_tokens / step_seqs if step_seqs else float("nan"),
        "prefill_first": prefill_first,
        "synthetic_context": synthetic_context,
        "sequences_timed": len(prompts),
        # prompt tokens the timed batch found in the prefix cache, of all its prompt tokens
        "prefix_hit_rate": engine.core.scheduler.block_manager.hit_rate,
        # the most sequences running at once: the batch, or what the KV cache held of it
        "peak_running": peak_running,
        # mean seconds per decode step spent in each phase of the engine step
        "decode_step_phases_s": {k: mean(v) for k, v in parts.items()},
        "speculative": speculative(engine),
    }


def run(args: argparse.Namespace, config: TallowConfig) -> dict[str, Any]:
    engine = build_engine(config)
    parts = engine.parts
    device = parts.loaded.device
    runner = parts.core.runner
    # Warm-up: compile kernels, fill allocator caches (with shorter prompts if asked: a batch
    # of long contexts would take minutes to prefill twice).
    measure(
        engine,
        batch=args.batch_size,
        input_len=args.warmup_input_len or args.input_len,
        output_len=8,
        seed=1,
    )
    result = measure(
        engine,
        batch=args.batch_size,
        input_len=args.input_len,
        output_len=args.output_len,
        seed=2,
        prefill_first=getattr(args, "prefill_first", False),
        synthetic_context=getattr(args, "synthetic_context", False),
    )
    bandwidth = copy_bandwidth(device)
    w_bytes = weight_bytes_per_step(parts.loaded.model, args.batch_size)
    mean_ctx = args.input_len + args.output_len / 2
    running = result["decode_running_mean"]
    running = running if running == running else args.batch_size
    kv_bytes = int(running * mean_ctx * kv_footprint(parts).bytes_per_token)
    step_bytes = w_bytes + kv_bytes
    achieved = step_bytes / result["itl_mean_s"] if result["itl_mean_s"] else float("nan")
    result.update(
        {
            "model": config.model.source,
            "dtype": str(parts.loaded.dtype).replace("torch.", ""),
            # weights and bandwidth are those of one rank (its shard) under tensor parallelism
            "tensor_parallel_size": parts.parallel.world_size if parts.parallel else 1,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "attention_backend": parts.attention_backend,
            "cuda_graphs": runner.graphs is not None,
            "batch_size": args.batch_size,
            "input_len": args.input_len,
            "output_len": args.output_len,
            "weight_bytes": parts.loaded.weight_bytes,
            "quantization": quantization(parts),
            "weight_bytes_per_step": w_bytes,
            "kv_bytes_per_step": kv_bytes,
            "achieved_bytes_per_s": achieved,
            "copy_bandwidth_bytes_per_s": bandwidth,
            "bandwidth_utilisation": achieved / bandwidth if bandwidth == bandwidth else None,
            **kv_capacity(parts),
            # sequences of this batch's length (prompt and output) the KV cache holds at once
            "kv_fits_sequences": parts.core.scheduler.block_manager.num_total_blocks
            // -(-(args.input_len + args.output_len) // kv_footprint(parts).block_size),
        }
    )
    if getattr(args, "compare", None) == "hf":
        hf = hf_latency(
            parts, batch=args.batch_size, input_len=args.input_len, output_len=args.output_len
        )
        result["hf"] = hf
        result["speedup_vs_hf"] = result["decode_tok_s_per_seq"] / hf["decode_tok_s_per_seq"]
    return result


def rows(r: dict[str, Any]) -> list[tuple[str, Any]]:
    out = [
        ("model", r["model"]),
        ("device", r["device"]),
        ("dtype", r["dtype"]),
        ("attention backend", r["attention_backend"]),
        ("CUDA graphs", r["cuda_graphs"]),
        ("tensor-parallel ranks", r.get("tensor_parallel_size", 1)),
        ("batch / input / output", f"{r['batch_size']} / {r['input_len']} / {r['output_len']}"),
        ("weights on device (GiB)", r["weight_bytes"] / 2**30),
        ("quantization", r["quantization"]),
        ("TTFT (ms)", r["ttft_s"] * 1e3),
        ("decode tok/s per sequence", r["decode_tok_s_per_seq"]),
        ("decode tok/s total", r["decode_tok_s_total"]),
        ("sequences timed", r["sequences_timed"]),
        ("synthetic context (prompts not computed)", r["synthetic_context"]),
        ("sequences running at once (peak)", r["peak_running"]),
        ("sequences per decode step (mean)", r["decode_running_mean"]),
        ("ITL p50 (ms)", r["itl_p50_s"] * 1e3),
        ("ITL p99 (ms)", r["itl_p99_s"] * 1e3),
        (
            "bytes read per decode step (GB)",
            (r["weight_bytes_per_step"] + r["kv_bytes_per_step"]) / 1e9,
        ),
        ("achieved bandwidth (GB/s)", r["achieved_bytes_per_s"] / 1e9),
        ("copy bandwidth (GB/s)", r["copy_bandwidth_bytes_per_s"] / 1e9),
        ("bandwidth utilisation", r["bandwidth_utilisation"]),
    ] + [(f"decode step: {k} (ms)", v * 1e3) for k, v in r["decode_step_phases_s"].items()]
    out += speculative_rows(r)
    out += kv_capacity_rows(r) + [
        ("sequences of this length the KV cache holds", r["kv_fits_sequences"])
    ]
    if "hf" in r:
        out += [
            ("transformers decode tok/s per sequence", r["hf"]["decode_tok_s_per_seq"]),
            ("transformers TTFT (ms)", r["hf"]["ttft_s"] * 1e3),
            ("speed-up vs transformers", r["speedup_vs_hf"]),
        ]
    return out
