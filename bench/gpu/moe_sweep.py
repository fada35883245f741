"""Sweep the fused-MoE kernels' tiles and write the table ``moe_config`` reads (GPU only).

  python bench/gpu/moe_sweep.py [--shapes qwen3-30b-a3b,qwen2-moe,mixtral-8x7b,gpt-oss-20b]
                                [--tokens 1,2,4,...] [--output framework/tallow/kernels/moe_configs.json]

For every expert shape (experts E, intermediate I, hidden H, top_k) and token count T it times
``fused_moe`` (alignment, both grouped products, the sum over top_k) inside a CUDA graph, on
bf16 weights and a uniform random routing, for each candidate :class:`MoEConfig` — the GEMV
path's tiles up to 16 tokens, the grouped GEMM's from 2 tokens on — checks the fastest against
the torch reference, prints the default's time beside the best, and merges one bucket per T
into the JSON table (keys ``E=..,I=..,H=..,bfloat16``; a token count between two measured
ones takes the larger one's config, the last bucket has no end). Commit the table it writes.

``--device cpu`` with ``TRITON_INTERPRET=1`` and ``--shapes tiny`` runs the script's logic on a
CPU, timed by the wall clock: a dry run, not a measurement.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tallow.kernels.moe import fused_moe, fused_moe_ref  # noqa: E402
from tallow.kernels.moe_config import (  # noqa: E402
    TABLE_PATH,
    MoEConfig,
    default_moe_config,
    table_entry,
    table_key,
)

#: name -> (experts, intermediate, hidden, top_k)
SHAPES = {
    "qwen3-30b-a3b": (128, 768, 2048, 8),
    "qwen2-moe": (60, 1408, 2048, 4),
    "mixtral-8x7b": (8, 14336, 4096, 2),
    "gpt-oss-20b": (32, 2880, 2880, 4),
    "tiny": (8, 32, 64, 2),
}
TOKENS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
GEMV = [
    MoEConfig("gemv", 1, bn, bk, w, 1)
    for bn in (4, 8, 16)
    for bk in (128, 256, 512)
    for w in (2, 4, 8)
]
GEMM = [
    MoEConfig("gemm", bm, bn, bk, w, s)
    for bm, bn, bk, w, s in itertools.product(
        (16, 32, 64, 128), (32, 64, 128), (32, 64, 128), (4, 8), (2, 3, 4)
    )
]
DEVICE = "cuda"


def seconds(fn) -> float:
    """Device seconds of one ``fn()``, replayed in a CUDA graph (the wall clock on a CPU)."""
    if DEVICE != "cuda":
        started = time.perf_counter()
        fn()
        return time.perf_counter() - started
    from profile_decode import _graph_bandwidth

    return 1.0 / _graph_bandwidth(lambda i: fn(), 1_000_000_000, iters=10)


def candidates(tokens: int) -> list[MoEConfig]:
    out = GEMV if tokens <= 16 else []
    if tokens >= 2:
        out = out + GEMM
    if DEVICE != "cuda":  # a dry run: a few of each
        out = out[:2] + [c for c in out if c.path == "gemm"][:2]
    return out


def sweep_shape(name: str, tokens_list: list[int]) -> list[dict]:
    e, inter, hidden, top_k = SHAPES[name]
    g = torch.Generator(device="cpu").manual_seed(0)
    w13 = (torch.randn(e, 2 * inter, hidden, generator=g) * hidden**-0.5).bfloat16().to(DEVICE)
    w2 = (torch.randn(e, hidden, inter, generator=g) * inter**-0.5).bfloat16().to(DEVICE)
    buckets = []
    for tokens in tokens_list:
        x = torch.randn(tokens, hidden, generator=g).bfloat16().to(DEVICE)
        weights, ids = torch.rand(tokens, e, generator=g).topk(top_k, dim=-1)
        weights, ids = weights.to(DEVICE), ids.to(DEVICE)
        results = []
        for cfg in candidates(tokens):
            try:
                t = seconds(lambda: fused_moe(x, w13, w2, weights, ids, config=cfg))
            except Exception as exc:  # a tile this GPU cannot run (shared memory): skip it
                print(f"  {cfg}: {type(exc).__name__}", flush=True)
                continue
            results.append((t, cfg))
        results.sort(key=lambda r: r[0])
        ref = fused_moe_ref(x, w13, w2, weights, ids).float()
        for t, best in results:  # the fastest that also computes the right thing
            got = fused_moe(x, w13, w2, weights, ids, config=best).float()
            if float((got - ref).abs().max()) <= 3e-2 * float(ref.abs().max()) + 1e-6:
                break
        else:
            raise SystemExit(f"{name} T={tokens}: no candidate matches the reference")
        default = default_moe_config(e, inter, hidden, tokens)
        t_default = seconds(lambda: fused_moe(x, w13, w2, weights, ids, config=default))
        active = 3 * inter * hidden * 2 * min(e, tokens * top_k)  # bytes of experts touched
        print(
            f"{name:14s} T={tokens:5d} best {t * 1e6:8.1f} us {best}  default "
            f"{t_default * 1e6:8.1f} us  ~{active / t / 1e9:6.0f} GB/s of expert weights",
            flush=True,
        )
        buckets.append(table_entry(tokens, best))
    # a count between two measured ones takes the larger's config; the last has no end
    buckets[-1]["max_tokens"] = 1 << 30
    return buckets


def main() -> None:
    global DEVICE
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="qwen3-30b-a3b,qwen2-moe,mixtral-8x7b,gpt-oss-20b")
    p.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    p.add_argument("--output", default=str(TABLE_PATH))
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = p.parse_args()
    DEVICE = args.device
    out = Path(args.output)
    table = json.loads(out.read_text()) if out.exists() else {}
    for name in args.shapes.split(","):
        e, inter, hidden, _ = SHAPES[name]
        tokens = [int(t) for t in args.tokens.split(",")]
        table[table_key(e, inter, hidden, torch.bfloat16)] = sweep_shape(name, tokens)
    out.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
