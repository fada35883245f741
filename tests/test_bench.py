"""`tallow bench` on the CPU with a tiny random model: the harness runs end to end, and
`--compare hf` really gives transformers the engine's weights."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import torch

from tallow.engine.llm import config_from_kwargs
from tallow.engine.llm_engine import LLMEngine
from tallow import SamplingParams


def bench(*args: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "tallow", "bench", *args, "--json"],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return json.loads(out.stdout[out.stdout.index("{") :])


def test_latency_reports_speed_and_step_phases():
    r = bench(
        "latency",
        "--model",
        "random:tiny-llama",
        "--device",
        "cpu",
        "--batch-size",
        "2",
        "--input-len",
        "24",
        "--output-len",
        "12",
    )
    assert r["batch_size"] == 2 and r["decode_steps"] > 0
    assert r["decode_tok_s_per_seq"] > 0 and r["itl_p99_s"] >= r["itl_p50_s"] > 0
    assert set(r["decode_step_phases_s"]) == {"schedule", "launch", "overlapped", "wait", "post"}
    assert r["weight_bytes_per_step"] > 0
    assert r["peak_running"] == 2 and r["kv_codec"] == "auto"
    assert r["kv_capacity_tokens"] == r["kv_blocks"] * 16 and r["kv_capacity_vs_bf16"] == 0.5
    # tiny-llama in float32: its parameters, counted once, are the weights on the device
    per_layer = 128 * 64 + 64 * 64 + 256 * 64 + 64 * 128 + 2 * 64  # qkv, o, gate_up, down, norms
    params = (2 * 512 * 64 + 2 * per_layer + 64) * 4  # embedding, head, 2 layers, final norm
    assert r["weight_bytes"] >= params and r["quantization"] == "none (float32)"


def test_latency_of_a_batch_the_kv_cache_holds_only_in_part():
    """Eight 80-token sequences in a cache of 20 blocks of 16 tokens: four fit at once, and
    the decode rate counts the tokens the decode steps produced, not eight per step; the
    turbo4 codec's capacity is reported against a 16-bit cache."""
    r = bench(
        "latency",
        "--model",
        "random:tiny-llama",
        "--device",
        "cpu",
        "--batch-size",
        "8",
        "--input-len",
        "64",
        "--output-len",
        "16",
        "--num-blocks",
        "20",
        "--max-model-len",
        "128",
        "--kv-codec",
        "turbo4",
        "--warmup-input-len",
        "8",
    )
    assert r["kv_fits_sequences"] == 4 and r["peak_running"] == 4
    assert r["kv_codec"] == "turbo4" and r["kv_capacity_tokens"] == 320
    # head size 16: 4 bits of code + a 16-bit scale per 16 elements = 5 bits against 16
    assert abs(r["kv_capacity_vs_bf16"] - 3.2) < 1e-9
    assert r["decode_tok_s_total"] <= 4.01 * r["decode_tok_s_per_seq"]


def test_latency_prefill_first_decodes_the_whole_batch_together():
    """Prompts prefilled one per step (a 64-token step budget): timed directly, the first
    sequences decode while the last still prefill and finish early, so decode steps advance
    fewer than the batch on average; with --prefill-first the timed batch finds its prompts
    in the prefix cache and every decode step advances all four."""
    common = (
        "latency",
        "--model",
        "random:tiny-llama",
        "--device",
        "cpu",
        "--batch-size",
        "4",
        "--input-len",
        "64",
        "--output-len",
        "12",
        "--max-num-batched-tokens",
        "64",
        "--warmup-input-len",
        "8",
    )
    staggered = bench(*common)
    together = bench(*common, "--prefill-first")
    assert staggered["prefill_first"] is False and together["prefill_first"] is True
    assert staggered["decode_running_mean"] < 4
    assert together["decode_running_mean"] == 4 and together["peak_running"] == 4
    assert together["ttft_s"] > 0 and together["decode_steps"] >= 10


def test_latency_synthetic_context_skips_the_prompts_and_runs_what_fits():
    """Eight 80-token sequences in a cache of 20 blocks: with --synthetic-context the four
    that fit are timed, their prompts found in the prefix cache but for the last block, and
    every decode step advances all four; no TTFT is reported."""
    r = bench(
        "latency",
        "--model",
        "random:tiny-llama",
        "--device",
        "cpu",
        "--batch-size",
        "8",
        "--input-len",
        "64",
        "--output-len",
        "16",
        "--num-blocks",
        "20",
        "--max-model-len",
        "128",
        "--warmup-input-len",
        "8",
        "--synthetic-context",
    )
    assert r["synthetic_context"] is True and r["sequences_timed"] == 4
    assert r["prefix_hit_rate"] == 48 / 64  # 3 of 4 blocks: the last token is computed
    assert r["decode_running_mean"] == 4 and r["peak_running"] == 4
    assert r["ttft_s"] != r["ttft_s"] and r["decode_steps"] >= 14


def test_throughput_generates_every_requested_token():
    r = bench(
        "throughput",
        "--model",
        "random:tiny-llama",
        "--device",
        "cpu",
        "--num-prompts",
        "6",
        "--input-len",
        "16",
        "--output-len",
        "9",
        "--max-waiting",
        "2",
    )
    assert r["output_tokens"] == 6 * 9 and r["input_tokens"] == 6 * 16
    assert r["weight_bytes"] > 0 and r["quantization"] == "none (float32)"
    assert r["output_tok_s"] > 0 and r["steps"] >= 9
    # the card's calibration is measured on CUDA only
    assert r["card_gemm_flops"] is None and r["card_copy_bytes_per_s"] is None


