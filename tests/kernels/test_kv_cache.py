"""The KV storage owner (tallow.kernels.kv_cache): layouts are checked, caches allocated and
filled by their codec, blocks copied byte for byte, footprints computed from layouts; and the
registry keeps each codec's bits for listings."""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch

from tallow.kernels import kv_cache
from tallow.kernels.attention_ref import attention_ref, paged_attention_ref
from tallow.kernels.kv_cast import AutoKVCodec, CastKVCodec
from tallow.layers import AttentionLayer
from tallow.plugin import KVCodec, KVCodecRegistry, KVTensor, RegistryError


class Bad(KVCodec):
    name: ClassVar[str] = "bad"

    def __init__(self, layout: list[object]) -> None:
        super().__init__()
        self._layout = layout

    def layout(self, **_: object) -> list[KVTensor]:
        return self._layout  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        (
            [KVTensor("k", (4, 2, 8), torch.int8), KVTensor("k", (4, 2, 8), torch.int8)],
            "tensor name 'k' appears twice",
        ),
        ([KVTensor("k", (4, 0, 8), torch.int8)], "tensor 'k' has shape (4, 0, 8)"),
        ([KVTensor("k", (4, 2, 8), "int8")], "tensor 'k' has dtype 'int8'"),
        ([KVTensor("s", (2,), torch.float32, per_block=False)], "has no paged (per_block) tensor"),
        (["k"], "must return KVTensor items"),
    ],
)
def test_bad_layouts_are_named(layout: list[object], message: str) -> None:
    with pytest.raises((ValueError, TypeError)) as info:
        kv_cache.layer_layout(
            Bad(layout), num_kv_heads=2, head_dim=8, block_size=4, model_dtype=torch.float32
        )
    assert "kv codec 'bad' (head size 8, 2 KV heads)" in str(info.value)
    assert message in str(info.value)


def test_allocation_follows_the_layout_and_the_codec_fills_per_layer_tensors() -> None:
    codec = CastKVCodec(storage=torch.float8_e5m2, per_head_scales=True)
    cache = kv_cache.allocate_layer(
        codec, num_kv_heads=3, head_dim=16, block_size=8, num_blocks=5, model_dtype=torch.bfloat16
    )
    assert {n: (tuple(t.shape), t.dtype) for n, t in cache.tensors.items()} == {
        "k": ((5, 8, 3, 16), torch.float8_e5m2),
        "v": ((5, 8, 3, 16), torch.float8_e5m2),
        "k_scale": ((3,), torch.float32),
        "v_scale": ((3,), torch.float32),
    }
    assert cache.num_blocks == 5 and [t.data_ptr() for t in cache.paged()] == [
        cache["k"].data_ptr(),
        cache["v"].data_ptr(),
    ]
    assert torch.equal(cache["k_scale"], torch.ones(3))  # init_layer
    assert "k" in cache and "rotation" not in cache and cache.get("rotation") is None


def test_copy_blocks_copies_every_paged_tensor_byte_for_byte() -> None:
    codec = CastKVCodec(storage=torch.float8_e4m3fn, per_head_scales=True)
    caches = [
        kv_cache.allocate_layer(
            codec, num_kv_heads=2, head_dim=8, block_size=4, num_blocks=6, model_dtype=torch.float32
        )
        for _ in range(2)
    ]
    gen = torch.Generator().manual_seed(0)
    for cache in caches:
        for tensor in cache.paged():
            tensor.view(torch.uint8).copy_(
                torch.randint(0, 256, tensor.shape, generator=gen, dtype=torch.uint8)
            )
        cache["k_scale"].fill_(3.0)
    before = [cache.clone() for cache in caches]
    kv_cache.copy_blocks(caches, torch.tensor([1, 4]), torch.tensor([2, 0]))
    for cache, old in zip(caches, before):
        for name in ("k", "v"):
            got, was = cache[name].view(torch.uint8), old[name].view(torch.uint8)
            assert torch.equal(got[2], was[1]) and torch.equal(got[0], was[4])
            assert torch.equal(got[[1, 3, 4, 5]], was[[1, 3, 4, 5]])
        assert torch.equal(cache["k_scale"], old["k_scale"])


def test_footprint_counts_paged_bytes_per_token_against_a_16_bit_cache() -> None:
    layers = [AttentionLayer(0, 8, 2, 64, 0.1), AttentionLayer(1, 8, 4, 128, 0.1)]
    auto = kv_cache.footprint(AutoKVCodec(), layers, block_size=16, model_dtype=torch.bfloat16)
    per_token = 2 * (2 * 64 + 4 * 128) * 2
    assert auto.bytes_per_block == 16 * per_token and auto.fixed_bytes == 0
    assert auto.vs_bf16 == 1.0 and auto.tokens(10) == 160
    assert auto.tokens_per_gib == (1 << 30) / per_token
    full = kv_cache.footprint(AutoKVCodec(), layers, block_size=16, model_dtype=torch.float32)
    assert full.vs_bf16 == 0.5
    scaled = kv_cache.footprint(
        CastKVCodec(storage=torch.float8_e4m3fn, per_head_scales=True),
        layers,
        block_size=16,
        model_dtype=torch.bfloat16,
    )
    assert scaled.vs_bf16 == 2.0 and scaled.fixed_bytes == 2 * 4 * (2 + 4)


