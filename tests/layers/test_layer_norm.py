"""tallow.layers.LayerNorm against torch.nn.LayerNorm (what transformers builds)."""

from __future__ import annotations

import pytest
import torch

from tallow.layers import BuildContext, LayerNorm


def _pair(hidden: int, bias: bool, seed: int = 0) -> tuple[LayerNorm, torch.nn.LayerNorm]:
    gen = torch.Generator().manual_seed(seed)
    ours = LayerNorm(hidden, eps=1e-5, bias=bias)
    ref = torch.nn.LayerNorm(hidden, eps=1e-5, bias=bias)
    with torch.no_grad():
        w = 1.0 + 0.3 * torch.randn(hidden, generator=gen)
        ours.weight.copy_(w)
        ref.weight.copy_(w)
        if bias:
            b = 0.5 * torch.randn(hidden, generator=gen)
            ours.bias.copy_(b)
            ref.bias.copy_(b)
    return ours, ref


@pytest.mark.parametrize("bias", [True, False])
def test_matches_torch_layer_norm(bias):
    ours, ref = _pair(48, bias)
    x = 3.0 * torch.randn(7, 48) + 1.5
    torch.testing.assert_close(ours(x), ref(x), rtol=0, atol=0)


def test_parameters_are_named_like_torch_so_checkpoint_names_map_one_to_one():
    ours, ref = _pair(16, True)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in ref.named_parameters()]
    assert [n for n, _ in LayerNorm(16, bias=False).named_parameters()] == ["weight"]
    ours.load_state_dict(ref.state_dict())  # strict: same names, same shapes


def test_residual_form_returns_the_sum_as_the_next_residual():
    ours, ref = _pair(32, True, seed=3)
    x, residual = torch.randn(5, 32), torch.randn(5, 32)
    out, new_residual = ours(x, residual)
    torch.testing.assert_close(new_residual, x + residual, rtol=0, atol=0)
    torch.testing.assert_close(out, ref(x + residual), rtol=0, atol=0)


def test_built_in_the_context_dtype_and_tracks_float32_in_bfloat16():
    ours, ref = _pair(64, True, seed=5)
    low = LayerNorm(64, bias=True, build=BuildContext(dtype=torch.bfloat16))
    assert low.weight.dtype == low.bias.dtype == torch.bfloat16
    low.load_state_dict(ours.state_dict())
    x = torch.randn(4, 64)
    torch.testing.assert_close(low(x.bfloat16()).float(), ref(x), rtol=2e-2, atol=5e-2)
