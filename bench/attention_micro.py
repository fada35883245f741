"""Micro-benchmark of the triton paged-attention backend against the torch reference.

llama-3-8b attention geometry (32 query heads, 8 KV heads, head size 128), bf16, block size 16,
random (non-contiguous) block tables:

- decode at batch 1/64/256 and contexts 512/4096/32768: the split-K kernel alone (eager and
  replayed from a CUDA graph) and the whole backend step (store + attention, eager); achieved
  GB/s of K/V read;
- decode as a model runs it: one CUDA graph replaying store + attention over 32 layers (each
  with its own cache, so nothing stays in L2 between layers), time per layer;
- prefill of 4096 tokens (and a 4096-token chunk after 4096 cached tokens): TFLOP/s.

Each row also prints the torch reference's time and the largest difference between the two
outputs (a benchmark of a wrong kernel is worthless). Times are medians of
``triton.testing.do_bench`` (which flushes L2 between runs).

    python bench/attention_micro.py [--json results.json] [--no-reference] [--quick]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass

import torch


@dataclass
class Row:
    name: str
    triton_us: float
    graph_us: float | None
    step_us: float | None
    reference_us: float | None
    kv_gbps: float
    tflops: float
    max_abs_err: float | None
    splits: int | None = None


HQ, HKV, D, BS = 32, 8, 128, 16
DTYPE = torch.bfloat16


def bench(fn, rep: int = 200) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=rep, return_mode="median") * 1e3  # µs


def paged_batch(query_lens: list[int], context_lens: list[int]):
    """Device tensors of one step (K/V of the context random in the cache)."""
    from tallow.layers import AttentionLayer, AttentionMetadata

    dev = torch.device("cuda")
    seq_lens = [c + q for c, q in zip(context_lens, query_lens)]
    per_seq = [-(-s // BS) for s in seq_lens]
    total = sum(per_seq)
    width = max(per_seq)
    cache = random_cache(total, dev)
    perm = torch.randperm(total, device=dev, dtype=torch.int64)
    tables = torch.zeros(len(seq_lens), width, dtype=torch.int32, device=dev)
    slots = []
    start = 0
    for i, nb in enumerate(per_seq):
        tables[i, :nb] = perm[start : start + nb].to(torch.int32)
        start += nb
    tables_cpu = tables.cpu()
    for i, (c, q) in enumerate(zip(context_lens, query_lens)):
        for p in range(c, c + q):
            slots.append(int(tables_cpu[i, p // BS]) * BS + p % BS)
    n = sum(query_lens)
    qsl = [0]
    for q in query_lens:
        qsl.append(qsl[-1] + q)
    meta = AttentionMetadata(
        num_seqs=len(seq_lens),
        num_tokens=n,
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=dev),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
        block_tables=tables,
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        block_size=BS,
        query_start_loc_cpu=qsl,
        seq_lens_cpu=seq_lens,
    )
    layer = AttentionLayer(0, HQ, HKV, D, D**-0.5)
    q = torch.randn(n, HQ, D, dtype=DTYPE, device=dev)
    k = torch.randn(n, HKV, D, dtype=DTYPE, device=dev)
    v = torch.randn(n, HKV, D, dtype=DTYPE, device=dev)
    return layer, q, k, v, cache, meta


def random_cache(num_blocks: int, device: torch.device):
    """A bf16 cache of ``num_blocks`` blocks of random K/V."""
    from tallow.kernels.kv_cache import allocate_layer
    from tallow.kernels.kv_cast import AutoKVCodec

    cache = allocate_layer(
        AutoKVCodec(),
        num_kv_heads=HKV,
        head_dim=D,
        block_size=BS,
        num_blocks=num_blocks,
        model_dtype=DTYPE,
        device=device,
    )
    for tensor in cache.paged():
        tensor.normal_()
    return cache


def reference(layer, q, cache, meta):
    from tallow.kernels.attention_ref import paged_attention_ref

    return paged_attention_ref(
        q,
        cache,
        query_start_loc=meta.query_start_loc_cpu,
        seq_lens=meta.seq_lens_cpu,
        block_tables=meta.block_tables,
        scale=layer.scale,
    )


def decode_row(batch: int, context: int, with_reference: bool) -> Row:
    from tallow_attention_triton import ops
    from tallow_attention_triton.backend import TritonAttentionBackend
    from tallow_attention_triton.heuristics import decode_num_splits

    layer, q, k, v, cache, meta = paged_batch([1] * batch, [context] * batch)
    be = TritonAttentionBackend()
    be.forward(layer, q, k, v, cache, meta)  # stores this step's K/V, compiles
    out = torch.empty_like(q)
    args = dict(
        query_start_loc=meta.query_start_loc,
        seq_lens=meta.seq_lens,
        block_tables=meta.block_tables,
        num_seqs=batch,
        scale=layer.scale,
        max_seq_len=meta.max_seq_len,
    )
    splits = decode_num_splits(
        batch, HKV, sm_count=ops.device_facts(q.device)[0], max_seq_len=meta.max_seq_len
    )

    def attend() -> None:
        ops.decode_attention(q, cache, out, **args)

    t = bench(attend)
    step = bench(lambda: be.forward(layer, q, k, v, cache, meta))
    attend()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        attend()  # captured: split count chosen for any length
    g = bench(graph.replay)
    kv_bytes = 2 * batch * (context + 1) * HKV * D * cache["k"].element_size()
    flops = 4 * batch * HQ * D * (context + 1)
    ref_us = err = None
    if with_reference:
        expected = reference(layer, q, cache, meta)
        graph.replay()
        torch.cuda.synchronize()
        err = float((out.float() - expected.float()).abs().max())
        ref_us = bench(lambda: reference(layer, q, cache, meta), rep=50)
    return Row(
        f"decode b={batch} ctx={context}",
        t,
        g,
        step,
        ref_us,
        kv_bytes / t / 1e3,
        flops / t / 1e6,
        err,
        splits,
    )


def layers_row(batch: int, context: int, layers: int = 32) -> Row:
    """Per-layer time of decode steps captured for ``layers`` layers in one CUDA graph, the way
    the model runner replays a decode step (store + attention per layer)."""
    from tallow_attention_triton.backend import TritonAttentionBackend

    layer, q, k, v, cache, meta = paged_batch([1] * batch, [context] * batch)
    caches = [cache] + [random_cache(cache.num_blocks, q.device) for _ in range(layers - 1)]
    be = TritonAttentionBackend()
    outs = []

    def step() -> None:
        outs.clear()
        for c in caches:
            outs.append(be.forward(layer, q, k, v, c, meta))

    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    t = bench(graph.replay) / layers
    kv_bytes = 2 * batch * (context + 1) * HKV * D * cache["k"].element_size()
    flops = 4 * batch * HQ * D * (context + 1)
    return Row(
        f"graph/layer b={batch} ctx={context}",
        t,
        t,
        t,
        None,
        kv_bytes / t / 1e3,
        flops / t / 1e6,
        None,
    )


def prefill_row(tokens: int, context: int, with_reference: bool) -> Row:
    from tallow_attention_triton import ops

    layer, q, k, v, cache, meta = paged_batch([tokens], [context])
    ops.store_kv(cache, k, v, meta.slot_mapping)
    out = torch.empty_like(q)

    def attend() -> None:
        ops.prefill_attention(
            q,
            cache,
            out,
            query_start_loc=meta.query_start_loc,
            seq_lens=meta.seq_lens,
            block_tables=meta.block_tables,
            num_seqs=1,
            scale=layer.scale,
        )

    attend()
    t = bench(attend)
    pairs = sum(context + i + 1 for i in range(tokens))  # causal (query, key) pairs
    flops = 4 * HQ * D * pairs
    kv_bytes = 2 * (context + tokens) * HKV * D * cache["k"].element_size()
    ref_us = err = None
    if with_reference:
        expected = reference(layer, q, cache, meta)
        err = float((out.float() - expected.float()).abs().max())
        ref_us = bench(lambda: reference(layer, q, cache, meta), rep=50)
    name = f"prefill {tokens}" + (f" after {context}" if context else "")
    return Row(name, t, None, None, ref_us, kv_bytes / t / 1e3, flops / t / 1e6, err)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="also write the rows to this JSON file")
    parser.add_argument(
        "--no-reference", action="store_true", help="skip timing the (slow) torch reference"
    )
    parser.add_argument("--quick", action="store_true", help="batch 1/64, contexts 512/4096")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("attention_micro: needs a CUDA GPU", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    batches = (1, 64) if args.quick else (1, 64, 256)
    contexts = (512, 4096) if args.quick else (512, 4096, 32768)
    rows: list[Row] = []
    ref = not args.no_reference
    print(f"{torch.cuda.get_device_name()}; {HQ} q heads, {HKV} kv heads, D {D}, bf16, block {BS}")
    header = (
        f"{'case':28} {'triton µs':>10} {'graph µs':>9} {'step µs':>9} {'splits':>6} "
        f"{'KV GB/s':>8} {'TFLOP/s':>8} {'torch µs':>10} {'speedup':>8} {'max err':>8}"
    )
    print(header)
    print("-" * len(header))

    def show(r: Row) -> None:
        rows.append(r)
        fmt = lambda x, f: format(x, f) if x is not None else "-"  # noqa: E731
        speed = f"{r.reference_us / r.triton_us:.1f}x" if r.reference_us else "-"
        print(
            f"{r.name:28} {r.triton_us:10.1f} {fmt(r.graph_us, '9.1f'):>9} "
            f"{fmt(r.step_us, '9.1f'):>9} {fmt(r.splits, 'd'):>6} {r.kv_gbps:8.0f} "
            f"{r.tflops:8.1f} {fmt(r.reference_us, '10.0f'):>10} {speed:>8} "
            f"{fmt(r.max_abs_err, '8.1e'):>8}",
            flush=True,
        )

    for b in batches:
        for c in contexts:
            show(decode_row(b, c, ref))
            torch.cuda.empty_cache()
    for b, c in ((1, 768), (1, 4096), (1, 32768), (64, 768)):
        show(layers_row(b, c))
        torch.cuda.empty_cache()
    show(prefill_row(4096, 0, ref))
    show(prefill_row(4096, 4096, ref))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"device": torch.cuda.get_device_name(), "rows": [asdict(r) for r in rows]},
                f,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
