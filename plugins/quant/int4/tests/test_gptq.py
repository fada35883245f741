"""GPTQ (tallow_quant_int4.gptq) by its defining properties: with uncorrelated inputs (an
identity Hessian) no error is worth spreading, so it rounds exactly as round to nearest does;
with correlated inputs its output error over those inputs is far below round to nearest's
(act-order, with its groups fitted up front, lower still); inputs that never fire get zero weight; a Hessian of fewer samples
than columns still factors (damping); the result is a valid weight of the layout and the
same on every run. The clip search (``clip_search``) never raises a group's error weighted by
the Hessian's diagonal against the unclipped range nor against the unweighted search, and off
it leaves GPTQ as it was; with ``clip_weighting: inverse`` it weights each column by GPTQ's own
cost ``1 / [H^-1]_ii`` over the columns not yet rounded (either column order), which clips a
crafted outlier that the Hessian's diagonal would keep."""

from __future__ import annotations

import pytest
import torch

from tallow_quant_int4 import gptq as gptq_module
from tallow_quant_int4.gptq import float_target, gptq
from tallow_quant_int4.groups import codes_for, fit
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

    rtn = output_error(dequantize(quantize_rtn(w, CPU, Recipe(method="rtn", symmetric=symmetric))))
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
    assert float(((decoded - w) ** 2).mean()) < float((w**2).mean())


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
    torch.testing.assert_close(
        x_quant.double() @ target.double().T, want, rtol=0, atol=1e-3 * float(want.abs().max())
    )

    def error(decoded: torch.Tensor) -> float:
        return float(((x_float @ w.T - x_quant @ decoded.T) ** 2).mean())

    # where the inputs agree the damping leaves the weight as it is
    torch.testing.assert_close(float_target(w, h, h), w, rtol=0, atol=1e-6)
    aimed = dequantize(gptq(target, h, bits=4, group=128, symmetric=False))
    plain = dequantize(gptq(w, h, bits=4, group=128, symmetric=False))
    assert error(aimed) < 0.7 * error(plain)


def _weighted_error(
    v: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, energy: torch.Tensor
) -> torch.Tensor:
    """Each group's squared rounding error, every column weighted by its ``energy``."""
    decoded = (codes_for(v, scale, zero, 4) - zero[..., None]) * scale[..., None]
    return ((decoded - v) ** 2 * energy).sum(-1)


@pytest.mark.parametrize("symmetric", [True, False])
def test_the_weighted_clip_search_never_raises_the_weighted_error(symmetric):
    g = torch.Generator().manual_seed(3)
    # heavy tails, so that clipping pays, and column energies over three decades
    v = torch.randn(256, 4, 128, generator=g) * torch.rand(256, 4, 1, generator=g).add(0.1)
    v = v + 0.5 * torch.randn(256, 4, 128, generator=g) ** 3
    energy = 10.0 ** (3 * torch.rand(4, 128, generator=g))
    searched = _weighted_error(v, *fit(v, 4, symmetric, energy), energy)
    plain = _weighted_error(v, *fit(v, 4, symmetric), energy)
    if symmetric:
        half = 8.0
        scale = (
            torch.maximum(v.amax(-1).clamp(min=0) / (half - 1), (-v).amax(-1).clamp(min=0) / half)
            .half()
            .float()
        )
        zero = torch.full_like(scale, half)
    else:
        lo, hi = v.amin(-1).clamp(max=0), v.amax(-1).clamp(min=0)
        scale = ((hi - lo) / 15).half().float()
        zero = torch.round(-lo / scale).clamp(0, 15)
    full_range = _weighted_error(v, scale, zero, energy)
    assert bool((searched <= full_range * (1 + 1e-6)).all())
    assert bool((searched <= plain * (1 + 1e-6)).all())
    assert float(searched.sum()) < 0.97 * float(full_range.sum())
    assert float(searched.sum()) < float(plain.sum())


