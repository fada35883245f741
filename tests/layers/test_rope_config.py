"""Rotary settings from HF configs, GPT-NeoX's rotary_pct / rotary_emb_base included, against
transformers' GPT-NeoX rotary embedding."""

from __future__ import annotations

import pytest
import torch

from tallow.layers import rope_from_config, rope_parameters, rotary_dim

transformers = pytest.importorskip("transformers", reason="transformers is the RoPE oracle")


def test_gpt_neox_keys_give_base_and_fraction():
    assert rope_parameters({"rotary_emb_base": 40000, "rotary_pct": 0.25}) == (40000.0, None, 0.25)


def test_newer_spellings_win_over_gpt_neox_keys():
    cfg = {
        "rotary_emb_base": 40000,
        "rotary_pct": 0.25,
        "rope_theta": 500.0,
        "partial_rotary_factor": 0.5,
    }
    assert rope_parameters(cfg) == (500.0, None, 0.5)
    cfg = {
        "rotary_emb_base": 40000,
        "rotary_pct": 0.25,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 7.0,
            "partial_rotary_factor": 1.0,
        },
    }
    assert rope_parameters(cfg) == (7.0, None, 1.0)


def test_defaults_without_any_rope_key():
    assert rope_parameters({}) == (10000.0, None, 1.0)


@pytest.mark.parametrize(
    "head_dim,pct,expected", [(64, 0.25, 16), (80, 0.4, 32), (128, 1.0, 128), (96, 0.25, 24)]
)
def test_rotary_dim_rounds_like_transformers(head_dim, pct, expected):
    assert rotary_dim(head_dim, pct) == expected == int(head_dim * pct)


@pytest.mark.parametrize(
    "pct,match",
    [
        (0.0, r"must be in \(0, 1\]"),
        (1.5, r"must be in"),
        (-0.25, r"must be in"),
        (0.01, "gives 0 rotated"),
    ],
)
def test_rotary_dim_refuses_unusable_fractions(pct, match):
    with pytest.raises(ValueError, match=match):
        rotary_dim(64, pct)


def test_odd_rotary_dim_is_refused():
    with pytest.raises(ValueError, match="gives 3 rotated features; it must be even"):
        rotary_dim(12, 0.25)


def test_matches_transformers_gpt_neox_rotary():
    from transformers.models.gpt_neox import modeling_gpt_neox as neox

    config = transformers.GPTNeoXConfig(
        hidden_size=128,
        num_attention_heads=4,
        rotary_pct=0.25,
        rotary_emb_base=20000,
        max_position_embeddings=64,
    )
    head_dim = 32
    hub_style = {
        "hidden_size": 128,
        "num_attention_heads": 4,
        "rotary_pct": 0.25,
        "rotary_emb_base": 20000,
        "max_position_embeddings": 64,
    }
    ours = rope_from_config(hub_style, head_dim)
    assert (ours.rotary_dim, ours.base, ours.max_position) == (8, 20000.0, 64)
    # what transformers itself writes to config.json reads the same
    saved = rope_from_config(config.to_dict(), head_dim)
    torch.testing.assert_close(saved.inv_freq, ours.inv_freq, rtol=0, atol=0)

    ref = neox.GPTNeoXRotaryEmbedding(config)
    torch.testing.assert_close(ours.inv_freq, ref.inv_freq.float(), rtol=1e-6, atol=0)
    positions = torch.tensor([0, 1, 5, 17, 63])
    q = torch.randn(len(positions), 4 * head_dim)
    k = torch.randn(len(positions), 4 * head_dim)
    rq, rk = ours(positions, q.clone(), k.clone())
    cos, sin = ref(q, positions[None])
    hq, hk = (t.view(1, len(positions), 4, head_dim).transpose(1, 2) for t in (q, k))
    eq, ek = neox.apply_rotary_pos_emb(hq, hk, cos, sin)
    torch.testing.assert_close(rq, eq.transpose(1, 2).reshape_as(q), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rk, ek.transpose(1, 2).reshape_as(k), rtol=1e-5, atol=1e-5)
    # only the first rotary_dim features of each head moved
    unrotated = q.view(-1, 4, head_dim)[..., 8:]
    torch.testing.assert_close(rq.view(-1, 4, head_dim)[..., 8:], unrotated, rtol=0, atol=0)


def test_max_position_default_and_scaling_pass_through():
    rope = rope_from_config({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, 16)
    assert rope.max_position == 2048 and rope.cache_len == 4096