def test_embed_returns_every_embedding():
    """A decoder shape built for embeddings (the bench sets the task): every input comes back,
    many per step."""
    r = bench(
        "embed",
        "--model",
        "random:tiny-llama",
        "--device",
        "cpu",
        "--num-prompts",
        "12",
        "--input-len",
        "16",
        "--max-model-len",
        "64",
        "--max-num-batched-tokens",
        "64",
        "--max-waiting",
        "4",
    )  # more inputs at once than a server's queue would hold
    assert r["num_prompts"] == 12 and r["input_tokens"] == 12 * 16
    assert r["steps"] == 3 and r["inputs_s"] > 0 and r["total_tok_s"] > 0
    assert r["embedding"]["pooling"] == "last" and r["embedding"]["dimensions"] == 64


@torch.inference_mode()
def test_compare_hf_runs_transformers_on_the_engine_weights():
    from tallow.bench.hf_compare import hf_model_like

    engine = LLMEngine.from_config(
        config_from_kwargs(model="random:tiny-llama", dtype="float32", device="cpu", num_blocks=256)
    )
    torch.manual_seed(0)  # transformers' random init: the same weights every run
    hf = hf_model_like(engine.parts)
    prompt = list(range(20, 60))
    ref = hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, pad_token_id=0)[
        0, len(prompt) :
    ].tolist()
    engine.add_request("r", prompt, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    done = None
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                done = out
    # transformers stops at its EOS (token 0 of the synthetic vocabulary) if it picks it
    assert done.outputs[0].token_ids[: len(ref)] == ref


_ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_schedule_replay_shows_preemptions_only_for_sequences_of_unknown_length() -> None:
    """bench/schedule_replay.py on a small KV budget: 8 requests of 24 + 40 tokens (4 blocks
    of 16 each) in 20 blocks."""
    args = [
        sys.executable,
        "bench/schedule_replay.py",
        "--kv-blocks",
        "20",
        "--num-prompts",
        "8",
        "--input-len",
        "24",
        "--output-len",
        "40",
        "--max-num-seqs",
        "8",
        "--max-model-len",
        "128",
    ]
    known = json.loads(
        subprocess.run(args, capture_output=True, text=True, check=True, cwd=_ROOT).stdout
    )
    unknown = json.loads(
        subprocess.run(
            args + ["--length-unknown"], capture_output=True, text=True, check=True, cwd=_ROOT
        ).stdout
    )
    assert known["preemptions"] == 0 and known["recomputed_tokens"] == 0
    assert known["max_running"] == 5  # 5 x 4 blocks reserved = the whole cache
    assert unknown["preemptions"] > 0 and unknown["recomputed_tokens"] > 0
    assert known["decode_rows"] == 8 * 39  # every output token but the first is a decode
    assert unknown["decode_rows"] < 8 * 39  # recomputed outputs come back as prompt rows


def test_constrained_bench_explains_grammar_ended_outputs_that_fail_the_schema():
    from types import SimpleNamespace

    from tallow.bench.constrained import _validate

    schema = {
        "type": "object",
        "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
        "required": ["zip"],
    }
    outputs = [
        SimpleNamespace(text='{"zip":"12345"}', finish_reason="stop"),
        SimpleNamespace(text='{"zip":"1234"}', finish_reason="stop"),
        SimpleNamespace(text='{"zi', finish_reason="length"),
        SimpleNamespace(text='{"zi', finish_reason="stop"),
    ]
    valid, problems = _validate(outputs, schema)
    assert valid == 1
    assert len(problems) == 2  # the length-ended output is not the grammar's doing
    assert "does not match" in problems[0] and "(pattern)" in problems[0]
    assert problems[1].startswith("not JSON")


def test_kernel_timing_rotates_past_the_l2_and_dry_runs_on_a_cpu() -> None:
    from tallow.bench.kernel_timing import (
        L2_ROTATION_BYTES,
        LLAMA3_8B_SHAPES,
        graph_seconds,
        rotation_copies,
    )

    n, k = LLAMA3_8B_SHAPES["head"]
    assert rotation_copies(2 * n * k) == 2  # a 1 GB head: two copies already miss the L2
    assert rotation_copies(1 << 20) * (1 << 20) > L2_ROTATION_BYTES
    calls: list[int] = []
    assert graph_seconds(calls.append, copies=3, device="cpu") >= 0.0
    assert calls == [0]  # a dry run calls the kernel once, on the first copy


def test_a_decode_step_reads_the_routed_share_of_the_experts():
    """The bandwidth figure of a mixture-of-experts model counts the experts a step's tokens
    pick, not all of them: one token reads top_k of num_experts; a large batch nearly all."""
    import math

    from tallow.bench.latency import expert_fraction_read, weight_bytes_per_step
    from tallow.layers import FusedMoE, RouterSpec

    layer = FusedMoE(8, 64, 32, router=RouterSpec(top_k=2))
    experts = sum(t.numel() * t.element_size() for t in layer.experts.parameters())
    rest = sum(t.numel() * t.element_size() for t in layer.parameters()) - experts
    assert experts > 0 and rest > 0
    assert weight_bytes_per_step(layer, 1) == rest + experts * 2 // 8
    assert weight_bytes_per_step(layer, 3) == rest + int(experts * (1 - (6 / 8) ** 3))
    assert expert_fraction_read(8, 2, 1) == 0.25
    assert math.isclose(expert_fraction_read(8, 2, 64), 1.0, abs_tol=1e-7)
    assert expert_fraction_read(8, 8, 1) == 1.0
