"""The flashinfer backend on a CUDA GPU against the torch reference and the triton backend:
prompts, chunked prefill beside decodes, decode over long contexts and prefix-cache hits, for
every shape of flashinfer_cases.SHAPES (head sizes 64, 128, 256, GQA ratios 2 to 8, bf16 and
fp16, sliding window and softcap, e4m3 and e5m2 caches); CUDA-graph replay against eager runs.
(The attention-backend conformance suite: test_conformance.py.) Random inputs from the test
seed (tallow.plugin.testing.seeds)."""

from __future__ import annotations

import dataclasses
import random
import zlib

import pytest
import torch
from flashinfer_cases import SHAPES, backend, needs_gpu

from tallow.plugin.testing.seeds import base_seed
from tallow.kernels import CastKVCodec, allocate_layer, paged_attention_ref, store_cast_kv_ref
from tallow.layers import AttentionLayer, AttentionMetadata, forward_context
from tallow.plugin.testing.paged_batch import (
    check_step,
    output_tolerance,
    random_paged_step,
    widened,
)

pytestmark = needs_gpu

BASE_SEED = base_seed()

#: name: (query lengths, context lengths, full blocks every sequence shares with the first)
CASES = {
    "prefill": ([1000, 37, 1, 129], [0, 0, 0, 0], 0),
    "chunked": ([512, 1, 77, 1, 300], [1000, 2047, 16, 4000, 513], 0),
    "decode": ([1] * 12, [0, 1, 15, 16, 17, 100, 511, 512, 1000, 2048, 4000, 4101], 0),
    "prefix": ([1, 5, 33, 200], [64, 64, 100, 70], 4),
}


def seed_of(*parts: object) -> int:
    return (zlib.crc32(repr(parts).encode()) ^ BASE_SEED) % (2**31)


def make_step(shape: str, query_lens, context_lens, shared: int = 0, seed: int = 0):
    heads, kv_heads, head_dim, dtype, cache_dtype, window, softcap, _ = SHAPES[shape]
    return random_paged_step(
        query_lens=query_lens,
        context_lens=context_lens,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        block_size=16,
        dtype=dtype,
        cache_dtype=cache_dtype,
        device="cuda",
        shared_prefix_blocks=shared,
        sliding_window=window,
        logit_softcap=softcap,
        seed=seed,
    )


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.usefixtures("flashinfer_modules")
def test_against_the_reference_and_triton(shape: str, case: str) -> None:
    from tallow_attention_triton.backend import TritonAttentionBackend

    query_lens, context_lens, shared = CASES[case]
    step = make_step(shape, query_lens, context_lens, shared, seed_of(shape, case))
    twin = dataclasses.replace(step, kv_cache=step.kv_cache.clone())
    out = check_step(step, backend(SHAPES[shape][-1]))  # the reference: output and cache
    theirs = TritonAttentionBackend().forward(
        twin.layer, twin.q, twin.k, twin.v, twin.kv_cache, twin.meta
    )
    n = step.valid_rows
    torch.testing.assert_close(
        out[:n],
        theirs[:n],
        **output_tolerance(step.q.dtype),
        msg=lambda m: f"flashinfer vs triton ({step.description}): {m}",
    )


def _graph_case(shape: str, rows: int, width: int, num_blocks: int):
    heads, kv_heads, head_dim, dtype, cache_dtype, window, softcap, settings = SHAPES[shape]
    layers = [
        AttentionLayer(
            i,
            heads,
            kv_heads,
            head_dim,
            head_dim**-0.5,
            sliding_window=window,
            logit_softcap=softcap,
        )
        for i in range(2)
    ]
    g = torch.Generator(device="cuda").manual_seed(seed_of("graph", shape))
    codec = CastKVCodec(storage=cache_dtype)
    caches = [
        allocate_layer(
            codec,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            block_size=16,
            num_blocks=num_blocks,
            model_dtype=dtype,
            device="cuda",
            layer=layer,
        )
        for layer in layers
    ]
    for cache in caches:
        for name in ("k", "v"):
            cache[name].copy_(
                torch.randn(cache[name].shape, generator=g, device="cuda").to(cache_dtype)
            )
    static = dict(
        seq_lens=torch.ones(rows, dtype=torch.int32, device="cuda"),
        block_tables=torch.zeros(rows, width, dtype=torch.int32, device="cuda"),
        slot_mapping=torch.full((rows,), -1, dtype=torch.int64, device="cuda"),
        q=torch.zeros(rows, heads, head_dim, dtype=dtype, device="cuda"),
        k=torch.zeros(rows, kv_heads, head_dim, dtype=dtype, device="cuda"),
        v=torch.zeros(rows, kv_heads, head_dim, dtype=dtype, device="cuda"),
    )
    meta = AttentionMetadata(
        num_seqs=rows,
        num_tokens=rows,
        query_start_loc=torch.arange(rows + 1, dtype=torch.int32, device="cuda"),
        seq_lens=static["seq_lens"],
        block_tables=static["block_tables"],
        slot_mapping=static["slot_mapping"],
        max_query_len=1,
        max_seq_len=width * 16,
        block_size=16,
        query_start_loc_cpu=list(range(rows + 1)),
        seq_lens_cpu=[1] * rows,
        cuda_graph=True,
    )
    return layers, caches, static, meta, g, settings


