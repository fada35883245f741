"""GPTQ (tallow_quant_int4.gptq) by its defining properties: with uncorrelated inputs (an
identity Hessian) no error is worth spreading, so it rounds exactly as round to nearest does;
with correlated inputs its output error over those inputs is far below round to nearest's
(act-order, with its groups fitted up front, lower still); inputs that never fire get zero weight; a Hessian of fewer samples
than columns still factors (damping); the result is a valid weight of the layout and the
same on every run."""

from __future__ import annotations

import pytest
import torch

from tallow_quant_int4.gptq import float_target, gptq
from tallow_quant_int4.isq import Recipe, quantize_rtn
from tallow_quant_int4.layout import dequantize

CPU = torch.device("cpu")


def _weight(rows: int = 64, cols: int = 256, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))


def _inputs(n: int = 4096, cols: int = 256, rank: int = 24, seed: int = 1) -> torch.Tensor:
    """Inputs that mostly live in a few directions, with uneven scales per feature."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, rank, generator=g) @ torch.randn(rank, cols, generator=g)
    x = x + 0.1 * torch.randn(n, cols, generator=g)
    return x * torch.rand(cols, generator=g).add(0.2)


@pytest.mark.parametrize("symmetric", [True, False])
def test_an_identity_hessian_rounds_to_nearest(symmetric):
    w = _weight()
    got = gptq(w, torch.eye(256), bits=4, group=128, symmetric=symmetric)
    rtn = quantize_rtn(w, CPU, Recipe(method="rtn", symmetric=symmetric))
    assert torch.equal(got.codes, rtn.codes) and torch.equal(got.scales, rtn.scales)
    assert (got.zeros is None) == symmetric
    if not symmetric:
        assert torch.equal(got.zeros, rtn.zeros)


@pytest.mark.parametrize("symmetric", [True, False])
def test_correlated_inputs_keep_the_outputs_much_closer(symmetric):
    w, x = _weight(), _inputs()
    h = x.T @ x

    def output_error(decoded: torch.Tensor) -> float:
        return float(((x @ (decoded - w).T) ** 2).mean())

    rtn = output_error(dequantize(quantize_rtn(w, CPU, Recipe(method="rtn",
                                                             symmetric=symmetric))))
    plain = gptq(w, h, bits=4, group=128, symmetric=symmetric)
    ordered = gptq(w, h, bits=4, group=128, symmetric=symmetric, act_order=True)
    # act-order keeps the groups consecutive (static groups): no permuted input
    assert plain.perm is None and ordered.perm is None and ordered.group == 128
    assert output_error(dequantize(plain)) < 0.2 * rtn
    assert output_error(dequantize(ordered)) < 0.5 * output_error(dequantize(plain))
    again = gptq(w, h, bits=4, group=128, symmetric=symmetric, act_order=True)
    assert torch.equal(again.codes, ordered.codes) and torch.equal(again.scales, ordered.scales)


def test_dead_inputs_get_zero_weight_and_few_samples_still_factor():
    w, x = _weight(cols=128), _inputs(n=40, cols=128)  # 40 samples for 128 columns
    x[:, 5] = 0.0
    got = gptq(w, x.T @ x, bits=4, group=64, symmetric=False)
    decoded = dequantize(got)
    assert bool((decoded[:, 5] == 0).all())
    assert got.group == 64 and got.scales.dtype == torch.float16
    assert float(((decoded - w) ** 2).mean()) < float((w ** 2).mean())


def test_a_group_must_fit_the_blocks():
    with pytest.raises(ValueError, match="group size 96 must divide"):
        gptq(_weight(cols=192), torch.eye(192), bits=4, group=96, symmetric=True)


def test_the_float_target_is_the_least_squares_weight_over_the_quantized_inputs():
    """``float_target``'s weight maps the quantized model's inputs closest to the float
    layer's outputs over the float inputs (the oracle: torch's least squares), and GPTQ aimed
    at it keeps the quantized layer's outputs closer to the float model's than GPTQ aimed at
    the float weight itself."""
    w, x_float = _weight(), _inputs()
    drift = 0.3 * _inputs(seed=7)  # what quantized earlier layers changed in the inputs
    x_quant = x_float + drift
    h, cross = x_quant.T @ x_quant, x_float.T @ x_quant
    target = float_target(w, h, cross, damp=1e-9)
    oracle = torch.linalg.lstsq(x_quant.double(), (x_float @ w.T).double()).solution.T
    # the same outputs over the quantized inputs (the weights themselves are ill-conditioned)
    want = x_quant.double() @ oracle.T
    torch.testing.assert_close(x_quant.double() @ target.double().T, want, rtol=0,
                               atol=1e-3 * float(want.abs().max()))

    def error(decoded: torch.Tensor) -> float:
        return float(((x_float @ w.T - x_quant @ decoded.T) ** 2).mean())

    # where the inputs agree the damping leaves the weight as it is
    torch.testing.assert_close(float_target(w, h, h), w, rtol=0, atol=1e-6)
    aimed = dequantize(gptq(target, h, bits=4, group=128, symmetric=False))
    plain = dequantize(gptq(w, h, bits=4, group=128, symmetric=False))
    assert error(aimed) < 0.7 * error(plain)
