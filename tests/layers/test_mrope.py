"""M-RoPE: with equal positions on its three axes it is plain RoPE; with a multimodal step's
positions each frequency section turns with its axis (transformers' recomposition)."""

from __future__ import annotations

import pytest
import torch

from tallow.layers import MRotaryEmbedding, MultimodalStep, get_rope, multimodal_step


def _reference(
    q: torch.Tensor, pos3: torch.Tensor, sections: list[int], head_dim: int, base: float
) -> torch.Tensor:
    """transformers' Qwen2.5-VL rotary: freqs per axis, sections picked in turn, neox."""
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    freqs = pos3[..., None].float() * inv  # [3, T, D/2]
    parts = freqs.split(sections, dim=-1)
    freq = torch.cat([m[i % 3] for i, m in enumerate(parts)], dim=-1)
    emb = torch.cat([freq, freq], dim=-1)
    cos, sin = emb.cos()[:, None], emb.sin()[:, None]
    x = q.view(q.shape[0], -1, head_dim)
    x1, x2 = x.chunk(2, dim=-1)
    return (x * cos + torch.cat([-x2, x1], dim=-1) * sin).reshape(q.shape)


def test_equal_axes_is_plain_rope() -> None:
    rope = MRotaryEmbedding(16, [2, 3, 3], 64, 10000.0)
    plain = get_rope(16, 16, 64, 10000.0)
    pos = torch.tensor([0, 3, 7, 20])
    q, k = torch.randn(4, 32), torch.randn(4, 16)
    for a, b in zip(rope(pos, q, k), plain(pos, q, k)):
        torch.testing.assert_close(a, b)


def test_step_positions_turn_each_section_with_its_axis() -> None:
    rope = MRotaryEmbedding(16, [2, 3, 3], 64, 10000.0)
    pos3 = torch.tensor([[0, 1, 5, 5, 5, 5, 9], [0, 1, 5, 5, 6, 6, 9], [0, 1, 5, 6, 5, 6, 9]])
    q, k = torch.randn(7, 32), torch.randn(7, 16)
    with multimodal_step(MultimodalStep(positions=pos3)):
        rq, rk = rope(pos3[0], q, k)
    torch.testing.assert_close(rq, _reference(q, pos3, [2, 3, 3], 16, 10000.0))
    torch.testing.assert_close(rk, _reference(k, pos3, [2, 3, 3], 16, 10000.0))
    # the h and w axes matter: the plain rotation of the temporal positions differs
    assert not torch.allclose(rq, rope(pos3[0], q, k)[0])


def test_sections_must_cover_half_the_head() -> None:
    with pytest.raises(ValueError, match="must add up to head_dim / 2 = 8"):
        MRotaryEmbedding(16, [2, 3, 2], 64, 10000.0)