@pytest.mark.parametrize("shape", ["llama-3-8b", "qwen3-0.6b", "fp8-e4m3", "hd256-window-softcap"])
@pytest.mark.usefixtures("flashinfer_modules")
def test_cuda_graph_replay_equals_eager(shape: str) -> None:
    """Two layers of one kind captured in a graph of 8 rows the way the engine captures decode
    (planned before capture, re-planned before each replay with the batch's lengths, padding
    rows of length 1): each replay gives exactly what the same planned kernels give eagerly,
    and what an eager step without a graph gives, within rounding, and the reference's."""
    rows, width, num_blocks = 8, 320, 2600
    layers, caches, static, meta, g, settings = _graph_case(shape, rows, width, num_blocks)
    be = backend(settings)
    be.warm_up(layers, caches, static["q"].dtype)

    def run_layers(m):
        return [
            be.forward(layer, static["q"], static["k"], static["v"], cache, m)
            for layer, cache in zip(layers, caches)
        ]

    with forward_context(meta, be):  # plans every kind the warm-up saw
        run_layers(meta)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = run_layers(meta)
    rng = random.Random(seed_of("graph-batches", shape))
    for real in (8, 5, 1):
        lens = [rng.choice([1, 2, 16, 17, 300, 1024, 4099, 5000]) for _ in range(real)]
        tables = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(real))
        static["seq_lens"].fill_(1)
        static["slot_mapping"].fill_(-1)
        for i, n in enumerate(lens):
            pages = -(-n // 16)
            static["block_tables"][i, :pages] = tables[i * 320 : i * 320 + pages].cuda().int()
            last = int(static["block_tables"][i, (n - 1) // 16])
            static["slot_mapping"][i] = last * 16 + (n - 1) % 16
            static["seq_lens"][i] = n
        for name in ("q", "k", "v"):
            static[name].copy_(torch.randn(static[name].shape, generator=g, device="cuda"))
        replay_meta = dataclasses.replace(meta, seq_lens_cpu=lens + [1] * (rows - real))
        be.plan(replay_meta)
        graph.replay()
        replayed = [o[:real].clone() for o in captured]
        # the same planned kernels, launched eagerly
        again = run_layers(replay_meta)
        # an eager decode step of the real rows, planned without a graph
        eager_meta = AttentionMetadata(
            num_seqs=real,
            num_tokens=real,
            query_start_loc=meta.query_start_loc[: real + 1],
            seq_lens=static["seq_lens"][:real].clone(),
            block_tables=static["block_tables"][:real].clone(),
            slot_mapping=static["slot_mapping"][:real].clone(),
            max_query_len=1,
            max_seq_len=max(lens),
            block_size=16,
            query_start_loc_cpu=list(range(real + 1)),
            seq_lens_cpu=lens,
        )
        tol = output_tolerance(static["q"].dtype)
        for i, (layer, cache) in enumerate(zip(layers, caches)):
            assert torch.equal(replayed[i], again[i][:real]), (shape, real, i)
            eager = be.forward(
                layer, static["q"][:real], static["k"][:real], static["v"][:real], cache, eager_meta
            )
            torch.testing.assert_close(replayed[i], eager, **tol)
            ref = paged_attention_ref(
                static["q"][:real],
                cache,
                query_start_loc=list(range(real + 1)),
                seq_lens=lens,
                block_tables=static["block_tables"][:real],
                scale=layer.scale,
                sliding_window=layer.sliding_window,
                logit_softcap=layer.logit_softcap,
            )
            torch.testing.assert_close(replayed[i], ref, **tol)


def test_padding_rows_of_a_replay_store_nothing(flashinfer_modules) -> None:
    """A replay with padding rows (slot -1) leaves every other cache entry as it was."""
    layers, caches, static, meta, g, settings = _graph_case("llama-3-8b", 4, 8, 64)
    be = backend(settings)
    be.warm_up(layers[:1], caches[:1], static["q"].dtype)
    cache = caches[0]
    with forward_context(meta, be):
        be.forward(layers[0], static["q"], static["k"], static["v"], cache, meta)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            be.forward(layers[0], static["q"], static["k"], static["v"], cache, meta)
    static["seq_lens"][0] = 20
    static["block_tables"][0, :2] = torch.tensor([5, 9], device="cuda")
    static["slot_mapping"][0] = 9 * 16 + 3
    static["k"].normal_()
    static["v"].normal_()
    expected = cache.clone()
    store_cast_kv_ref(
        expected["k"], expected["v"], static["k"], static["v"], static["slot_mapping"]
    )
    be.plan(dataclasses.replace(meta, seq_lens_cpu=[20, 1, 1, 1]))
    graph.replay()
    torch.cuda.synchronize()
    for name in ("k", "v"):
        assert torch.equal(widened(cache[name]), widened(expected[name])), name