def test_the_reference_attention_reads_through_the_codec() -> None:
    """paged_attention_ref decodes each sequence's blocks with the cache's codec: a scaled
    cast cache gives the attention of the unscaled values it stores."""
    codec = CastKVCodec(per_head_scales=True)
    cache = kv_cache.allocate_layer(
        codec, num_kv_heads=2, head_dim=8, block_size=4, num_blocks=4, model_dtype=torch.float32
    )
    cache["k_scale"].copy_(torch.tensor([0.5, 4.0]))
    cache["v_scale"].copy_(torch.tensor([2.0, 0.25]))
    gen = torch.Generator().manual_seed(1)
    k, v = torch.randn(6, 2, 8, generator=gen), torch.randn(6, 2, 8, generator=gen)
    q = torch.randn(2, 4, 8, generator=gen)
    table = torch.tensor([[3, 1]], dtype=torch.int32)
    codec.encode(cache, k, v, torch.tensor([12, 13, 14, 15, 4, 5]))
    assert torch.allclose(cache["k"][3, 0], k[0] / cache["k_scale"][:, None])
    out = paged_attention_ref(
        q, cache, query_start_loc=[0, 2], seq_lens=[6], block_tables=table, scale=0.3
    )
    torch.testing.assert_close(out, attention_ref(q, k, v, scale=0.3, context_len=6))


def test_registry_keeps_bits_for_listings() -> None:
    registry = KVCodecRegistry()
    registry.register("auto", "m:A")
    registry.register("turbo4", "m:T", bits=4)
    registry.register("odd", "m:O", bits=3.5)
    assert [registry.label(n) for n in ("auto", "turbo4", "odd")] == [
        "auto (model dtype)",
        "turbo4 (4 bits)",
        "odd (3.5 bits)",
    ]
    for bad in (0, -1, "4", True):
        with pytest.raises(RegistryError, match="bits must be a positive number or None"):
            registry.register(f"x{bad}", "m:X", bits=bad)


def test_centred_keys_spend_the_8_bit_precision_on_what_varies() -> None:
    """center_keys: the calibrated offset is each head's mean key (zero under a logit
    softcap); keys are stored less it and read back with it. Keys with a large constant per
    channel (as Qwen2's key biases give) come back far closer than through a plain cast."""
    codec = CastKVCodec(storage=torch.float8_e4m3fn, center_keys=True)
    assert codec.calibrated and not CastKVCodec(storage=torch.float8_e4m3fn).calibrated
    layer = AttentionLayer(0, 4, 2, 16, 0.25)
    cache = kv_cache.allocate_layer(
        codec,
        num_kv_heads=2,
        head_dim=16,
        block_size=4,
        num_blocks=4,
        model_dtype=torch.float32,
        layer=layer,
    )
    assert cache["k_offset"].shape == (2, 16) and not cache["k_offset"].any()
    gen = torch.Generator().manual_seed(2)
    bias = torch.randn(2, 16, generator=gen) * 200
    k = bias + torch.randn(16, 2, 16, generator=gen)
    v = torch.randn(16, 2, 16, generator=gen)
    q = torch.randn(16, 4, 16, generator=gen)
    codec.calibrate(cache, q, k, v)
    torch.testing.assert_close(cache["k_offset"], k.mean(0))
    codec.encode(cache, k, v, torch.arange(16))
    got_k, got_v = codec.decode(cache, torch.arange(4))
    plain = kv_cache.to_cache_dtype(k, torch.float8_e4m3fn).float()
    centred_error = float((got_k - k).norm() / (k - bias).norm())
    plain_error = float((plain - k).norm() / (k - bias).norm())
    assert centred_error < 0.05 < 1.0 < plain_error
    torch.testing.assert_close(got_v, kv_cache.to_cache_dtype(v, torch.float8_e4m3fn).float())
    capped = kv_cache.allocate_layer(
        codec,
        num_kv_heads=2,
        head_dim=16,
        block_size=4,
        num_blocks=4,
        model_dtype=torch.float32,
        layer=AttentionLayer(0, 4, 2, 16, 0.25, logit_softcap=30.0),
    )
    codec.calibrate(capped, q, k, v)
    assert not capped["k_offset"].any()
