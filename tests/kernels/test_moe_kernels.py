"""The fused-MoE kernels against their torch references, on random inputs from the test seed.

On a CUDA machine these run on the GPU at real shapes (``pytest -m gpu
tests/kernels/test_moe_kernels.py``); under ``TRITON_INTERPRET=1`` (``test_interpreter.py``
launches this module that way) at tiny hidden sizes but real expert counts, top-k and token
counts, so CI checks the kernels' logic: alignment, both GEMM paths, both activations, biases.
"""

from __future__ import annotations

import os

import pytest
import torch

from tallow.plugin.testing.seeds import base_seed
from tallow.kernels.moe import (
    MoEConfig,
    fused_moe,
    fused_moe_ref,
    moe_align,
    moe_align_ref,
    padded_capacity,
    softmax_topk,
    softmax_topk_ref,
)

INTERPRET = os.environ.get("TRITON_INTERPRET", "") == "1"
DEVICE = "cpu" if INTERPRET else "cuda"

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not INTERPRET and not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def rng(seed_hint: int) -> torch.Generator:
    seed = base_seed() ^ seed_hint
    print(f"input seed {seed} (TALLOW_TEST_SEED={base_seed()} replays it)")
    return torch.Generator(device="cpu").manual_seed(seed)


def routing(
    g: torch.Generator, tokens: int, experts: int, top_k: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax top-k of random logits: (weights in ``dtype``, int32 ids) on the device."""
    probs = torch.randn(tokens, experts, generator=g).softmax(-1)
    weights, ids = probs.topk(top_k, dim=-1)
    return weights.to(dtype).to(DEVICE), ids.to(torch.int32).to(DEVICE)


def experts(g: torch.Generator, e: int, h: int, i: int, dtype: torch.dtype, bias: bool):
    scale_13, scale_2 = h**-0.5, i**-0.5
    w13 = (torch.randn(e, 2 * i, h, generator=g) * scale_13).to(dtype).to(DEVICE)
    w2 = (torch.randn(e, h, i, generator=g) * scale_2).to(dtype).to(DEVICE)
    b13 = (torch.randn(e, 2 * i, generator=g) * 0.5).to(dtype).to(DEVICE) if bias else None
    b2 = (torch.randn(e, h, generator=g) * 0.5).to(dtype).to(DEVICE) if bias else None
    return w13, w2, b13, b2


def assert_moe_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """float32 sums in another order, each stage rounded to the dtype: a few units in the last
    place of the output's scale (bf16: the interpreter also rounds by truncation)."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    rel = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}[expected.dtype]
    scale = float(expected.float().abs().max()) + 1e-6
    err = float((actual.float() - expected.float()).abs().max())
    assert err <= rel * scale, f"max error {err:.3g} > {rel} x output scale {scale:.3g}"


def per_expert_rows(align, num_experts: int) -> dict[int, list[int]]:
    """Each expert's real rows (sorted: the device may place them in any order)."""
    ids = align.sorted_ids.cpu()
    blocks = align.expert_ids.cpu().tolist()
    used = int(align.rows_used.cpu()[0])
    out: dict[int, list[int]] = {e: [] for e in range(num_experts)}
    for b in range(used // align.block_m):
        rows = ids[b * align.block_m : (b + 1) * align.block_m]
        out[blocks[b]].extend(r for r in rows.tolist() if r < align.num_valid)
    return {e: sorted(r) for e, r in out.items()}


# --- router ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tokens,num_experts,top_k",
    [(1, 128, 8), (7, 60, 4), (33, 8, 2), (5, 64, 1)]
    + ([] if INTERPRET else [(4096, 128, 8), (300, 256, 8)]),
)
@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_softmax_topk(tokens, num_experts, top_k, renormalize, dtype):
    g = rng(6)
    logits = (torch.randn(tokens, num_experts, generator=g) * 3).to(dtype).to(DEVICE)
    weights, ids = softmax_topk(logits, top_k, renormalize, scale=1.5)
    ref_w, ref_ids = softmax_topk_ref(logits.cpu(), top_k, renormalize, scale=1.5)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int64
    # equal logits (bf16 has few values) may be chosen either way: the weights in rank order
    # must match, and each chosen id must carry the weight its own logit gives
    torch.testing.assert_close(weights.cpu(), ref_w, rtol=1e-5, atol=1e-6)
    assert all(len(set(r)) == top_k for r in ids.cpu().tolist())
    probs = logits.cpu().softmax(-1, dtype=torch.float32)
    chosen = probs.gather(1, ids.cpu())
    if renormalize:
        chosen = chosen / chosen.sum(-1, keepdim=True)
    torch.testing.assert_close(weights.cpu(), chosen * 1.5, rtol=1e-5, atol=1e-6)


# --- alignment ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tokens,num_experts,top_k,block_m",
    [(1, 128, 8, 16), (3, 8, 1, 16), (37, 64, 4, 32), (512, 128, 8, 64), (200, 8, 2, 16)],
)
def test_moe_align(tokens, num_experts, top_k, block_m):
    g = rng(1)
    _, ids = routing(g, tokens, num_experts, top_k, torch.float32)
    got = moe_align(ids, num_experts, block_m)
    ref = moe_align_ref(ids.cpu(), num_experts, block_m)
    capacity = padded_capacity(tokens * top_k, num_experts, block_m)
    assert got.sorted_ids.shape == ref.sorted_ids.shape == (capacity,)
    assert torch.equal(got.rows_used.cpu(), ref.rows_used)
    used = int(ref.rows_used[0])
    assert torch.equal(got.expert_ids.cpu()[: used // block_m], ref.expert_ids[: used // block_m])
    assert per_expert_rows(got, num_experts) == per_expert_rows(ref, num_experts)
    # every row exactly once; the rest is padding
    real = got.sorted_ids.cpu()[got.sorted_ids.cpu() < tokens * top_k]
    assert sorted(real.tolist()) == list(range(tokens * top_k))


# --- the fused MoE ------------------------------------------------------------------------


def _tiny_or_real(tiny: list, real: list) -> list:
    return tiny if INTERPRET else real


_CASES = _tiny_or_real(
    # tokens, experts, top_k, hidden, intermediate, dtype, path
    [
        (1, 128, 8, 64, 32, torch.bfloat16, "gemv"),
        (3, 8, 1, 32, 16, torch.float32, "gemv"),
        (2, 64, 4, 48, 24, torch.float16, "gemv"),
        (4, 64, 4, 32, 16, torch.float16, "gemm"),
        (17, 8, 2, 48, 24, torch.bfloat16, "gemm"),
        (512, 64, 8, 16, 16, torch.float32, "gemm"),
    ],
    [
        (1, 128, 8, 2048, 768, torch.bfloat16, "gemv"),
        (4, 128, 8, 2048, 768, torch.bfloat16, "gemv"),
        (16, 128, 8, 2048, 768, torch.bfloat16, "gemm"),
        (256, 128, 8, 2048, 768, torch.bfloat16, "gemm"),
        (2048, 128, 8, 2048, 768, torch.bfloat16, "gemm"),
        (7, 8, 2, 4096, 14336, torch.bfloat16, "gemm"),
        (64, 60, 4, 2048, 1408, torch.bfloat16, "gemm"),
        (33, 64, 4, 512, 256, torch.float32, "gemm"),
    ],
)


def _config(path: str, dtype: torch.dtype) -> MoEConfig | None:
    if not INTERPRET:
        return MoEConfig("gemv", 1, 8, 256) if path == "gemv" else None  # the tuned default
    return MoEConfig("gemv", 1, 16, 16) if path == "gemv" else MoEConfig("gemm", 16, 16, 16)


@pytest.mark.parametrize("tokens,num_experts,top_k,hidden,inter,dtype,path", _CASES)
def test_fused_moe_silu(tokens, num_experts, top_k, hidden, inter, dtype, path):
    g = rng(2)
    x = (torch.randn(tokens, hidden, generator=g)).to(dtype).to(DEVICE)
    w13, w2, _, _ = experts(g, num_experts, hidden, inter, dtype, bias=False)
    weights, ids = routing(g, tokens, num_experts, top_k, dtype)
    if tokens % 2:  # what FusedMoE's router hands over: float32 weights, int64 ids
        weights, ids = weights.float(), ids.long()
    out = fused_moe(x, w13, w2, weights, ids, config=_config(path, dtype))
    assert_moe_close(out, fused_moe_ref(x, w13, w2, weights, ids))


@pytest.mark.parametrize(
    "tokens,num_experts,top_k,path",
    _tiny_or_real(
        [(5, 8, 2, "gemv"), (9, 8, 4, "gemm")], [(1, 32, 4, "gemv"), (300, 32, 4, "gemm")]
    ),
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_moe_clamped_swiglu_with_biases(tokens, num_experts, top_k, path, dtype):
    """gpt-oss's activation: large pre-activations so that both clamps bite."""
    hidden, inter = (32, 16) if INTERPRET else (2880, 2880)
    g = rng(3)
    x = (torch.randn(tokens, hidden, generator=g) * 4).to(dtype).to(DEVICE)
    w13, w2, b13, b2 = experts(g, num_experts, hidden, inter, dtype, bias=True)
    weights, ids = routing(g, tokens, num_experts, top_k, dtype)
    kw = dict(
        activation="swiglu_clamp", w13_bias=b13, w2_bias=b2, swiglu_alpha=1.702, swiglu_limit=7.0
    )
    ref = fused_moe_ref(x, w13, w2, weights, ids, **kw)
    h = x.float() @ w13[ids[0, 0].long()].float().T
    assert float(h.abs().max()) > 7.0, "inputs too small to reach the clamp"
    assert_moe_close(fused_moe(x, w13, w2, weights, ids, config=_config(path, dtype), **kw), ref)


@pytest.mark.parametrize(
    "tokens,num_experts,top_k,path",
    _tiny_or_real(
        [(5, 8, 2, "gemv"), (9, 8, 4, "gemm")], [(1, 32, 4, "gemv"), (300, 32, 4, "gemm")]
    ),
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_moe_gelu_tanh(tokens, num_experts, top_k, path, dtype):
    """GeGLU experts (Gemma 4): pre-activations spread over both tails of the tanh."""
    hidden, inter = (32, 16) if INTERPRET else (2816, 704)
    g = rng(5)
    x = (torch.randn(tokens, hidden, generator=g) * 3).to(dtype).to(DEVICE)
    w13, w2, _, _ = experts(g, num_experts, hidden, inter, dtype, bias=False)
    weights, ids = routing(g, tokens, num_experts, top_k, dtype)
    ref = fused_moe_ref(x, w13, w2, weights, ids, activation="gelu_tanh")
    silu = fused_moe_ref(x, w13, w2, weights, ids, activation="silu")
    assert float((ref.float() - silu.float()).abs().max()) > 1e-2, "GeGLU equals SwiGLU here"
    out = fused_moe(x, w13, w2, weights, ids, config=_config(path, dtype), activation="gelu_tanh")
    assert_moe_close(out, ref)


@pytest.mark.parametrize("path", ["gemv", "gemm"])
def test_reads_only_the_selected_experts(path):
    """Every expert no token selected is NaN: any read of it would poison the output."""
    e, k, tokens = (64, 8, 2) if INTERPRET else (128, 8, 1)
    hidden, inter = (32, 16) if INTERPRET else (2048, 768)
    g = rng(4)
    x = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16).to(DEVICE)
    w13, w2, _, _ = experts(g, e, hidden, inter, torch.bfloat16, bias=False)
    weights, ids = routing(g, tokens, e, k, torch.bfloat16)
    unused = torch.ones(e, dtype=torch.bool)
    unused[ids.long().cpu().flatten()] = False
    w13[unused.to(DEVICE)] = float("nan")
    w2[unused.to(DEVICE)] = float("nan")
    out = fused_moe(x, w13, w2, weights, ids, config=_config(path, torch.bfloat16))
    assert torch.isfinite(out).all()
    assert_moe_close(out, fused_moe_ref(x, w13, w2, weights, ids))
