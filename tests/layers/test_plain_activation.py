"""tallow.layers.get_act against transformers' ACT2FN, name by name."""

from __future__ import annotations

import pytest
import torch

from tallow.layers import PLAIN_ACTIVATIONS, get_act

activations = pytest.importorskip(
    "transformers.activations", reason="transformers' ACT2FN is the oracle"
)


@pytest.mark.parametrize("name", PLAIN_ACTIVATIONS)
def test_matches_transformers(name):
    if name not in activations.ACT2FN:
        pytest.skip(f"this transformers version has no {name!r}")
    x = torch.linspace(-12.0, 12.0, 2001, dtype=torch.float64).float()
    ours = get_act(name)
    torch.testing.assert_close(ours(x), activations.ACT2FN[name](x), rtol=1e-6, atol=1e-6)
    assert ours.kind == name


def test_the_names_pythia_and_gpt2_use_are_served():
    assert {"gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu"} <= set(PLAIN_ACTIVATIONS)


def test_exact_and_tanh_gelu_are_different_functions():
    x = torch.linspace(-4, 4, 101)
    assert (get_act("gelu")(x) - get_act("gelu_new")(x)).abs().max() > 1e-4


def test_keeps_dtype_and_shape():
    x = torch.randn(3, 5, 8, dtype=torch.bfloat16)
    y = get_act("gelu")(x)
    assert y.dtype == torch.bfloat16 and y.shape == x.shape


@pytest.mark.parametrize("name", ["geluu", "prelu", "", None])
def test_unknown_names_are_refused_with_the_list(name):
    with pytest.raises(
        ValueError,
        match=r"hidden_act .* is not supported \(expected one of "
        r".*gelu, gelu_10",
    ):
        get_act(name)
