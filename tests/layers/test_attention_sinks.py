"""Attention sinks (gpt-oss) in the core's attention contract: the torch reference against
transformers' own sink attention, and the layer's sinks parameter (its loading and sharding)."""

from __future__ import annotations

import pytest
import torch

from tallow.kernels.attention_ref import attention_ref
from tallow.layers import Attention


def _transformers_sink_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sinks: torch.Tensor,
    scale: float,
    window: int | None,
) -> torch.Tensor:
    """transformers' gpt-oss eager attention on one sequence (q, k, v [S, H, D])."""
    gpt_oss = pytest.importorskip(
        "transformers.models.gpt_oss.modeling_gpt_oss", reason="transformers is the oracle"
    )

    class Module(torch.nn.Module):
        training = False

    module = Module()
    module.num_key_value_groups = q.shape[1] // k.shape[1]
    module.sinks = sinks
    n = q.shape[0]
    pos = torch.arange(n)
    allowed = pos[None, :] <= pos[:, None]
    if window:
        allowed &= pos[:, None] - pos[None, :] < window
    mask = torch.zeros(n, n).masked_fill(~allowed, float("-inf"))[None, None]
    out, _ = gpt_oss.eager_attention_forward(
        module,
        q.transpose(0, 1)[None],
        k.transpose(0, 1)[None],
        v.transpose(0, 1)[None],
        mask,
        scale,
    )
    return out[0]


@pytest.mark.parametrize("window", [None, 5])
def test_reference_matches_transformers(window: int | None) -> None:
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(13, 4, 16, generator=gen)
    k = torch.randn(13, 2, 16, generator=gen)
    v = torch.randn(13, 2, 16, generator=gen)
    sinks = torch.randn(4, generator=gen) * 2
    ref = _transformers_sink_attention(q, k, v, sinks, 0.25, window)
    ours = attention_ref(q, k, v, scale=0.25, context_len=13, sliding_window=window, sinks=sinks)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
    # the sink takes weight away: without it the output differs
    plain = attention_ref(q, k, v, scale=0.25, context_len=13, sliding_window=window)
    assert (plain - ours).abs().max() > 1e-2


def test_sinks_of_minus_infinity_change_nothing() -> None:
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(6, 2, 8, generator=gen) for _ in range(3))
    none = torch.full((2,), float("-inf"))
    torch.testing.assert_close(
        attention_ref(q, k, v, scale=0.3, context_len=6, sinks=none),
        attention_ref(q, k, v, scale=0.3, context_len=6),
    )


def test_layer_keeps_its_ranks_heads_of_the_checkpoint_sinks() -> None:
    attn = Attention(0, num_heads=4, num_kv_heads=2, head_dim=8, sinks=True, sinks_head_offset=4)
    assert attn.layer.sinks is attn.sinks
    full = torch.arange(8, dtype=torch.bfloat16)
    attn.sinks.weight_loader(attn.sinks, full)
    assert attn.sinks.dtype == torch.float32
    assert attn.layer.sinks.tolist() == [4.0, 5.0, 6.0, 7.0]
    with pytest.raises(ValueError, match="one value per query head"):
        attn.sinks.weight_loader(attn.sinks, torch.zeros(6))
    # equality and hashing of the layer's facts ignore the tensor
    assert hash(attn.layer) == hash(Attention(0, 4, 2, 8, sinks=True).layer)


def test_layer_without_sinks_has_none() -> None:
    attn = Attention(0, 4, 2, 8)
    assert attn.sinks is None and attn.layer.sinks is None
    assert "sinks" not in dict(attn.named_parameters())
