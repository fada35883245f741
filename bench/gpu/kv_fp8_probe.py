"""Decode and prefill attention of llama-3-8b over a bf16 cache and an fp8 (e4m3) cache, with
the decode tile variants of an 8-bit cache, so the codec's speed and its tiles are chosen from
measurements.

Decode: ``--batch`` sequences with contexts uniform in 1000..1480 (the 1000 x 1000/1000
throughput workload's middle), 32 layers captured in one CUDA graph (store fused), K/V read per
step and TB/s. Prefill: 8 prompts of 1024 tokens, one layer, TFLOP/s of the causal products.

Usage: python bench/gpu/kv_fp8_probe.py [--batch 443]
"""

from __future__ import annotations

import argparse

import torch
import triton

from tallow_attention_triton import ops
from tallow_attention_triton.backend import TritonAttentionBackend
from tallow_attention_triton.testing import make_case

from tallow.bench.kernel_timing import graph_milliseconds as time_graph

HEADS, KV_HEADS, HEAD_DIM, LAYERS = 32, 8, 128, 32


def decode_case(batch: int, cache_dtype: torch.dtype):
    g = torch.Generator().manual_seed(0)
    ctx = torch.randint(1000, 1481, (batch,), generator=g).tolist()
    return make_case(
        query_lens=[1] * batch,
        context_lens=ctx,
        num_heads=HEADS,
        num_kv_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        block_size=16,
        dtype=torch.bfloat16,
        cache_dtype=cache_dtype,
        device="cuda",
        host_copies=False,
        spare_blocks=1,
    ), sum(ctx) + batch


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=443)
    args = p.parse_args()
    be = TritonAttentionBackend()
    original = ops.decode_spec
    rows = []
    fp8 = torch.float8_e4m3fn
    for label, cache_dtype, overrides in [
        ("bf16 cache", torch.bfloat16, {}),
        ("fp8, default tiles (one warp, 32 keys, 3 stages)", fp8, {}),
        (
            "fp8, default tiles, V widened by a select, eager rescale (as before)",
            fp8,
            dict(WIDEN_V_IN_PTX=False, LAZY_RESCALE=False),
        ),
        ("fp8, default tiles, V widened in PTX, eager rescale", fp8, dict(LAZY_RESCALE=False)),
        (
            "fp8, default tiles, V widened by a select, lazy rescale",
            fp8,
            dict(WIDEN_V_IN_PTX=False),
        ),
        ("fp8, 4 warps, 64-key tiles, 3 stages", fp8, dict(TILE_N=64, num_warps=4)),
        ("fp8, 4 warps, 128-key tiles, 2 stages", fp8, dict(TILE_N=128, num_warps=4, num_stages=2)),
        ("fp8, 4 warps, 128-key tiles, 3 stages", fp8, dict(TILE_N=128, num_warps=4)),
        ("fp8, one warp, 32 keys, 2 stages", fp8, dict(num_stages=2)),
        ("fp8, one warp, 32 keys, 4 stages", fp8, dict(num_stages=4)),
        ("fp8, 2 warps, 32 keys, 3 stages", fp8, dict(num_warps=2)),
        ("fp8, one warp, 64 keys, 2 stages (spills)", fp8, dict(TILE_N=64, num_stages=2)),
    ]:
        ops.decode_spec = lambda _o=overrides, **kw: {**original(**kw), **_o}
        case, tokens = decode_case(args.batch, cache_dtype)
        ref, ref_cache = case.expected()
        try:
            out = be.forward(case.layer, case.q, case.k, case.v, case.kv_cache, case.meta)
        except Exception as exc:  # a tile shape that does not compile: recorded, not fatal
            rows.append(
                (f"decode {args.batch}: {label}", float("nan"), type(exc).__name__, float("nan"))
            )
            case = None
            continue
        err = float((out[: case.valid_rows].float() - ref.float()).abs().max())
        stored = all(
            torch.equal(case.kv_cache[name].view(torch.uint8), ref_cache[name].view(torch.uint8))
            for name in ("k", "v")
        )
        if not stored:
            err = float("inf")  # the store wrote something else than the reference
        ms = time_graph(
            lambda: [
                be.forward(case.layer, case.q, case.k, case.v, case.kv_cache, case.meta)
                for _ in range(LAYERS)
            ]
        )
        nbytes = tokens * KV_HEADS * HEAD_DIM * 2 * case.kv_cache["k"].element_size() * LAYERS
        rows.append((f"decode {args.batch}: {label}", ms, f"{nbytes / ms / 1e9:.2f} TB/s", err))
        case = None
        torch.cuda.empty_cache()
    ops.decode_spec = original
    original_prefill = ops.prefill_spec
    for label, cache_dtype, overrides in (
        ("bf16 cache", torch.bfloat16, {}),
        ("fp8 cache", fp8, {}),
        ("fp8 cache, 128-key tiles (as bf16)", fp8, dict(TILE_N=128)),
    ):
        ops.prefill_spec = lambda _o=overrides, **kw: {**original_prefill(**kw), **_o}
        case = make_case(
            query_lens=[1024] * 8,
            context_lens=[0] * 8,
            num_heads=HEADS,
            num_kv_heads=KV_HEADS,
            head_dim=HEAD_DIM,
            block_size=16,
            dtype=torch.bfloat16,
            cache_dtype=cache_dtype,
            device="cuda",
        )
        ref, _ = case.expected()
        out = be.forward(case.layer, case.q, case.k, case.v, case.kv_cache, case.meta)
        err = float((out.float() - ref.float()).abs().max())
        ms = triton.testing.do_bench(
            lambda: be.forward(case.layer, case.q, case.k, case.v, case.kv_cache, case.meta)
        )
        flops = 8 * 4 * 1024 * 1024 / 2 * HEADS * HEAD_DIM
        rows.append(
            (
                f"prefill 8 x 1024 tokens, one layer: {label}",
                ms,
                f"{flops / ms / 1e9:.0f} TFLOP/s",
                err,
            )
        )
    ops.prefill_spec = original_prefill
    print(f"\n{'case':66s} {'ms':>8s} {'rate':>14s} {'max err':>8s}")
    for name, ms, rate, err in rows:
        print(f"{name:66s} {ms:8.3f} {rate:>14s} {err:8.1e}")


if __name__ == "__main__":
    main()
