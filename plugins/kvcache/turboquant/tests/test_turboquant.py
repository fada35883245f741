"""The turbo codecs' format and torch reference: registration, the rotation, quantization and
bit packing, the cache layout and capacity, encode/decode, calibration and its exactness for
attention. The engine runs them in tests/engine/test_kv_turbo.py (against transformers)."""

from __future__ import annotations

import math
from importlib.metadata import entry_points

import pytest
import torch

from tallow.kernels import attention_ref, kv_cache, paged_attention_ref
from tallow.layers import AttentionLayer
from tallow.plugin import KVCodecRegistry, PluginSettingsError
from tallow.plugin.testing import make_config, modules_imported_by_registration

from tallow_kvcache_turboquant import plugin
from tallow_kvcache_turboquant.codec import (
    Turbo3KVCodec,
    Turbo4KVCodec,
    Turbo8KVCodec,
    TurboKVCodec,
)
from tallow_kvcache_turboquant.quantize import (
    STEP_PER_RMS,
    center,
    code_bytes,
    dequantize,
    pack,
    quantize,
    unpack,
)
from tallow_kvcache_turboquant.rotation import fast_hadamard, rotate, rotation_matrix

CODECS = [Turbo8KVCodec, Turbo4KVCodec, Turbo3KVCodec]
VALUES_CENTERED = make_config(
    {"plugins": {"settings": {"tallow-kvcache-turboquant": {"center_values": True}}}}
)
HEAD_DIMS = [64, 80, 96, 128, 256]


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# -- registration ------------------------------------------------------------------------------
def test_entry_point_names_the_registration_module() -> None:
    eps = {ep.name: ep.value for ep in entry_points(group="tallow")}
    assert eps.get("tallow-kvcache-turboquant") == "tallow_kvcache_turboquant.plugin"


def test_registers_three_codecs_lazily_with_their_bits() -> None:
    registry = KVCodecRegistry()
    plugin.tallow_register_kv_codecs(registry)
    assert all(registry.entry(name).lazy for name in registry.names())
    assert {
        name: (registry.get(name), registry.entry(name).meta["bits"]) for name in registry.names()
    } == {"turbo8": (Turbo8KVCodec, 8), "turbo4": (Turbo4KVCodec, 4), "turbo3": (Turbo3KVCodec, 3)}
    assert [registry.get(n).bits_per_element for n in ("turbo8", "turbo4", "turbo3")] == [
        8.0,
        4.0,
        3.0,
    ]


def test_registration_imports_no_torch() -> None:
    assert (
        modules_imported_by_registration(
            "tallow_kvcache_turboquant.plugin", "tallow_register_kv_codecs", "KVCodecRegistry"
        )
        == []
    )


def test_bad_settings_name_their_key() -> None:
    config = make_config(
        {
            "plugins": {
                "settings": {
                    "tallow-kvcache-turboquant": {"rotation": "sideways", "seed": -1, "colour": 3}
                }
            }
        }
    )
    with pytest.raises(PluginSettingsError) as info:
        plugin.tallow_configure(config)
    text = str(info.value)
    for key in ("rotation", "seed", "colour"):
        assert f"plugins.settings.tallow-kvcache-turboquant.{key}" in text


