"""Each Triton kernel against its torch reference, on random inputs from the test seed.

On a CUDA machine these run on the GPU at realistic shapes (``pytest -m gpu tests/kernels``).
Under ``TRITON_INTERPRET=1`` (set before triton is imported; ``test_interpreter.py`` launches
this module that way in a subprocess) they run on CPU tensors at tiny shapes, so CI without a
GPU checks the kernels' logic too.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

from tallow.plugin.testing.seeds import base_seed
from tallow.kernels.activation import gelu_tanh_and_mul_ref, silu_and_mul_ref
from tallow.kernels.gumbel import gumbel_argmax_ref, gumbel_noise_ref, row_keys
from tallow.kernels.norm import rms_norm_ref
from tallow.kernels.rotary import rotary_embedding_ref
from tallow.kernels.sampling import LogitEdits, apply_logit_edits_ref

INTERPRET = os.environ.get("TRITON_INTERPRET", "") == "1"
DEVICE = "cpu" if INTERPRET else "cuda"

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not INTERPRET and not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def big_or_tiny(gpu: list, tiny: list) -> list:
    return tiny if INTERPRET else gpu


def rng(seed_hint: int) -> torch.Generator:
    """A generator from the run's test seed (tallow.plugin.testing.seeds); the seed is in failure output."""
    seed = base_seed() ^ seed_hint
    print(f"input seed {seed} (TALLOW_TEST_SEED={base_seed()} replays it)")
    return torch.Generator(device="cpu").manual_seed(seed)


def randn(g: torch.Generator, *shape: int, dtype=torch.float32, scale: float = 1.0):
    return (torch.randn(*shape, generator=g) * scale).to(dtype).to(DEVICE)