@pytest.mark.parametrize("symmetric", [True, False])
def test_gptq_with_a_diagonal_hessian_clips_each_group_by_its_weighted_error(symmetric):
    """A diagonal Hessian leaves no error to spread: each group's output error is its weighted
    rounding error, which the clip search lowers."""
    w = _weight() + 0.4 * _weight(seed=5) ** 3
    energy = 10.0 ** (3 * torch.rand(256, generator=torch.Generator().manual_seed(4)))
    h = torch.diag(energy)

    def output_error(q) -> torch.Tensor:
        return (((dequantize(q) - w) ** 2) * energy).reshape(64, 2, 128).sum(-1)

    plain = output_error(gptq(w, h, bits=4, group=128, symmetric=symmetric))
    for act_order in (False, True):
        clipped = output_error(
            gptq(
                w, h, bits=4, group=128, symmetric=symmetric, act_order=act_order, clip_search=True
            )
        )
        assert bool((clipped <= plain * (1 + 1e-5)).all())
        assert float(clipped.sum()) < float(plain.sum())


def test_without_the_clip_search_gptq_fits_its_groups_unweighted(monkeypatch):
    """Off, every group is fitted as before the setting existed (no column weights), and the
    result is the default's."""
    w, x = _weight(), _inputs()
    h = x.T @ x
    default = gptq(w, h, bits=4, group=128, symmetric=False)
    seen = []

    def spy(v, bits, symmetric, column_weights=None, clip=True):
        seen.append(column_weights)
        return fit(v, bits, symmetric, column_weights, clip)

    monkeypatch.setattr(gptq_module, "fit", spy)
    off = gptq(w, h, bits=4, group=128, symmetric=False, clip_search=False)
    assert seen and all(c is None for c in seen)
    assert torch.equal(off.codes, default.codes) and torch.equal(off.scales, default.scales)
    assert torch.equal(off.zeros, default.zeros)
    seen.clear()
    on = gptq(w, h, bits=4, group=128, symmetric=False, clip_search=True)
    assert seen and all(c is not None and c.shape == (128,) for c in seen)
    assert not torch.equal(on.codes, off.codes)


def _remaining_inverse_costs(h: torch.Tensor, order: torch.Tensor, damp: float) -> torch.Tensor:
    """For each column (natural order), ``1 / [A^-1]_00`` with ``A`` the damped Hessian over
    that column and the columns after it in ``order`` (float64, by plain inversion)."""
    h = h.double()
    h = h + damp * float(torch.diagonal(h).mean()) * torch.eye(h.shape[0], dtype=h.dtype)
    cost = torch.empty(h.shape[0], dtype=torch.float64)
    for k, col in enumerate(order.tolist()):
        rest = order[k:]
        cost[col] = 1.0 / torch.linalg.inv(h[rest][:, rest])[0, 0]
    return cost


@pytest.mark.parametrize("act_order", [False, True])
def test_the_inverse_clip_weighting_weights_each_column_by_gptqs_own_cost(monkeypatch, act_order):
    """With ``clip_weighting: inverse`` the clip search weights each column's error by
    ``1 / [H^-1]_ii`` over the columns not yet rounded (in GPTQ's order), not by ``H_ii``."""
    w, x = _weight(cols=128, rows=16), _inputs(n=512, cols=128)
    h = x.T @ x
    seen = []

    def spy(v, bits, symmetric, column_weights=None, clip=True):
        seen.append(column_weights.reshape(-1))
        return fit(v, bits, symmetric, column_weights, clip)

    monkeypatch.setattr(gptq_module, "fit", spy)
    gptq(
        w,
        h,
        bits=4,
        group=32,
        symmetric=False,
        act_order=act_order,
        damp=0.01,
        clip_search=True,
        clip_weighting="inverse",
    )
    got = torch.cat(seen).double()
    order = (
        torch.argsort(torch.diagonal(h), descending=True, stable=True)
        if act_order
        else torch.arange(128)
    )
    want = _remaining_inverse_costs(h, order, 0.01)
    torch.testing.assert_close(got, want, rtol=2e-3, atol=0)
    # not the Hessian's diagonal up to a factor: correlated inputs pay far less than H_ii
    ratio = want / torch.diagonal(h).double()
    assert float(ratio.max() / ratio.min()) > 10.0