# -- rotation ------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 8, 64, 128])
def test_fast_hadamard_is_sylvesters_matrix(n: int) -> None:
    from scipy.linalg import hadamard

    x = torch.randn(5, n, generator=gen(n), dtype=torch.float64)
    expected = x @ torch.from_numpy(hadamard(n)).double().T / math.sqrt(n)
    torch.testing.assert_close(fast_hadamard(x), expected)


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_rotation_is_orthogonal_and_mixes_every_channel(head_dim: int) -> None:
    r = rotation_matrix(head_dim, seed=3).double()
    torch.testing.assert_close(r @ r.T, torch.eye(head_dim, dtype=torch.float64), atol=1e-6, rtol=0)
    x = torch.randn(7, head_dim, generator=gen(head_dim), dtype=torch.float64)
    torch.testing.assert_close(rotate(x, seed=3), x @ r.T, atol=1e-6, rtol=0)
    # an outlier channel is spread over most coordinates, none of which keeps much of it
    p = 1 << (head_dim.bit_length() - 1)
    for channel in (0, head_dim // 2, head_dim - 1):
        spread = rotate(torch.eye(head_dim, dtype=torch.float64)[channel], seed=3)
        assert int((spread.abs() > 1e-9).sum()) >= 2 * head_dim // 3
        assert float(spread.abs().max()) <= (1 if p == head_dim else 2) / math.sqrt(p) + 1e-9
    assert not torch.equal(rotation_matrix(head_dim, seed=4), rotation_matrix(head_dim, seed=3))


# -- quantization and packing ------------------------------------------------------------------
@pytest.mark.parametrize("bits", [8, 4, 3])
def test_quantize_codes_scales_and_round_trip_error(bits: int) -> None:
    y = torch.randn(200, 64, generator=gen(bits)) * torch.rand(200, 1, generator=gen(1)) * 30
    y[0] = 0.0
    codes, scales = quantize(y, bits)
    assert codes.dtype == torch.uint8 and int(codes.max()) <= 2**bits - 1
    assert scales.dtype == torch.float16 and scales.shape == (200,)
    back = dequantize(codes, scales, bits)
    assert torch.equal(back[0], torch.zeros(64)) and float(scales[0]) == 0.0
    step = scales.float()[:, None]
    if bits in STEP_PER_RMS:
        torch.testing.assert_close(
            scales.float(), (STEP_PER_RMS[bits] * y.pow(2).mean(-1).sqrt()).half().float()
        )
        inside = y.abs() <= center(bits) * step
        assert ((back - y).abs() <= step / 2 + 1e-4)[inside].all()
        assert inside.float().mean() > 0.9  # clipping touches only the tails
    else:
        torch.testing.assert_close(scales.float(), (y.abs().amax(-1) / center(bits)).half().float())
        # every value within half a step (a hair more where the scale rounded down)
        assert ((back - y).abs() <= step * 0.5005 + 1e-4).all()


@pytest.mark.parametrize("bits", [8, 4, 3])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_pack_round_trips_in_the_documented_positions(bits: int, head_dim: int) -> None:
    codes = torch.randint(
        0, 2**bits, (6, 3, head_dim), generator=gen(head_dim + bits), dtype=torch.uint8
    )
    packed = pack(codes, bits)
    assert packed.shape == (6, 3, code_bytes(head_dim, bits)) == (6, 3, head_dim * bits // 8)
    assert torch.equal(unpack(packed, bits, head_dim), codes)
    flat_codes, flat = codes.reshape(-1, head_dim).int(), packed.reshape(-1, packed.shape[-1]).int()
    for i in (0, 1, head_dim // 2 - 1, head_dim // 2, head_dim - 1):
        if bits == 8:
            got = flat[:, i]
        elif bits == 4:
            half = head_dim // 2
            got = (flat[:, i % half] >> (4 * (i // half))) & 15
        else:
            quarter, eighth = head_dim // 4, head_dim // 8
            low = (flat[:, i % quarter] >> (2 * (i // quarter))) & 3
            high = (flat[:, quarter + i % eighth] >> (i // eighth)) & 1
            got = low | (high << 2)
        assert torch.equal(got, flat_codes[:, i]), i


def test_head_sizes_must_be_multiples_of_eight() -> None:
    with pytest.raises(ValueError, match="head size 60 is not a multiple of 8"):
        code_bytes(60, 4)
    with pytest.raises(ValueError, match="bits must be one of 8, 4, 3"):
        quantize(torch.zeros(2, 64), 5)


# -- the cache -----------------------------------------------------------------------------------
def make_cache(
    codec: TurboKVCodec,
    num_kv_heads: int = 2,
    head_dim: int = 64,
    block_size: int = 4,
    num_blocks: int = 6,
    layer: AttentionLayer | None = None,
) -> kv_cache.LayerKVCache:
    return kv_cache.allocate_layer(
        codec,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=block_size,
        num_blocks=num_blocks,
        model_dtype=torch.bfloat16,
        layer=layer,
    )


@pytest.mark.parametrize("codec_cls", CODECS)
def test_layout_and_capacity_against_a_16_bit_cache(codec_cls: type[TurboKVCodec]) -> None:
    codec = codec_cls()
    cache = make_cache(codec)
    b = codec.bits
    assert {n: (tuple(t.shape), t.dtype) for n, t in cache.tensors.items()} == {
        "k_codes": ((6, 4, 2, 8 * b), torch.uint8),
        "k_scales": ((6, 4, 2), torch.float16),
        "v_codes": ((6, 4, 2, 8 * b), torch.uint8),
        "v_scales": ((6, 4, 2), torch.float16),
        "k_offset": ((2, 64), torch.float32),
        "k_smooth": ((2, 64), torch.float32),
        "rotation": ((64, 64), torch.float32),
    }
    assert torch.equal(cache["rotation"], rotation_matrix(64, 0))
    assert torch.equal(cache["k_smooth"], torch.ones(2, 64))
    for head_dim in (64, 128):
        cost = kv_cache.footprint(
            codec,
            [AttentionLayer(0, 8, 2, head_dim, 0.1)],
            block_size=16,
            model_dtype=torch.bfloat16,
        )
        assert cost.vs_bf16 == pytest.approx(16 / (b + 16 / head_dim))
    floor = {8: 1.9, 4: 3.5, 3: 4.5}[b]
    assert (
        kv_cache.footprint(
            codec, [AttentionLayer(0, 8, 2, 64, 0.1)], block_size=16, model_dtype=torch.bfloat16
        ).vs_bf16
        >= floor
    )


def test_settings_leave_parts_of_the_format_out_or_add_them() -> None:
    config = make_config(
        {
            "plugins": {
                "settings": {
                    "tallow-kvcache-turboquant": {
                        "rotation": False,
                        "center_keys": False,
                        "smooth_keys": False,
                    }
                }
            }
        }
    )
    cache = make_cache(Turbo4KVCodec(config))
    assert set(cache.tensors) == {"k_codes", "k_scales", "v_codes", "v_scales"}
    config = make_config(
        {"plugins": {"settings": {"tallow-kvcache-turboquant": {"center_values": True}}}}
    )
    assert "v_offset" in make_cache(Turbo4KVCodec(config))


@pytest.mark.parametrize("codec_cls", CODECS)
@pytest.mark.parametrize("head_dim", [64, 80, 96])
def test_encode_decode_round_trip(codec_cls: type[TurboKVCodec], head_dim: int) -> None:
    """Each row comes back at its slot within the quantizer's error; slot -1 writes nothing;
    other slots are untouched."""
    codec = codec_cls(VALUES_CENTERED)
    cache = make_cache(codec, head_dim=head_dim)
    for name in ("k_offset", "v_offset"):
        cache[name].normal_(generator=gen(7))
    cache["k_smooth"].uniform_(0.5, 2.0, generator=gen(8))
    k = torch.randn(5, 2, head_dim, generator=gen(1)).to(torch.bfloat16) * 4
    v = torch.randn(5, 2, head_dim, generator=gen(2)).to(torch.bfloat16)
    slots = torch.tensor([9, 0, -1, 4, 22])
    before = cache.clone()
    codec.encode(cache, k, v, slots)
    got_k, got_v = codec.decode(cache, torch.arange(6))
    tolerance = {8: 0.02, 4: 0.2, 3: 0.45}[codec.bits]
    for row, slot in ((0, 9), (1, 0), (3, 4), (4, 22)):
        for got, want in ((got_k[slot], k[row].float()), (got_v[slot], v[row].float())):
            rel = float((got - want).norm() / want.norm())
            assert rel < tolerance, (row, rel)
    written = torch.zeros(24, dtype=torch.bool)
    written[[9, 0, 4, 22]] = True
    for name in ("k_codes", "v_scales"):
        flat_now, flat_before = cache[name].flatten(0, 1), before[name].flatten(0, 1)
        assert torch.equal(flat_now[~written], flat_before[~written])


def random_attention_case(offset: float) -> tuple[torch.Tensor, ...]:
    """q [T, 8, 64], k, v [T, 2, 64] whose keys share a large offset along a few channels
    and whose queries read other channels most, as in Qwen2 models' first layers."""
    g = gen(11)
    t = 48
    k = torch.randn(t, 2, 64, generator=g)
    k[..., :4] += offset
    k[..., 40:] *= 6.0
    q = torch.randn(t, 8, 64, generator=g) * 3
    q[..., 40:] *= 0.1
    v = torch.randn(t, 2, 64, generator=g) + 2.0
    return q, k, v


def paged_error(
    codec: TurboKVCodec, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, calibrate: bool
) -> float:
    t = k.shape[0]
    layer = AttentionLayer(0, 8, 2, 64, 0.125)
    cache = make_cache(codec, block_size=16, num_blocks=3, layer=layer)
    if calibrate:
        codec.calibrate(cache, q, k, v)
    table = torch.tensor([[2, 0, 1]])
    pos = torch.arange(t)
    codec.encode(cache, k, v, table[0, pos // 16] * 16 + pos % 16)
    out = paged_attention_ref(
        q, cache, query_start_loc=[0, t], seq_lens=[t], block_tables=table, scale=0.125
    )
    exact = attention_ref(q, k, v, scale=0.125, context_len=t)
    return float((out - exact).norm() / exact.norm())


def test_calibration_is_exact_for_attention_and_makes_it_more_accurate() -> None:
    q, k, v = random_attention_case(offset=40.0)
    codec = Turbo4KVCodec(VALUES_CENTERED)
    layer = AttentionLayer(0, 8, 2, 64, 0.125)
    cache = make_cache(codec, layer=layer)
    codec.calibrate(cache, q, k, v)
    torch.testing.assert_close(cache["k_offset"], k.mean(0))
    torch.testing.assert_close(cache["v_offset"], v.mean(0))
    smooth = cache["k_smooth"]
    torch.testing.assert_close(smooth.pow(2).mean(-1), torch.ones(2))
    assert float(smooth[:, 40:].mean()) > 2 * float(smooth[:, 4:40].mean())
    # Exactness: with 8-bit codes the transforms change nothing but rounding.
    assert paged_error(Turbo8KVCodec(VALUES_CENTERED), q, k, v, calibrate=True) < 0.01
    # Accuracy: calibrated 4-bit attention is several times closer to the exact one.
    plain, tuned = (paged_error(Turbo4KVCodec(), q, k, v, calibrate=c) for c in (False, True))
    assert tuned < plain / 3, (plain, tuned)


def test_a_softcapped_layer_keeps_a_zero_key_offset() -> None:
    q, k, v = random_attention_case(offset=40.0)
    codec = Turbo4KVCodec()
    cache = make_cache(codec, layer=AttentionLayer(0, 8, 2, 64, 0.125, logit_softcap=30.0))
    codec.calibrate(cache, q, k, v)
    assert torch.equal(cache["k_offset"], torch.zeros(2, 64))
    assert not torch.equal(cache["k_smooth"], torch.ones(2, 64))  # smoothing stays exact
