"""Registration and the codecs' contract; the engine runs with them in the core's
tests/engine/test_kv_codec.py (against transformers) and on a GPU in tests/gpu."""

from __future__ import annotations

from importlib.metadata import entry_points

import torch

from tallow.kernels import allocate_layer, cache_saturation, to_cache_dtype
from tallow.plugin import KVCodecRegistry
from tallow.plugin.testing import modules_imported_by_registration

from tallow_kvcache_fp8 import plugin
from tallow_kvcache_fp8.codec import FP8E4M3KVCodec, FP8E5M2KVCodec


def test_entry_point_names_the_registration_module() -> None:
    eps = {ep.name: ep.value for ep in entry_points(group="tallow")}
    assert eps.get("tallow-kvcache-fp8") == "tallow_kvcache_fp8.plugin"


def test_registers_three_names_lazily() -> None:
    registry = KVCodecRegistry()
    plugin.tallow_register_kv_codecs(registry)
    assert all(registry.entry(name).lazy for name in registry.names())
    got = {name: registry.get(name) for name in ("fp8", "fp8_e4m3", "fp8_e5m2")}
    assert got == {"fp8": FP8E4M3KVCodec, "fp8_e4m3": FP8E4M3KVCodec, "fp8_e5m2": FP8E5M2KVCodec}


def test_registration_imports_no_torch() -> None:
    assert (
        modules_imported_by_registration(
            "tallow_kvcache_fp8.plugin", "tallow_register_kv_codecs", "KVCodecRegistry"
        )
        == []
    )


def test_codecs_lay_out_one_byte_k_and_v_tensors() -> None:
    for cls, dtype in ((FP8E4M3KVCodec, torch.float8_e4m3fn), (FP8E5M2KVCodec, torch.float8_e5m2)):
        codec = cls()
        assert codec.bits_per_element == 8.0
        for model_dtype in (torch.bfloat16, torch.float16, torch.float32):
            layout = codec.layout(
                num_kv_heads=2, head_dim=64, block_size=16, model_dtype=model_dtype
            )
            assert [(t.name, t.shape, t.dtype, t.per_block) for t in layout] == [
                ("k", (16, 2, 64), dtype, True),
                ("v", (16, 2, 64), dtype, True),
            ]


def test_encode_rounds_and_decode_widens() -> None:
    """The reference round trip: a value comes back as the cast rounds it, at its slot."""
    codec = FP8E4M3KVCodec()
    cache = allocate_layer(
        codec, num_kv_heads=2, head_dim=4, block_size=4, num_blocks=3, model_dtype=torch.bfloat16
    )
    k = torch.randn(5, 2, 4, dtype=torch.bfloat16) * 100
    v = torch.randn(5, 2, 4, dtype=torch.bfloat16)
    k[0, 0, 0] = 1e4  # beyond e4m3's range: saturates at 448
    slots = torch.tensor([9, 0, -1, 4, 11])
    codec.encode(cache, k, v, slots)
    got_k, got_v = codec.decode(cache, torch.tensor([2, 0, 1]))
    for row, slot in ((0, 9), (1, 0), (3, 4), (4, 11)):
        pos = {2: 0, 0: 1, 1: 2}[slot // 4] * 4 + slot % 4
        assert torch.equal(got_k[pos], to_cache_dtype(k[row], torch.float8_e4m3fn).float())
        assert torch.equal(got_v[pos], to_cache_dtype(v[row], torch.float8_e4m3fn).float())
    assert got_k[1, 0, 0] == 448.0  # row 0 went to slot 9: block 2, listed first, offset 1
    assert got_k.dtype == torch.float32


def test_stored_values_saturate_instead_of_turning_nan() -> None:
    assert cache_saturation(torch.float8_e4m3fn) == 448.0
    assert cache_saturation(torch.float8_e5m2) == 57344.0
    assert cache_saturation(torch.bfloat16) == 0.0
    x = torch.tensor([1e6, -1e6, 449.0, 0.3, -2.5, 0.0])
    e4m3 = to_cache_dtype(x, torch.float8_e4m3fn).float()
    assert e4m3.tolist() == [448.0, -448.0, 448.0, 0.3125, -2.5, 0.0]
    e5m2 = to_cache_dtype(x, torch.float8_e5m2).float()
    assert e5m2[:2].tolist() == [57344.0, -57344.0] and not torch.isnan(e5m2).any()
