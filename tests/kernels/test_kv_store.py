"""The cast codecs' store (tallow.kernels.store_cast_kv): its reference writes exactly what the
cast codecs' ``encode`` writes, skips slot -1 and names bad arguments; on a CUDA GPU the
Triton kernel writes exactly what the reference writes (``pytest -m gpu
tests/kernels/test_kv_store.py``)."""

from __future__ import annotations

import pytest
import torch

from tallow.kernels import store_cast_kv, store_cast_kv_ref
from tallow.kernels.kv_cache import allocate_layer
from tallow.kernels.kv_cast import CastKVCodec

CACHE_DTYPES = [torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2]


def _case(
    cache_dtype: torch.dtype,
    device: str = "cpu",
    blocks: int = 6,
    block_size: int = 4,
    heads: int = 2,
    head_dim: int = 8,
    tokens: int = 9,
):
    codec = CastKVCodec(storage=cache_dtype)
    cache = allocate_layer(
        codec,
        num_kv_heads=heads,
        head_dim=head_dim,
        block_size=block_size,
        num_blocks=blocks,
        model_dtype=torch.bfloat16,
        device=device,
    )
    g = torch.Generator().manual_seed(7)
    # values beyond e4m3's range (448) too: the store clamps them as the codec does
    k = (torch.randn(tokens, heads, head_dim, generator=g) * 300).to(torch.bfloat16)
    v = torch.randn(tokens, heads, head_dim, generator=g).to(torch.bfloat16)
    slots = torch.randperm(blocks * block_size, generator=g)[:tokens]
    slots[[2, 5]] = -1  # padding rows
    return cache, k.to(device), v.to(device), slots.to(device)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.float().cpu(), b.float().cpu())


@pytest.mark.parametrize("cache_dtype", CACHE_DTYPES, ids=str)
def test_reference_writes_what_the_codec_encodes(cache_dtype: torch.dtype) -> None:
    cache, k, v, slots = _case(cache_dtype)
    expected = cache.clone()
    expected.codec.encode(expected, k, v, slots)
    store_cast_kv(cache["k"], cache["v"], k, v, slots)
    for name in ("k", "v"):
        assert _same(cache[name], expected[name]), name
    assert cache["k"].float().abs().max() > 0  # something was written


def test_slot_minus_one_writes_nothing() -> None:
    cache, k, v, slots = _case(torch.bfloat16)
    store_cast_kv_ref(cache["k"], cache["v"], k, v, torch.full_like(slots, -1))
    assert not cache["k"].any() and not cache["v"].any()


def test_bad_arguments_are_named() -> None:
    cache, k, v, slots = _case(torch.bfloat16)
    with pytest.raises(ValueError, match=r"k: expected \[T, 2, 8\]"):
        store_cast_kv(cache["k"], cache["v"], k[:, :1], v, slots)
    with pytest.raises(ValueError, match=r"slot_mapping: expected \[9\]"):
        store_cast_kv(cache["k"], cache["v"], k, v, slots[:4])
    with pytest.raises(ValueError, match="slot_mapping: expected int32 or int64"):
        store_cast_kv(cache["k"], cache["v"], k, v, slots.float())
    with pytest.raises(ValueError, match="two .blocks, block_size, Hkv, D. tensors"):
        store_cast_kv(cache["k"], cache["v"].half(), k, v, slots)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("cache_dtype", CACHE_DTYPES, ids=str)
def test_triton_kernel_equals_the_reference(cache_dtype: torch.dtype) -> None:
    cache, k, v, slots = _case(
        cache_dtype, "cuda", blocks=300, block_size=16, heads=8, head_dim=128, tokens=1000
    )
    expected = cache.clone()
    store_cast_kv_ref(expected["k"], expected["v"], k, v, slots)
    store_cast_kv(cache["k"], cache["v"], k, v, slots.int())
    for name in ("k", "v"):
        assert _same(cache[name], expected[name]), name
