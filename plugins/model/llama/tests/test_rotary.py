"""tallow.layers rotary embeddings against transformers' RoPE math, variant by variant."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is the RoPE oracle")
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.llama.modeling_llama import (  # noqa: E402
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

from tallow.layers import compute_inv_freq, get_rope, rope_parameters  # noqa: E402

BASE = dict(hidden_size=256, num_attention_heads=4, num_hidden_layers=1, vocab_size=8)
VARIANTS = {
    "linear": dict(rope_scaling={"rope_type": "linear", "factor": 4.0}),
    "llama3": dict(
        rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 512,
        },
    ),
    "yarn": dict(
        max_position_embeddings=4096,
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
    ),
    "yarn-mscale": dict(
        max_position_embeddings=4096,
        rope_scaling={
            "rope_type": "yarn",
            "factor": 8.0,
            "original_max_position_embeddings": 512,
            "mscale": 0.707,
            "mscale_all_dim": 1.0,
            "beta_fast": 16,
            "beta_slow": 2,
            "truncate": False,
        },
    ),
    "yarn-legacy-type-key": dict(
        max_position_embeddings=2048,
        rope_scaling={"type": "yarn", "factor": 2.0, "original_max_position_embeddings": 1024},
    ),
    "partial-linear": dict(
        partial_rotary_factor=0.5, rope_scaling={"rope_type": "linear", "factor": 2.0}
    ),
}


def _hf_config(**kw):
    return transformers.LlamaConfig(**{**BASE, "max_position_embeddings": 2048, **kw})


@pytest.mark.parametrize("name", list(VARIANTS))
def test_inv_freq_matches_transformers(name):
    cfg = _hf_config(**VARIANTS[name])
    kind = cfg.rope_parameters["rope_type"]
    ref_inv, ref_scale = ROPE_INIT_FUNCTIONS[kind](cfg, None)
    # read back the way a model plugin sees it: the saved config.json dict
    base, scaling, partial = rope_parameters(cfg.to_dict())
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    inv, scale = compute_inv_freq(
        int(head_dim * partial), cfg.max_position_embeddings, base, scaling
    )
    torch.testing.assert_close(inv, ref_inv.float(), rtol=1e-6, atol=0)
    assert scale == pytest.approx(ref_scale, rel=1e-12)
    if kind != "linear":  # the variants do change the frequencies
        assert not torch.allclose(inv, compute_inv_freq(inv.numel() * 2, 2048, base, None)[0])


def test_legacy_rope_scaling_is_read():
    base, scaling, partial = rope_parameters(
        {"rope_theta": 1e6, "rope_scaling": {"type": "linear", "factor": 2.0}}
    )
    assert (base, scaling, partial) == (1e6, {"rope_type": "linear", "factor": 2.0}, 1.0)
    assert rope_parameters({}) == (10000.0, None, 1.0)


def test_unknown_rope_type_is_named():
    with pytest.raises(ValueError, match="'spiral' is not supported"):
        get_rope(64, 64, 128, 10000.0, {"rope_type": "spiral", "factor": 2.0})
    with pytest.raises(ValueError, match="needs 'low_freq_factor'"):
        get_rope(
            64, 64, 128, 10000.0, {"rope_type": "llama3", "factor": 2.0, "high_freq_factor": 4.0}
        )


@pytest.mark.parametrize("name", ["default", "llama3", "yarn"])
def test_rotation_matches_transformers(name):
    """q and k rotated by get_rope equal transformers' rotary embedding + apply_rotary_pos_emb."""
    cfg = _hf_config(**VARIANTS.get(name, {}))
    hf_rope = LlamaRotaryEmbedding(cfg)
    head_dim, heads, kv_heads, n = 64, 4, 2, 37
    gen = torch.Generator().manual_seed(0)
    positions = torch.randint(0, 2000, (n,), generator=gen)
    q = torch.randn(n, heads * head_dim, generator=gen)
    k = torch.randn(n, kv_heads * head_dim, generator=gen)
    cos, sin = hf_rope(q, positions[None])
    ref_q, ref_k = apply_rotary_pos_emb(
        q.view(1, n, heads, head_dim), k.view(1, n, kv_heads, head_dim), cos, sin, unsqueeze_dim=2
    )
    base, scaling, _ = rope_parameters(cfg.to_dict())
    rope = get_rope(head_dim, head_dim, cfg.max_position_embeddings, base, scaling)
    out_q, out_k = rope(positions, q, k)
    torch.testing.assert_close(out_q, ref_q.reshape(n, -1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out_k, ref_k.reshape(n, -1), rtol=1e-5, atol=1e-5)


def test_dynamic_ntk_grows_the_base_with_the_sequence():
    cfg = _hf_config(
        max_position_embeddings=64, rope_scaling={"rope_type": "dynamic", "factor": 2.0}
    )
    base, scaling, _ = rope_parameters(cfg.to_dict())
    rope = get_rope(64, 64, 64, base, scaling)
    q = torch.randn(100, 64)
    for seq_len in (40, 64, 100):  # below, at and above max_position_embeddings
        ref_inv, _ = ROPE_INIT_FUNCTIONS["dynamic"](cfg, None, seq_len=seq_len)
        positions = torch.arange(seq_len)
        ours, _ = rope(positions, q[:seq_len], q[:seq_len, :64])
        freqs = positions[:, None].float() * ref_inv[None]
        cos, sin = freqs.cos(), freqs.sin()
        x1, x2 = q[:seq_len, :32], q[:seq_len, 32:]
        ref = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


def test_gptj_style_and_partial_rotary_against_complex_multiplication():
    """Interleaved pairs rotate like complex numbers; features past rotary_dim are untouched."""
    head_dim, rotary_dim, n = 32, 16, 9
    rope = get_rope(head_dim, rotary_dim, 64, 10000.0, None, is_neox_style=False)
    gen = torch.Generator().manual_seed(1)
    positions = torch.randint(0, 64, (n,), generator=gen)
    x = torch.randn(n, 2 * head_dim, generator=gen)
    out, _ = rope(positions, x, x.clone())
    inv = 1.0 / 10000.0 ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim)
    angles = positions[:, None].float() * inv[None]
    xh = x.view(n, 2, head_dim)
    rot = torch.view_as_complex(xh[..., :rotary_dim].reshape(n, 2, -1, 2).contiguous())
    rot = rot * torch.polar(torch.ones_like(angles), angles)[:, None]
    ref = torch.cat(
        (torch.view_as_real(rot).reshape(n, 2, rotary_dim), xh[..., rotary_dim:]), dim=-1
    )
    torch.testing.assert_close(out, ref.reshape(n, -1), rtol=1e-5, atol=1e-5)


def test_freq_factors_divide_the_frequencies():
    rope = get_rope(16, 16, 32, 10000.0)
    before = rope.inv_freq.clone()
    factors = torch.tensor([1.0, 2.0, 4.0, 8.0, 1.0, 1.0, 3.0, 1.0])
    rope.set_freq_factors(factors)
    torch.testing.assert_close(rope.inv_freq, before / factors)
    t = torch.arange(32).float()[:, None] * rope.inv_freq[None]
    torch.testing.assert_close(rope.cos_sin_cache, torch.cat((t.cos(), t.sin()), -1))
    with pytest.raises(ValueError, match="expected 8"):
        rope.set_freq_factors(torch.ones(5))
