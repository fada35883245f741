"""Where a decode step's attention time goes with a turbo cache, against bf16 and fp8 caches:
llama-3-8b's attention (32 query heads, 8 KV heads of 128), ``--batch`` sequences with
contexts uniform in 1000..1480 (the 1000 x 1000/1000 throughput workload's middle), 32 layers
captured in one CUDA graph, as the model runner replays them.

For each cache: the whole backend step (store, queries' transform, attention, output's
transform), then each part alone over the same 32 layers: the store, the attention kernels on
queries already transformed, the queries' rotation and the output's (turbo only). K/V bytes
read per step and TB/s are those of the attention part. Then a prefill step per cache: 8
prompts of 1024 tokens over 32 layers (store and attention), where every query tile reads and
unpacks its context again.

A 4-bit cache is decoded by its own kernel (kernels/turbo_decode.py); the row ``turbo4/split``
decodes it with the split kernel that serves the other caches (``ops.NIBBLE_DECODE`` off), and
``turbo4@TxWxS`` with the own kernel on tiles of T keys, W warps and S pipeline stages instead
of the heuristic's (``heuristics.nibble_decode_tiles``), so both choices are compared on the
same batch. ``--context LO:HI`` draws the contexts from LO..HI instead (``32768:32768`` with
``--batch 64``: the 64 x 32k decode).

Usage: python bench/gpu/kv_turbo_probe.py [--batch 512] [--context 1000:1480]
    [--codecs bf16,fp8,turbo8,turbo4,turbo3,turbo4/split,turbo4@64x4x2] [--no-prefill]
"""

from __future__ import annotations

import argparse
from contextlib import contextmanager

import torch
import triton

from tallow.kernels.kv_cache import footprint
from tallow_attention_triton import ops, turbo_ops
from tallow_attention_triton.backend import TritonAttentionBackend
from tallow_attention_triton.heuristics import DecodeTiles
from tallow_attention_triton.testing import make_case

from tallow.bench.kernel_timing import graph_milliseconds as time_graph

HEADS, KV_HEADS, HEAD_DIM, LAYERS = 32, 8, 128, 32


def codec_of(name: str):  # noqa: ANN201
    from tallow.kernels.kv_cast import CastKVCodec

    if name == "bf16":
        return CastKVCodec(storage=torch.bfloat16)
    if name == "fp8":
        return CastKVCodec(storage=torch.float8_e4m3fn)
    from tallow_kvcache_turboquant.codec import Turbo3KVCodec, Turbo4KVCodec, Turbo8KVCodec

    return {"turbo8": Turbo8KVCodec, "turbo4": Turbo4KVCodec, "turbo3": Turbo3KVCodec}[name]()


@contextmanager
def variant(name: str):  # noqa: ANN201
    """The decode choices of a row name: ``/split`` (the split kernel for a 4-bit cache) or
    ``@TxWxS`` (tiles of the 4-bit kernel); the codec's name is what comes before them."""
    saved = ops.NIBBLE_DECODE, ops.nibble_decode_tiles
    if name.endswith("/split"):
        ops.NIBBLE_DECODE = False
    elif "@" in name:
        tile_n, warps, stages = map(int, name.split("@")[1].split("x"))
        ops.nibble_decode_tiles = lambda head_dim, group, elem_bytes: DecodeTiles(
            g_pad=max(16, 1 << (group - 1).bit_length()),
            tile_n=tile_n,
            num_warps=warps,
            num_stages=stages,
        )
    try:
        yield name.split("/")[0].split("@")[0]
    finally:
        ops.NIBBLE_DECODE, ops.nibble_decode_tiles = saved


def probe(row: str, batch: int, ctx: list[int]) -> str:
    """The row of one cache (see the module docstring)."""
    with variant(row) as name:
        return _probe(row, name, batch, ctx)