def test_the_inverse_weighting_clips_an_outlier_that_a_later_twin_column_makes_up_for():
    """A crafted group: column 0's input has a near copy in column 1, so GPTQ moves column 0's
    rounding error onto column 1 almost for free; column 0 holds the row's one large weight.
    By the Hessian's diagonal (high energy) that weight must not be clipped; by GPTQ's own cost
    (tiny) clipping it is cheap and buys a finer step for every other column. The inverse
    weighting clips (the minimum of its weighted error over the candidates), and its output
    error over the inputs is the lower one."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(2048, 128, generator=g)
    x[:, 0] = 4.0 * x[:, 1] + 0.01 * torch.randn(2048, generator=g)  # a loud near twin
    h = x.T @ x
    w = 0.1 * torch.randn(8, 128, generator=g)
    w[:, 0] = 1.0  # the outlier
    out = {}
    for weighting in ("hessian", "inverse"):
        q = gptq(
            w, h, bits=4, group=128, symmetric=False, clip_search=True, clip_weighting=weighting
        )
        out[weighting] = (q, float(((x @ (dequantize(q) - w).T) ** 2).mean()))
    ranges = {k: (q.scales.float()[:, 0], q.zeros.float()[:, 0]) for k, (q, _) in out.items()}

    def largest(scale, zero):  # the largest value the group's codes reach
        return (15.0 - zero) * scale

    # by the Hessian's diagonal the outlier keeps its value; by GPTQ's cost it is clipped
    assert bool((largest(*ranges["hessian"]) > 0.97).all())
    assert bool((largest(*ranges["inverse"]) < 0.92).all())
    assert out["inverse"][1] < out["hessian"][1]
    # the inverse weighting's choice minimises the error it weights, over the search's ranges
    cost = _remaining_inverse_costs(h, torch.arange(128), 0.01).float()
    chosen = _weighted_error(w, *ranges["inverse"], cost)
    torch.testing.assert_close(chosen, _weighted_error(w, *fit(w, 4, False, cost), cost))
    assert bool((chosen < _weighted_error(w, *ranges["hessian"], cost)).all())


def test_an_unknown_clip_weighting_is_refused():
    with pytest.raises(ValueError, match="clip_weighting 'diagonal'"):
        gptq(
            _weight(cols=128),
            torch.eye(128),
            bits=4,
            group=128,
            symmetric=False,
            clip_search=True,
            clip_weighting="diagonal",
        )


@pytest.mark.parametrize("symmetric", [True, False])
def test_without_clipping_every_group_takes_its_whole_range(symmetric):
    """``clip: false``: each group's scale (and zero point) cover its weights from the least to
    the largest, in round to nearest and in GPTQ (with an identity Hessian the two agree);
    heavy tails make the default's search clip, so the two differ."""
    w = _weight() + 0.4 * _weight(seed=5) ** 3
    v = w.reshape(64, 2, 128)
    if symmetric:
        whole = torch.maximum(v.amax(-1).clamp(min=0) / 7, (-v).amax(-1).clamp(min=0) / 8)
    else:
        whole = (v.amax(-1).clamp(min=0) - v.amin(-1).clamp(max=0)) / 15
    whole = whole.half().float()
    scale, _ = fit(v, 4, symmetric, clip=False)
    torch.testing.assert_close(scale, whole, rtol=0, atol=0)
    # column weights choose nothing when there is nothing to choose from
    torch.testing.assert_close(
        fit(v, 4, symmetric, torch.rand(128) + 0.1, clip=False)[0], whole, rtol=0, atol=0
    )
    recipe = Recipe(method="rtn", symmetric=symmetric, clip=False)
    rtn = quantize_rtn(w, CPU, recipe)
    assert torch.equal(rtn.scales.float(), whole)
    got = gptq(w, torch.eye(256), bits=4, group=128, symmetric=symmetric, clip=False)
    assert torch.equal(got.codes, rtn.codes) and torch.equal(got.scales, rtn.scales)
    clipped = quantize_rtn(w, CPU, Recipe(method="rtn", symmetric=symmetric))
    assert bool((clipped.scales.float() < whole).any())
    with pytest.raises(ValueError, match="clip_search needs clip"):
        gptq(
            w, torch.eye(256), bits=4, group=128, symmetric=symmetric, clip=False, clip_search=True
        )
