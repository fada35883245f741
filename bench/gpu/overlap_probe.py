"""How much of a llama-3-8b decode step could run side by side: the bandwidth-bound paged
attention of one half of the batch beside the compute-bound GEMMs of the other half.

Each variant is 32 layers of (qkv GEMM, decode attention, o GEMM, gate_up GEMM, SiLU-and-mul,
down GEMM) for ``--batch`` sequences with contexts uniform in ``--min-ctx..--max-ctx``,
captured in one CUDA graph and replayed; norms, rotary and the residual are left out (a few
percent of the step). Variants:

- ``serial``: the whole batch, one stream (what the engine does now);
- ``halves``: two half batches one after the other on one stream (the cost of splitting);
- ``overlap``: the half batches pipelined over two streams, so that the attention of one half
  runs while the other half's GEMMs run; with stream priorities (attention high, GEMMs high)
  and with fixed split counts of the attention.

Usage: python bench/gpu/overlap_probe.py [--batch 443]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from tallow_attention_triton.ops import decode_attention

from tallow.bench.kernel_timing import graph_milliseconds as time_graph

HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM, LAYERS, BLOCK = 4096, 14336, 32, 8, 128, 32, 16


class Half:
    """Buffers and paged-attention metadata of one micro-batch."""

    def __init__(self, lens: torch.Tensor, first_block: int, max_blocks: int) -> None:
        m = lens.numel()
        self.m = m
        dev = "cuda"
        self.x = torch.randn(m, HIDDEN, device=dev, dtype=torch.bfloat16)
        self.qkv = torch.empty(
            m, HIDDEN + 2 * KV_HEADS * HEAD_DIM, device=dev, dtype=torch.bfloat16
        )
        self.att = torch.empty(m, HEADS, HEAD_DIM, device=dev, dtype=torch.bfloat16)
        self.seq_lens = lens.to(dev, torch.int32)
        self.qsl = torch.arange(m + 1, device=dev, dtype=torch.int32)
        blocks = (lens + BLOCK - 1) // BLOCK
        table = torch.zeros(m, max_blocks, dtype=torch.int32)
        nxt = first_block
        for i, b in enumerate(blocks.tolist()):
            table[i, :b] = torch.arange(nxt, nxt + b, dtype=torch.int32)
            nxt += b
        self.block_tables = table.to(dev)
        self.blocks_used = nxt - first_block


def build(batch: int, lo: int, hi: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi + 1, (batch,), generator=g)
    max_blocks = (hi + BLOCK - 1) // BLOCK
    full = Half(lens, 0, max_blocks)
    half = batch // 2
    a = Half(lens[:half], 0, max_blocks)
    b = Half(lens[half:], a.blocks_used, max_blocks)
    kv = (
        torch.randn(
            2, full.blocks_used, BLOCK, KV_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16
        )
        * 0.5
    )
    std = HIDDEN**-0.5
    w = {
        "qkv": torch.randn(
            HIDDEN + 2 * KV_HEADS * HEAD_DIM, HIDDEN, device="cuda", dtype=torch.bfloat16
        )
        * std,
        "o": torch.randn(HIDDEN, HIDDEN, device="cuda", dtype=torch.bfloat16) * std,
        "gate_up": torch.randn(2 * INTER, HIDDEN, device="cuda", dtype=torch.bfloat16) * std,
        "down": torch.randn(HIDDEN, INTER, device="cuda", dtype=torch.bfloat16) * INTER**-0.5,
    }
    return full, a, b, kv, w, lens


def pre(h: Half, w) -> None:
    torch.matmul(h.x, w["qkv"].t(), out=h.qkv)


def attend(h: Half, kv: torch.Tensor, splits: int | None) -> None:
    q = h.qkv[:, :HIDDEN].view(h.m, HEADS, HEAD_DIM)
    decode_attention(
        q,
        kv,
        h.att,
        query_start_loc=h.qsl,
        seq_lens=h.seq_lens,
        block_tables=h.block_tables,
        num_seqs=h.m,
        scale=HEAD_DIM**-0.5,
        num_splits=splits,
    )


def post(h: Half, w) -> None:
    y = F.linear(h.att.view(h.m, HIDDEN), w["o"])
    gu = F.linear(y, w["gate_up"])
    act = F.silu(gu[:, :INTER]) * gu[:, INTER:]
    torch.matmul(act, w["down"].t(), out=h.x)


def serial(h: Half, kv, w, splits=None) -> None:
    for _ in range(LAYERS):
        pre(h, w)
        attend(h, kv, splits)
        post(h, w)


def halves(a: Half, b: Half, kv, w, splits=None) -> None:
    for _ in range(LAYERS):
        for h in (a, b):
            pre(h, w)
            attend(h, kv, splits)
            post(h, w)


def overlap(a: Half, b: Half, kv, w, side: torch.cuda.Stream, splits=None) -> None:
    """GEMMs on the current stream, attention on ``side``; the attention of one half runs
    while the other half's post-attention GEMMs and next qkv GEMM run."""
    main = torch.cuda.current_stream()
    side.wait_stream(main)

    def attn_on_side(h: Half) -> torch.cuda.Event:
        ready = torch.cuda.Event()
        ready.record(main)
        side.wait_event(ready)
        with torch.cuda.stream(side):
            attend(h, kv, splits)
        done = torch.cuda.Event()
        done.record(side)
        return done

    pre(a, w)
    done_a = attn_on_side(a)
    pre(b, w)
    done_b = attn_on_side(b)
    for layer in range(LAYERS):
        last = layer == LAYERS - 1
        for h, name in ((a, "a"), (b, "b")):
            main.wait_event(done_a if name == "a" else done_b)
            post(h, w)
            if not last:
                pre(h, w)
                if name == "a":
                    done_a = attn_on_side(h)
                else:
                    done_b = attn_on_side(h)
    main.wait_stream(side)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=443)
    p.add_argument("--min-ctx", type=int, default=1000)
    p.add_argument("--max-ctx", type=int, default=1480)
    args = p.parse_args()
    full, a, b, kv, w, lens = build(args.batch, args.min_ctx, args.max_ctx)
    kv_bytes = int(lens.sum()) * KV_HEADS * HEAD_DIM * 2 * 2 * LAYERS
    print(
        f"batch {args.batch}, mean context {lens.float().mean():.0f}, "
        f"K/V read per step {kv_bytes / 1e9:.1f} GB"
    )
    # parts alone, for the bound
    t_att = time_graph(lambda: [attend(full, kv, None) for _ in range(LAYERS)])
    t_gemm = time_graph(lambda: [(pre(full, w), post(full, w)) for _ in range(LAYERS)])
    t_att_h = time_graph(
        lambda: [(attend(a, kv, None), attend(b, kv, None)) for _ in range(LAYERS)]
    )
    t_gemm_h = time_graph(
        lambda: [(pre(a, w), post(a, w), pre(b, w), post(b, w)) for _ in range(LAYERS)]
    )
    print(
        f"attention alone {t_att:.2f} ms ({kv_bytes / t_att / 1e9:.2f} TB/s), "
        f"in halves {t_att_h:.2f} ms; GEMMs alone {t_gemm:.2f} ms, in halves {t_gemm_h:.2f} ms"
    )
    rows = [
        ("serial", time_graph(lambda: serial(full, kv, w))),
        ("halves", time_graph(lambda: halves(a, b, kv, w))),
    ]
    lo_prio, hi_prio = (
        torch.cuda.Stream.priority_range()
        if hasattr(torch.cuda.Stream, "priority_range")
        else (0, -1)
    )
    for label, prio in (("overlap", 0), ("overlap attn-high", hi_prio)):
        side = torch.cuda.Stream(priority=prio)
        rows.append((label, time_graph(lambda: overlap(a, b, kv, w, side))))
    for splits in (1, 2, 4, 8):
        side = torch.cuda.Stream()
        rows.append(
            (f"overlap splits={splits}", time_graph(lambda: overlap(a, b, kv, w, side, splits)))
        )
    # GEMMs on a high-priority stream: capture the whole overlap on one
    gemm_hi = torch.cuda.Stream(priority=hi_prio)
    side = torch.cuda.Stream()
    rows.append(
        ("overlap gemm-high", time_graph(lambda: overlap(a, b, kv, w, side), stream=gemm_hi))
    )
    base = rows[0][1]
    print(f"\n{'variant':24s} {'ms/step':>8s} {'vs serial':>9s} {'tok/s':>8s}")
    for label, t in rows:
        print(f"{label:24s} {t:8.2f} {base / t:9.3f} {args.batch / t * 1e3:8.0f}")


if __name__ == "__main__":
    main()
