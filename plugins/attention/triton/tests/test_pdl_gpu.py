"""The attention kernels with Programmatic Dependent Launch (tallow.kernels.pdl) on a GPU of
compute capability 9.0+: the same bits with PDL on and off, eagerly and replayed from a captured
CUDA graph of a store -> decode -> decode chain (``pytest -m gpu`` on the GPU machine)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tallow.kernels import (
    LayerKVCache,
    compiled_with_pdl,
    off_then_on,
    set_pdl,
    unsupported_reason,
)
from tallow_attention_triton import ops
from tallow_attention_triton.backend import TritonAttentionBackend
from tallow_attention_triton.kernels.decode import decode_reduce_kernel, decode_split_kernel
from tallow_attention_triton.kernels.prefill import prefill_kernel
from tallow_attention_triton.kernels.store import store_kv_kernel
from tallow_attention_triton.testing import PagedCase, assert_same_cache, make_case

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CONTEXTS = [0, 1, 17, 130, 700, 1500, 4100]


@pytest.fixture(autouse=True)
def pdl_gpu():
    """Skip (with the reason) where PDL cannot run; leave the switch as the environment says."""
    reason = unsupported_reason(torch.device("cuda", torch.cuda.current_device()))
    if reason:
        pytest.skip(reason)
    yield
    set_pdl(None)


def same(actual: torch.Tensor | LayerKVCache, expected: torch.Tensor | LayerKVCache) -> None:
    """Equal values, NaN where NaN (cache entries no sequence owns are NaN)."""
    if isinstance(expected, LayerKVCache):
        assert_same_cache(actual, expected, "PDL on against off")
        return
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)


def copy_into(static: torch.Tensor | LayerKVCache, value: torch.Tensor | LayerKVCache) -> None:
    if isinstance(static, LayerKVCache):
        for name, tensor in static.tensors.items():
            tensor.copy_(value[name])
    else:
        static.copy_(value)


def built_with_pdl(*kernels: Any) -> None:
    """Each kernel ran with PDL (unknowable where Triton hides its compile cache)."""
    for kernel in kernels:
        assert compiled_with_pdl(kernel) in (True, None), f"{kernel} never ran with PDL"


def decode_case(seed: int, padding_rows: int = 0) -> PagedCase:
    return make_case(
        query_lens=[1] * len(CONTEXTS),
        context_lens=CONTEXTS,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        block_size=16,
        dtype=torch.bfloat16,
        device="cuda",
        padding_rows=padding_rows,
        host_copies=False,
        seed=seed,
    )


@pytest.mark.parametrize("num_splits", [1, 8])
@pytest.mark.parametrize("fused_store", [False, True])
def test_decode_same_bits(num_splits: int, fused_store: bool) -> None:
    case = decode_case(seed=1 + num_splits, padding_rows=2)
    meta = case.meta
    stored = dict(k=case.k, v=case.v, slot_mapping=meta.slot_mapping) if fused_store else {}

    def run() -> tuple[torch.Tensor, LayerKVCache]:
        cache = case.kv_cache.clone()
        if not fused_store:
            ops.store_kv(cache, case.k, case.v, meta.slot_mapping)
        out = torch.zeros_like(case.q)
        ops.decode_attention(
            case.q,
            cache,
            out,
            query_start_loc=meta.query_start_loc,
            seq_lens=meta.seq_lens,
            block_tables=meta.block_tables,
            num_seqs=meta.num_seqs,
            scale=case.layer.scale,
            num_splits=num_splits,
            **stored,
        )
        return out, cache

    (out_off, cache_off), (out_on, cache_on) = off_then_on(run)
    same(out_on, out_off)
    same(cache_on, cache_off)
    built_with_pdl(decode_split_kernel)
    if not fused_store:
        built_with_pdl(store_kv_kernel)
    if num_splits > 1:
        built_with_pdl(decode_reduce_kernel)


def test_mixed_batch_same_bits() -> None:
    """Prefill chunks beside decodes: store, prefill and mixed decode kernels."""
    case = make_case(
        query_lens=[1, 300, 1, 33, 1],
        context_lens=[2000, 0, 64, 900, 5],
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        dtype=torch.bfloat16,
        device="cuda",
        seed=7,
    )

    def run() -> tuple[torch.Tensor, LayerKVCache]:
        cache = case.kv_cache.clone()
        out = TritonAttentionBackend().forward(case.layer, case.q, case.k, case.v, cache, case.meta)
        return out[: case.valid_rows], cache

    (out_off, cache_off), (out_on, cache_on) = off_then_on(run)
    same(out_on, out_off)
    same(cache_on, cache_off)
    built_with_pdl(prefill_kernel, store_kv_kernel, decode_split_kernel)


@pytest.mark.parametrize("num_splits", [1, 8])
def test_graph_of_a_decode_chain_same_bits(num_splits: int) -> None:
    """store -> decode -> decode (fused store) -> decode, each attending with the previous
    output as its query, captured with PDL on and replayed on three inputs: the same bits as
    the chain run eagerly with PDL off."""
    case = decode_case(seed=10 + num_splits)
    meta = case.meta
    common = dict(
        query_start_loc=meta.query_start_loc,
        seq_lens=meta.seq_lens,
        block_tables=meta.block_tables,
        num_seqs=meta.num_seqs,
        scale=case.layer.scale,
        num_splits=num_splits,
    )
    g = torch.Generator(device="cuda").manual_seed(num_splits)

    def noise(t: torch.Tensor) -> torch.Tensor:
        return (torch.randn(t.shape, generator=g, device="cuda") * 0.5).to(t.dtype)

    # three inputs on one batch layout: new q/k/v, the cached values moved (NaN stays NaN)
    def moved(cache: LayerKVCache) -> LayerKVCache:
        out = cache.clone()
        for tensor in out.tensors.values():
            tensor += noise(tensor)
        return out

    inputs = [(case.q, case.k, case.v, case.kv_cache)] + [
        (noise(case.q), noise(case.k), noise(case.v), moved(case.kv_cache)) for _ in range(2)
    ]

    def chain(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: LayerKVCache
    ) -> torch.Tensor:
        ops.store_kv(cache, k, v, meta.slot_mapping)
        a = ops.decode_attention(q, cache, torch.empty_like(q), **common)
        b = ops.decode_attention(
            a, cache, torch.empty_like(q), k=k, v=v, slot_mapping=meta.slot_mapping, **common
        )
        return ops.decode_attention(b, cache, torch.empty_like(q), **common)

    def eager(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: LayerKVCache
    ) -> tuple[torch.Tensor, LayerKVCache]:
        cache = cache.clone()
        return chain(q, k, v, cache), cache

    set_pdl(False)
    expected = [eager(*args) for args in inputs]
    set_pdl(True)
    for args, (want_out, want_cache) in zip(inputs, expected):
        out, cache = eager(*args)  # also compiles the PDL variants before the capture
        same(out, want_out)
        same(cache, want_cache)
    q, k, v, cache = (t.clone() for t in inputs[0])
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain(q, k, v, cache)
    got = []
    for args in inputs:
        for static, value in zip((q, k, v, cache), args):
            copy_into(static, value)
        graph.replay()
        got.append((out.clone(), cache.clone()))
    torch.cuda.synchronize()
    for (want_out, want_cache), (out_i, cache_i) in zip(expected, got):
        same(out_i, want_out)
        same(cache_i, want_cache)
    built_with_pdl(store_kv_kernel, decode_split_kernel)