def exact_or_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal to the bit, except that Triton's interpreter rounds float32→bfloat16 by
    truncation (the GPU rounds to nearest even), so there bf16 may differ by one unit."""
    if INTERPRET and expected.dtype == torch.bfloat16:
        torch.testing.assert_close(actual, expected, rtol=2**-7, atol=0)
    else:
        assert torch.equal(actual, expected)


def close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """float32 math in a different order (and Triton's fast exp/rsqrt), then one rounding to the
    output dtype: allow a couple of units in its last place."""
    tol = {
        torch.float32: (1e-5, 1e-5),
        torch.float16: (2e-3, 2e-3),
        torch.bfloat16: (1.6e-2, 1.6e-2),
    }[expected.dtype]
    torch.testing.assert_close(actual, expected, rtol=tol[0], atol=tol[1])


# --- RMSNorm ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "n_tokens,hidden",
    big_or_tiny(
        [(1, 4096), (7, 4096), (256, 4096), (3, 896), (33, 5120), (2, 1000)], [(3, 96), (2, 40)]
    ),
)
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("gemma", [False, True])
def test_rms_norm(dtype, n_tokens, hidden, with_residual, gemma):
    from tallow.kernels.norm import rms_norm
    from tallow.kernels._norm_triton import rms_norm_triton

    g = rng(3)
    x = randn(g, n_tokens, hidden, dtype=dtype, scale=3.0)
    w = randn(g, hidden, dtype=dtype)
    res = randn(g, n_tokens, hidden, dtype=dtype) if with_residual else None
    x_before = x.clone()
    expected = rms_norm_ref(x, w, 1e-6, res, gemma)
    actual = rms_norm_triton(x, w, 1e-6, res, gemma)
    assert torch.equal(x, x_before)  # inputs are not modified
    if with_residual:
        close(actual[0], expected[0])
        exact_or_close(actual[1], expected[1])
    else:
        assert actual.shape == expected.shape and actual.dtype == dtype
        close(actual, expected)
    close(
        rms_norm(x, w, 1e-6, res, gemma)[0] if with_residual else rms_norm(x, w, 1e-6),
        expected[0] if with_residual else rms_norm_ref(x, w, 1e-6),
    )


def test_rms_norm_3d_input_and_fp32_weight():
    from tallow.kernels._norm_triton import rms_norm_triton

    g = rng(4)
    x = randn(g, 2, 3, 64, dtype=torch.bfloat16)
    w = randn(g, 64)  # float32 weight with bf16 activations
    close(rms_norm_triton(x, w, 1e-5), rms_norm_ref(x, w, 1e-5))


# --- rotary -------------------------------------------------------------------------------


def cos_sin_cache(max_pos: int, rot: int, base: float = 10000.0) -> torch.Tensor:
    inv_freq = 1.0 / (base ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot))
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float64), inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).float()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "n_tokens,n_q,n_kv,head,rot",
    big_or_tiny(
        [
            (1, 32, 8, 128, 128),
            (17, 32, 8, 128, 128),
            (256, 32, 8, 128, 128),
            (9, 14, 2, 64, 64),
            (5, 8, 8, 96, 48),
        ],
        [(3, 4, 2, 16, 16), (2, 3, 1, 8, 4)],
    ),
)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("inplace", [True, False])
def test_rotary(dtype, n_tokens, n_q, n_kv, head, rot, is_neox, inplace):
    from tallow.kernels.rotary import rotary_embedding
    from tallow.kernels._rotary_triton import rotary_embedding_triton

    g = rng(5)
    max_pos = 4096 if not INTERPRET else 64
    cache = cos_sin_cache(max_pos, rot).to(DEVICE)
    positions = torch.randint(0, max_pos, (n_tokens,), generator=g).to(DEVICE)
    width = (n_q + 2 * n_kv) * head
    qkv = randn(g, n_tokens, width, dtype=dtype, scale=2.0)
    q_cols, k_cols = slice(0, n_q * head), slice(n_q * head, (n_q + n_kv) * head)
    q_ref, k_ref = qkv[:, q_cols].clone(), qkv[:, k_cols].clone()
    exp_q, exp_k = rotary_embedding_ref(positions, q_ref, k_ref, cache, head, is_neox, False)
    before = qkv.clone()
    q, k = qkv[:, q_cols], qkv[:, k_cols]
    out_q, out_k = rotary_embedding_triton(positions, q, k, cache, head, is_neox, inplace)
    close(out_q, exp_q)
    close(out_k, exp_k)
    if inplace:
        assert out_q.data_ptr() == q.data_ptr()  # written through the qkv views
        close(qkv[:, : (n_q + n_kv) * head], torch.cat([exp_q, exp_k], dim=1))
        assert torch.equal(qkv[:, (n_q + n_kv) * head :], before[:, (n_q + n_kv) * head :])
    else:
        assert torch.equal(qkv, before)
    # Dispatch, q only, 3-D layout.
    q3 = before[:, : n_q * head].reshape(n_tokens, n_q, head).clone()
    dq, dk = rotary_embedding(positions, q3, None, cache, head, is_neox, False)
    assert dk is None
    close(dq.reshape(n_tokens, -1), exp_q)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "n_tokens,n_q,n_kv,head,rot",
    big_or_tiny(
        [(1, 16, 8, 128, 128), (300, 32, 8, 128, 128), (7, 14, 2, 64, 32)],
        [(3, 4, 2, 16, 16), (2, 3, 1, 8, 4)],
    ),
)
@pytest.mark.parametrize("is_neox", [True, False])
def test_rotary_with_qk_norm(dtype, n_tokens, n_q, n_kv, head, rot, is_neox):
    """Qwen3's per-head q/k RMSNorm before the rotation: fused into the rotary launch when the
    rotation covers the whole head, a separate norm first otherwise."""
    from tallow.kernels.norm import rms_norm_ref
    from tallow.kernels.rotary import rotary_embedding

    g = rng(10)
    max_pos = 4096 if not INTERPRET else 64
    cache = cos_sin_cache(max_pos, rot).to(DEVICE)
    positions = torch.randint(0, max_pos, (n_tokens,), generator=g).to(DEVICE)
    qkv = randn(g, n_tokens, (n_q + 2 * n_kv) * head, dtype=dtype, scale=2.0)
    weights = (randn(g, head, dtype=dtype, scale=0.5) + 1, randn(g, head, dtype=dtype) + 1)
    q_cols, k_cols = slice(0, n_q * head), slice(n_q * head, (n_q + n_kv) * head)
    # expected: the norm, then the rotation, each as its own reference
    qn = rms_norm_ref(qkv[:, q_cols].reshape(n_tokens, n_q, head), weights[0], 1e-6)
    kn = rms_norm_ref(qkv[:, k_cols].reshape(n_tokens, n_kv, head), weights[1], 1e-6)
    exp_q, exp_k = rotary_embedding_ref(
        positions, qn.reshape(n_tokens, -1), kn.reshape(n_tokens, -1), cache, head, is_neox, False
    )
    before = qkv.clone()
    out_q, out_k = rotary_embedding(
        positions,
        qkv[:, q_cols],
        qkv[:, k_cols],
        cache,
        head,
        is_neox,
        True,
        qk_norm=weights,
        norm_eps=1e-6,
    )

    def close_rounded(actual, expected):
        """Three roundings to the dtype on each side; the interpreter truncates each one."""
        if INTERPRET and dtype == torch.bfloat16:
            torch.testing.assert_close(actual, expected, rtol=3 * 2**-7, atol=3 * 2**-7)
        else:
            close(actual, expected)

    close_rounded(out_q, exp_q)
    close_rounded(out_k, exp_k)
    close_rounded(qkv[:, q_cols], exp_q)  # in place, v untouched
    assert torch.equal(qkv[:, (n_q + n_kv) * head :], before[:, (n_q + n_kv) * head :])
    ref_q, ref_k = rotary_embedding_ref(
        positions,
        before[:, q_cols],
        before[:, k_cols],
        cache,
        head,
        is_neox,
        False,
        qk_norm=weights,
        norm_eps=1e-6,
    )
    close_rounded(ref_q, exp_q)
    close_rounded(ref_k, exp_k)
    with pytest.raises(ValueError, match="qk_norm"):
        rotary_embedding(positions, qkv[:, q_cols], None, cache, head, qk_norm=weights)
    with pytest.raises(ValueError, match="shape"):
        rotary_embedding(
            positions,
            qkv[:, q_cols],
            qkv[:, k_cols],
            cache,
            head,
            qk_norm=(weights[0][:-1], weights[1]),
        )


# --- gated activations --------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape",
    big_or_tiny(
        [(1, 2 * 14336), (33, 2 * 11008), (256, 2 * 4864), (5, 2 * 100)], [(3, 2 * 40), (1, 2 * 7)]
    ),
)
@pytest.mark.parametrize("kind", ["silu", "gelu_tanh"])
def test_gated_activation(dtype, shape, kind):
    from tallow.kernels import activation
    from tallow.kernels._activation_triton import gated_act_triton

    g = rng(6)
    x = randn(g, *shape, dtype=dtype, scale=3.0)
    ref = silu_and_mul_ref if kind == "silu" else gelu_tanh_and_mul_ref
    expected = ref(x)
    close(gated_act_triton(x, kind), expected)
    dispatch = activation.silu_and_mul if kind == "silu" else activation.gelu_tanh_and_mul
    close(dispatch(x.view(1, *shape)), expected.view(1, *expected.shape))
    # extremes: no nan from exp overflow
    extreme = torch.tensor(
        [[-100.0, -20.0, 0.0, 20.0, 100.0, 1.0, 1.0, 1.0, 1.0, 1.0]], device=DEVICE
    ).to(dtype)
    close(gated_act_triton(extreme, kind), ref(extreme))


# --- GEMV (decode-size linear layers) ------------------------------------------------------

_GEMV_SHAPES = big_or_tiny(
    [
        (1, 4096, 6144),
        (1, 14336, 4096),
        (1, 4096, 4100),
        (1, 1000, 300),
        (3, 4096, 512),
        (16, 1024, 1000),
    ],
    [(1, 64, 24), (1, 40, 10), (3, 32, 20)],
)


@pytest.mark.parametrize(
    "dtype,m,k,n",
    [
        (dtype, *shape)
        for dtype in (torch.float16, torch.bfloat16)
        for shape in _GEMV_SHAPES
        # Triton's CPU interpreter computes bf16 tl.dot wrongly (several rows take tl.dot): there
        # the several-row path is checked in fp16 only; the GPU checks both.
        if not (INTERPRET and dtype == torch.bfloat16 and shape[0] > 1)
    ],
)
@pytest.mark.parametrize("with_bias", [False, True])
def test_gemv(dtype, m, k, n, with_bias):
    from tallow.kernels._gemv_triton import gemv_triton
    from tallow.kernels.linear import linear_ref

    g = rng(7)
    x = randn(g, m, k, dtype=dtype)
    w = randn(g, n, k, dtype=dtype, scale=k**-0.5)
    b = randn(g, n, dtype=dtype) if with_bias else None
    expected = linear_ref(x.float(), w.float(), None if b is None else b.float()).to(dtype)
    close(gemv_triton(x, w, b), expected)


_GATED_GEMV_SHAPES = big_or_tiny([(14336, 4096), (3072, 1024), (1000, 300)], [(64, 24), (40, 10)])


@pytest.mark.parametrize("kind", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("d,n", _GATED_GEMV_SHAPES)
def test_gated_gemv_same_bits_as_activation_then_gemv(kind, d, n):
    """The down projection with the activation applied as the GEMV reads its input gives the
    bits of the gated-activation kernel followed by the GEMV, and matches the reference."""
    from tallow.kernels._activation_triton import gated_act_triton
    from tallow.kernels._gemv_triton import gemv_triton
    from tallow.kernels.linear import gated_linear, linear_ref

    g = rng(9)
    x = randn(g, 1, 2 * d, dtype=torch.bfloat16, scale=2.0)
    w = randn(g, n, d, dtype=torch.bfloat16, scale=d**-0.5)
    b = randn(g, n, dtype=torch.bfloat16)
    two_steps = gemv_triton(gated_act_triton(x, kind), w, b)
    fused = gemv_triton(x, w, b, gate=kind)
    assert torch.equal(fused, two_steps)
    assert torch.equal(gated_linear(x.view(1, 1, 2 * d), w, b, kind=kind), fused.view(1, 1, n))
    ref = silu_and_mul_ref if kind == "silu" else gelu_tanh_and_mul_ref
    expected = linear_ref(ref(x).float(), w.float(), b.float())
    # an activation one bf16 ulp off (Triton's exp) moves a sum with cancellation by more than
    # an ulp of the sum itself: the tolerance scales with the output's magnitude
    torch.testing.assert_close(
        fused.float(), expected, rtol=0, atol=2e-2 * expected.abs().max().item()
    )


# e4m3 weights with float32 scales (one per output row, or per 128 x 128 block): llama-3-8b's
# qkv, o, gate_up, down and head on the GPU; shapes with partial blocks and K tails everywhere
_E4M3_GEMV_SHAPES = big_or_tiny(
    [
        (1, 4096, 6144),
        (1, 4096, 4096),
        (1, 4096, 28672),
        (1, 14336, 4096),
        (1, 4096, 128256),
        (1, 4100, 1000),
        (1, 896, 200),
        (4, 4096, 6144),
        (16, 14336, 512),
    ],
    [(1, 256, 24), (1, 200, 136), (1, 40, 10), (3, 256, 40)],
)


def _e4m3_weight(g: torch.Generator, n: int, k: int, blocks: bool):
    """(e4m3 weight, its scales, the float32 weight they stand for)."""
    w = randn(g, n, k, scale=3.0).clamp(-448, 448).to(torch.float8_e4m3fn)
    if blocks:
        s = (torch.rand(-(-n // 128), -(-k // 128), generator=g) * 0.02 + 1e-3).to(DEVICE)
        full = s.repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :k]
    else:
        s = (torch.rand(n, generator=g) * 0.02 + 1e-3).to(DEVICE)
        full = s[:, None]
    return w, s, w.float() * full


@pytest.mark.parametrize("blocks", [False, True], ids=["row_scales", "block_scales"])
@pytest.mark.parametrize("m,k,n", _E4M3_GEMV_SHAPES)
def test_gemv_e4m3_weights_with_scales(blocks, m, k, n):
    """e4m3 weights read by the same GEMV, scaled per row or per 128 x 128 block, equal the
    float32 product of the dequantized weight (up to the order of float32 additions)."""
    from tallow.kernels._gemv_triton import gemv_triton

    g = rng(11)
    w, s, dequantized = _e4m3_weight(g, n, k, blocks)
    # the interpreter computes bf16 tl.dot wrongly: several rows are checked in fp16 there
    dtypes = (
        [torch.float32]
        if INTERPRET and m == 1
        else [torch.float16]
        if INTERPRET
        else [torch.bfloat16, torch.float16]
    )
    for dtype in dtypes:
        x = randn(g, m, k, dtype=dtype)
        b = randn(g, n, dtype=dtype)
        got = gemv_triton(x, w, b, scale=s).double()
        ref = x.double() @ dequantized.double().T + b.double()
        scale = x.double().abs() @ dequantized.double().abs().T + 1e-6
        err = ((got - ref).abs() / scale).max().item()
        assert err <= (1e-5 if dtype == torch.float32 else 1e-2), (dtype, err)


@pytest.mark.parametrize("kind", ["silu", "gelu_tanh"])
def test_gated_gemv_e4m3_same_bits_as_activation_then_gemv(kind):
    from tallow.kernels._activation_triton import gated_act_triton
    from tallow.kernels._gemv_triton import gemv_triton

    g = rng(12)
    d, n = big_or_tiny([(14336, 4096)], [(256, 24)])[0]
    for blocks in (False, True):
        w, s, _ = _e4m3_weight(g, n, d, blocks)
        x = randn(g, 1, 2 * d, dtype=torch.bfloat16, scale=2.0)
        assert torch.equal(
            gemv_triton(x, w, scale=s, gate=kind),
            gemv_triton(gated_act_triton(x, kind), w, scale=s),
        )


def test_gemv_refuses_scales_of_the_wrong_shape():
    from tallow.kernels._gemv_triton import gemv_triton

    g = rng(13)
    w, s, _ = _e4m3_weight(g, 24, 256, False)
    x = randn(g, 1, 256, dtype=torch.bfloat16)
    with pytest.raises(
        ValueError,
        match=r"scale must be \[24\] \(one per output row\) or "
        r"\[1, 2\]",
    ):
        gemv_triton(x, w, scale=s[:10])
    with pytest.raises(ValueError, match="scales must be float32"):
        gemv_triton(x, w, scale=s.half())
    with pytest.raises(ValueError, match="at most 16 rows"):
        gemv_triton(randn(g, 17, 256, dtype=torch.bfloat16), w, scale=s)


def test_gated_linear_dispatch_and_errors(monkeypatch):
    from tallow.kernels import _gemv_triton as gemv_mod
    from tallow.kernels import linear as linear_mod

    calls = []
    real = gemv_mod.gemv_triton
    monkeypatch.setattr(
        gemv_mod, "gemv_triton", lambda *a, **kw: calls.append(kw.get("gate")) or real(*a, **kw)
    )
    g = rng(10)
    w = randn(g, 24, 32, dtype=torch.bfloat16, scale=0.2)
    one = randn(g, 1, 64, dtype=torch.bfloat16)
    linear_mod.gated_linear(one, w, kind="silu")
    assert calls == ["silu"]  # one row: the fused GEMV
    many = randn(g, 3, 64, dtype=torch.bfloat16)
    got = linear_mod.gated_linear(many, w, kind="silu")
    assert "silu" not in calls[1:]  # several rows: activation kernel, then linear
    hidden = silu_and_mul_ref(many).float()
    expected = linear_mod.linear_ref(hidden, w.float())
    # the bf16 intermediate may differ by one unit per element (the interpreter rounds by
    # truncation), which the product carries: bound it by |h| * 2^-7 through |w|, on top of
    # the output's own rounding
    carried = (hidden.abs() * 2**-7) @ w.float().abs().T
    err = (got.float() - expected).abs()
    assert bool((err <= carried + 1.6e-2 * expected.abs() + 1e-3).all()), err.max()
    with pytest.raises(ValueError, match="kind must be one of silu, gelu_tanh"):
        linear_mod.gated_linear(one, w, kind="relu")
    with pytest.raises(ValueError, match="2 x 32 = 64 features"):
        linear_mod.gated_linear(randn(g, 1, 32, dtype=torch.bfloat16), w, kind="silu")


def test_linear_dispatch_takes_gemv_for_one_row_and_keeps_shape(monkeypatch):
    from tallow.kernels import _gemv_triton as gemv_mod
    from tallow.kernels import linear as linear_mod

    calls = []
    real = gemv_mod.gemv_triton
    monkeypatch.setattr(gemv_mod, "gemv_triton", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    g = rng(8)
    x = randn(g, 1, 1, 64, dtype=torch.bfloat16)
    w = randn(g, 24, 64, dtype=torch.bfloat16, scale=0.125)
    out = linear_mod.linear(x, w)
    assert out.shape == (1, 1, 24) and calls == [1]
    close(out, linear_mod.linear_ref(x.float(), w.float()).to(torch.bfloat16))
    many = randn(g, linear_mod.GEMV_MAX_ROWS + 1, 64, dtype=torch.bfloat16)
    linear_mod.linear(many, w)
    assert calls == [1]  # more rows than the GEMV takes: cuBLAS
    with pytest.raises(ValueError, match="input features"):
        linear_mod.linear(randn(g, 1, 63, dtype=torch.bfloat16), w)


# --- argmax ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "rows,n", big_or_tiny([(1, 128256), (7, 151936), (64, 32000), (3, 5)], [(1, 9000), (3, 50)])
)
def test_argmax_rows(dtype, rows, n):
    from tallow.kernels.argmax import argmax_rows, argmax_rows_ref
    from tallow.kernels._argmax_triton import argmax_rows_triton

    g = rng(9)
    x = randn(g, rows, n, dtype=dtype)
    assert torch.equal(argmax_rows_triton(x), argmax_rows_ref(x))
    assert torch.equal(argmax_rows(x), argmax_rows_ref(x))
    # ties go to the first index, across chunk boundaries too; NaN wins like in torch
    x[:, :] = 0
    x[0, n - 1] = x[0, n // 2] = x[0, 1] = 5
    if rows > 1:
        x[1, n // 3] = float("nan")
    assert torch.equal(argmax_rows_triton(x), argmax_rows_ref(x))


# --- sampling -----------------------------------------------------------------------------


def _keys(g: torch.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    seeds = torch.randint(0, 2**62, (n,), generator=g).tolist()
    steps = torch.randint(0, 5000, (n,), generator=g).tolist()
    k1, k2 = zip(*[row_keys(s, t) for s, t in zip(seeds, steps)])
    return torch.tensor(k1, device=DEVICE), torch.tensor(k2, device=DEVICE)


@pytest.mark.parametrize(
    "n_rows,vocab", big_or_tiny([(1, 151936), (64, 128256), (256, 32000)], [(3, 1500), (2, 77)])
)
def test_gumbel_noise_bit_equal(n_rows, vocab):
    from tallow.kernels._sampling_triton import gumbel_noise_triton

    g = rng(7)
    k1, k2 = _keys(g, n_rows)
    assert torch.equal(gumbel_noise_triton(k1, k2, vocab), gumbel_noise_ref(k1, k2, vocab))
    # and equal to the CPU reference: the same noise on every device
    assert torch.equal(
        gumbel_noise_triton(k1, k2, vocab).cpu(), gumbel_noise_ref(k1.cpu(), k2.cpu(), vocab)
    )


@pytest.mark.parametrize(
    "n_rows,vocab", big_or_tiny([(1, 151936), (64, 128256), (256, 32000)], [(4, 1500), (3, 77)])
)
def test_gumbel_argmax_same_tokens(n_rows, vocab):
    from tallow.kernels._sampling_triton import gumbel_argmax_triton

    g = rng(8)
    logits = randn(g, n_rows, vocab, scale=4.0)
    logits[0, : vocab // 3] = float("-inf")  # masked tokens are never chosen
    inv_t = (torch.rand(n_rows, generator=g) * 2 + 0.2).to(DEVICE)
    greedy = (torch.rand(n_rows, generator=g) < 0.3).to(DEVICE)
    k1, k2 = _keys(g, n_rows)
    expected = gumbel_argmax_ref(logits, inv_t, greedy, k1, k2)
    actual = gumbel_argmax_triton(logits, inv_t, greedy, k1, k2)
    assert torch.equal(actual, expected)
    assert bool((actual[0] >= vocab // 3).item())
    cpu = gumbel_argmax_ref(logits.cpu(), inv_t.cpu(), greedy.cpu(), k1.cpu(), k2.cpu())
    assert torch.equal(actual.cpu(), cpu)


def test_gumbel_argmax_ties_go_to_lowest_index():
    from tallow.kernels._sampling_triton import gumbel_argmax_triton

    vocab = 3000 if INTERPRET else 100000
    logits = torch.zeros(2, vocab, device=DEVICE)
    logits[:, [7, vocab - 5]] = 5.0
    greedy = torch.tensor([True, True], device=DEVICE)
    k = torch.zeros(2, dtype=torch.int64, device=DEVICE)
    ones = torch.ones(2, device=DEVICE)
    assert gumbel_argmax_triton(logits, ones, greedy, k, k).tolist() == [7, 7]


@pytest.mark.parametrize(
    "n_rows,vocab,n_entries", big_or_tiny([(8, 151936, 3000), (256, 32000, 20000)], [(3, 200, 40)])
)
def test_logit_edits_bit_equal(n_rows, vocab, n_entries):
    from tallow.kernels._sampling_triton import apply_logit_edits_triton

    g = rng(9)
    flat = torch.randperm(n_rows * vocab, generator=g)[:n_entries]
    rows, tokens = flat // vocab, flat % vocab
    counts = torch.randint(0, 4, (n_entries,), generator=g).float()
    edits = LogitEdits(
        rows=rows.to(DEVICE),
        tokens=tokens.to(DEVICE),
        bias=torch.where(
            torch.rand(n_entries, generator=g) < 0.3, torch.randn(n_entries, generator=g) * 5, 0.0
        ).to(DEVICE),
        masked=(torch.rand(n_entries, generator=g) < 0.1).to(DEVICE),
        counts=counts.to(DEVICE),
        in_rep=(torch.rand(n_entries, generator=g) < 0.7).to(DEVICE),
        repetition_penalty=(torch.rand(n_rows, generator=g) + 0.5).to(DEVICE),
        frequency_penalty=(torch.randn(n_rows, generator=g)).to(DEVICE),
        presence_penalty=(torch.randn(n_rows, generator=g)).to(DEVICE),
    )
    logits = randn(g, n_rows, vocab, scale=5.0)
    expected, actual = logits.clone(), logits.clone()
    apply_logit_edits_ref(expected, edits)
    apply_logit_edits_triton(actual, edits)
    assert torch.equal(actual, expected)
    assert not torch.equal(actual, logits)


def test_sampler_on_device_matches_cpu(monkeypatch):
    """Seeded rows sample the same tokens on this device (Triton kernels) as on the CPU
    (torch references), with penalties, bias, greedy rows and top-k in the batch."""
    from tallow import SamplingParams
    from tallow.engine.sampling import RowParams, Sampler, SamplingBatch
    from tallow.kernels import sampling

    g = rng(10)
    vocab = 1000 if INTERPRET else 151936
    n = 6 if INTERPRET else 64

    def params(i: int) -> SamplingParams:
        return SamplingParams(
            temperature=0.0 if i % 5 == 0 else 0.5 + (i % 3) * 0.4,
            top_k=20 if i % 4 == 1 else 0,
            repetition_penalty=1.2 if i % 2 else 1.0,
            frequency_penalty=0.3 * (i % 3),
            presence_penalty=0.1,
            logit_bias={3: 2.0} if i % 3 == 0 else None,
            logprobs=2 if i == 1 else None,
        )

    rows = []
    for i in range(n):
        prompt = torch.randint(0, vocab, (50,), generator=g).tolist()
        out = torch.randint(0, vocab, (i * 3,), generator=g).tolist()
        rows.append(RowParams(params(i), out, prompt, seed=1000 + i, step=len(out)))
    logits = torch.randn(n, vocab, generator=g) * 3
    dev = Sampler()(logits.to(DEVICE), SamplingBatch.build(rows, vocab, DEVICE, eos_token_ids={0}))
    # The CPU run uses the torch references (also under the interpreter, where Triton would
    # otherwise run on CPU tensors too).
    monkeypatch.setattr(sampling, "triton_enabled", lambda t: False)
    cpu = Sampler()(logits, SamplingBatch.build(rows, vocab, "cpu", eos_token_ids={0}))
    assert torch.equal(dev.token_ids.cpu(), cpu.token_ids)
    # log_softmax over a large vocabulary sums in a different order on each device
    torch.testing.assert_close(dev.logprobs.cpu(), cpu.logprobs, rtol=1e-4, atol=1e-4)
    assert math.isfinite(float(dev.logprobs[1]))