def _probe(row: str, name: str, batch: int, ctx: list[int]) -> str:
    be = TritonAttentionBackend()
    codec = codec_of(name)
    case = make_case(
        query_lens=[1] * batch,
        context_lens=ctx,
        num_heads=HEADS,
        num_kv_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        block_size=16,
        dtype=torch.bfloat16,
        codec=codec,
        device="cuda",
        host_copies=False,
        spare_blocks=1,
    )
    cache, meta, layer = case.kv_cache, case.meta, case.layer
    turbo = turbo_ops.is_turbo(cache)
    out = be.forward(layer, case.q, case.k, case.v, cache, meta)
    err = float((out[: case.valid_rows].float() - case.reference_output(cache).float()).abs().max())
    splits = ops.choose_num_splits(case.q, cache, meta.num_seqs, meta.max_seq_len)
    q = turbo_ops.rotate_queries(case.q, cache) if turbo else case.q
    o = torch.empty_like(q)
    common = dict(
        query_start_loc=meta.query_start_loc,
        seq_lens=meta.seq_lens,
        block_tables=meta.block_tables,
        num_seqs=meta.num_seqs,
        scale=layer.scale,
        num_splits=splits,
        max_seq_len=meta.max_seq_len,
    )

    def layers(fn):  # noqa: ANN001, ANN202
        return lambda: [fn() for _ in range(LAYERS)]

    step = time_graph(layers(lambda: be.forward(layer, case.q, case.k, case.v, cache, meta)))
    store = time_graph(layers(lambda: ops.store_kv(cache, case.k, case.v, meta.slot_mapping)))
    attn = time_graph(layers(lambda: ops.decode_attention(q, cache, o, **common)))
    q_rot = out_rot = float("nan")
    if turbo:
        q_rot = time_graph(layers(lambda: turbo_ops.rotate_queries(case.q, cache)))
        out_rot = time_graph(layers(lambda: turbo_ops.restore_output(o, cache)))
    cost = footprint(codec, [layer], block_size=16, model_dtype=torch.bfloat16)
    gbytes = (sum(ctx) + batch) * cost.bytes_per_token * LAYERS / 1e9
    return (
        f"{row:14s} {step:8.3f} {store:7.3f} {attn:7.3f} {q_rot:7.3f} {out_rot:7.3f} "
        f"{gbytes:7.2f} {gbytes / attn:6.2f} {err:8.1e}  ({splits} splits)"
    )


def prefill(name: str) -> str:
    """ms of a prefill step of 8 x 1024 tokens over 32 layers with cache ``name``."""
    be = TritonAttentionBackend()
    case = make_case(
        query_lens=[1024] * 8,
        context_lens=[0] * 8,
        num_heads=HEADS,
        num_kv_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        block_size=16,
        dtype=torch.bfloat16,
        codec=codec_of(name),
        device="cuda",
    )
    # eager, as the engine runs prefill steps (do_bench flushes the L2 between runs)
    ms = triton.testing.do_bench(
        lambda: [
            be.forward(case.layer, case.q, case.k, case.v, case.kv_cache, case.meta)
            for _ in range(LAYERS)
        ]
    )
    return f"{name:8s} prefill 8 x 1024 tokens, 32 layers: {ms:8.3f} ms"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--context", default="1000:1480", help="LO:HI, contexts drawn uniformly")
    p.add_argument(
        "--codecs", default="bf16,fp8,turbo8,turbo4,turbo3,turbo4/split,turbo4@64x4x2,turbo4@64x2x3"
    )
    p.add_argument("--no-prefill", action="store_true", help="skip the prefill rows")
    args = p.parse_args()
    g = torch.Generator().manual_seed(0)
    lo, hi = map(int, args.context.split(":"))
    ctx = torch.randint(lo, hi + 1, (args.batch,), generator=g).tolist()
    print(
        f"{'cache':14s} {'step ms':>8s} {'store':>7s} {'attn':>7s} {'q rot':>7s} "
        f"{'out rot':>7s} {'KV GB':>7s} {'TB/s':>6s} {'max err':>8s}"
    )
    for name in args.codecs.split(","):
        print(probe(name, args.batch, ctx), flush=True)
        torch.cuda.empty_cache()
    for name in args.codecs.split(","):
        if args.no_prefill or not name.isalnum():  # the variants change only the decode
            continue
        print(prefill(name), flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
