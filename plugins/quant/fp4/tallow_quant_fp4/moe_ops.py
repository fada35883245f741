"""MXFP4 experts as gpt-oss stores them, and the expert MLP over them.

An expert matrix of ``R`` output rows and ``K`` input columns is two uint8 tensors:
``blocks [E, R, K / 32, 16]`` (two e2m1 codes a byte, the even column in the low nibble) and
``scales [E, R, K / 32]`` (e8m0 bytes: ``2 ** (s - 127)`` per 32 columns): the checkpoint's
``*_blocks`` / ``*_scales`` as they are (their gate/up rows sorted apart at load). ``w13`` has
the ``2I`` gate-then-up rows over the hidden size, ``w2`` the hidden rows over ``I``.

:func:`mxfp4_moe` runs the experts as :func:`tallow.kernels.fused_moe_ref` does on the decoded
weights (products in float32, the intermediate rounded to x's dtype, the sum over a token's
experts in float32): up to :data:`GEMV_MAX_TOKENS` tokens the Triton kernels read only the
selected experts' bytes and decode them in registers (``kernels/moe.py``); more tokens decode
the selected experts into a float workspace for the core's grouped GEMM
(:func:`tallow.kernels.fused_moe`). Without Triton the torch reference decodes every expert.
"""

from __future__ import annotations

import torch
import triton

from tallow.kernels import MOE_ACTIVATION_CODES, fused_moe, fused_moe_ref, triton_enabled

from .layout import e2m1_values, scale_values

#: tokens up to which the experts run on the decoding kernels (beyond: workspace + GEMM)
GEMV_MAX_TOKENS = 8
BLOCK_N = 32
GROUPS = 4
DEQUANT_BLOCK_R = 16


def dequantize_experts(
    blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """``[E, R, K]`` float weights of MXFP4 experts (torch; the code's value times its scale in
    float32, rounded once to ``dtype``)."""
    e, r, g, _ = blocks.shape
    codes = torch.stack([blocks & 15, blocks >> 4], dim=-1).reshape(e, r, g * 32)
    values = e2m1_values(codes) * scale_values("mxfp4", scales).repeat_interleave(32, dim=-1)
    return values.to(dtype)


def pack_blocks(codes: torch.Tensor) -> torch.Tensor:
    """e2m1 codes ``[..., K]`` (uint8, K a multiple of 32) → checkpoint blocks
    ``[..., K / 32, 16]``."""
    *lead, k = codes.shape
    if k % 32:
        raise ValueError(f"MXFP4 rows of {k} columns are not whole 32-column blocks")
    pairs = codes.to(torch.uint8).reshape(*lead, k // 2, 2)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).reshape(*lead, k // 32, 16)


def _check(
    x: torch.Tensor, w13: tuple[torch.Tensor, torch.Tensor], w2: tuple[torch.Tensor, torch.Tensor]
) -> None:
    (b13, s13), (b2, s2) = w13, w2
    e, two_i, g13, _ = b13.shape
    h = x.shape[1]
    if (
        g13 * 32 != h
        or tuple(s13.shape) != (e, two_i, g13)
        or two_i % 2
        or tuple(b2.shape) != (e, h, two_i // 64, 16)
        or tuple(s2.shape) != (e, h, two_i // 64)
    ):
        raise ValueError(
            f"mxfp4 experts: shapes do not fit x {tuple(x.shape)}: w13 blocks "
            f"{tuple(b13.shape)} scales {tuple(s13.shape)}, w2 blocks "
            f"{tuple(b2.shape)} scales {tuple(s2.shape)}"
        )


def mxfp4_moe_ref(
    x: torch.Tensor,
    w13: tuple[torch.Tensor, torch.Tensor],
    w2: tuple[torch.Tensor, torch.Tensor],
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    **kwargs: object,
) -> torch.Tensor:
    """The reference: every expert decoded, then :func:`tallow.kernels.fused_moe_ref`
    (``kwargs``: its activation, biases, ``swiglu_alpha`` / ``swiglu_limit``)."""
    _check(x, w13, w2)
    return fused_moe_ref(
        x, dequantize_experts(*w13), dequantize_experts(*w2), topk_weights, topk_ids, **kwargs
    )  # type: ignore[arg-type]


def mxfp4_moe(
    x: torch.Tensor,
    w13: tuple[torch.Tensor, torch.Tensor],
    w2: tuple[torch.Tensor, torch.Tensor],
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str = "silu",
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    swiglu_alpha: float = 1.702,
    swiglu_limit: float = 7.0,
    gemv_max_tokens: int = GEMV_MAX_TOKENS,
) -> torch.Tensor:
    """The expert MLP of ``x [T, H]`` over MXFP4 experts ``w13`` / ``w2`` (each ``(blocks,
    scales)``) → ``[T, H]`` in x's dtype (see the module docstring)."""
    args = dict(
        activation=activation,
        w13_bias=w13_bias,
        w2_bias=w2_bias,
        swiglu_alpha=swiglu_alpha,
        swiglu_limit=swiglu_limit,
    )
    if activation not in MOE_ACTIVATION_CODES:
        raise ValueError(
            f"mxfp4 experts: activation must be one of "
            f"{', '.join(MOE_ACTIVATION_CODES)}, got {activation!r}"
        )
    if not triton_enabled(x) or x.shape[0] == 0:
        return mxfp4_moe_ref(x, w13, w2, topk_weights, topk_ids, **args)
    _check(x, w13, w2)
    if x.shape[0] > gemv_max_tokens:
        used = torch.zeros(w13[0].shape[0], dtype=torch.int32, device=x.device)
        used.index_fill_(0, topk_ids.reshape(-1).long(), 1)
        return fused_moe(
            x,
            dequantize_selected(*w13, used, x.dtype),
            dequantize_selected(*w2, used, x.dtype),
            topk_weights,
            topk_ids,
            **args,
        )  # type: ignore[arg-type]
    return _gemv_moe(
        x,
        w13,
        w2,
        topk_weights,
        topk_ids,
        activation=activation,
        w13_bias=w13_bias,
        w2_bias=w2_bias,
        alpha=swiglu_alpha,
        limit=swiglu_limit,
    )


def dequantize_selected(
    blocks: torch.Tensor, scales: torch.Tensor, used: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """``[E, R, K]`` of ``dtype`` holding the experts whose ``used`` flag (int32 ``[E]``) is
    set, decoded (the others' rows are left unwritten)."""
    from .kernels.moe import _dequant_kernel

    e, r, g, _ = blocks.shape
    out = torch.empty(e, r, g * 32, dtype=dtype, device=blocks.device)
    _dequant_kernel[(e, triton.cdiv(r, DEQUANT_BLOCK_R))](
        blocks,
        scales,
        used,
        out,
        r,
        g,
        blocks.stride(0),
        blocks.stride(1),
        scales.stride(0),
        scales.stride(1),
        out.stride(0),
        out.stride(1),
        BLOCK_R=DEQUANT_BLOCK_R,
        GROUPS=GROUPS,
    )
    return out


def _gemv_moe(
    x: torch.Tensor,
    w13: tuple[torch.Tensor, torch.Tensor],
    w2: tuple[torch.Tensor, torch.Tensor],
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str,
    w13_bias: torch.Tensor | None,
    w2_bias: torch.Tensor | None,
    alpha: float,
    limit: float,
) -> torch.Tensor:
    from .kernels.moe import _down_kernel, _gate_up_kernel

    (b13, s13), (b2, s2) = w13, w2
    tokens, top_k = topk_ids.shape
    e, two_i, g13, _ = b13.shape
    n, h = two_i // 2, x.shape[1]
    x = x if x.stride(1) == 1 else x.contiguous()
    ids = topk_ids.reshape(-1).contiguous()
    weights = topk_weights.reshape(-1).contiguous()
    inter = torch.empty(tokens * top_k, n, dtype=x.dtype, device=x.device)
    _gate_up_kernel[(tokens * top_k, triton.cdiv(n, BLOCK_N))](
        x,
        b13,
        s13,
        w13_bias if w13_bias is not None else x,
        inter,
        ids,
        n,
        g13,
        float(alpha),
        float(limit),
        x.stride(0),
        b13.stride(0),
        b13.stride(1),
        s13.stride(0),
        s13.stride(1),
        w13_bias.stride(0) if w13_bias is not None else 0,
        inter.stride(0),
        TOP_K=top_k,
        ACT=MOE_ACTIVATION_CODES[activation],
        HAS_BIAS=w13_bias is not None,
        BLOCK_N=BLOCK_N,
        GROUPS=GROUPS,
    )
    out = torch.empty(tokens, h, dtype=x.dtype, device=x.device)
    _down_kernel[(tokens, triton.cdiv(h, BLOCK_N))](
        inter,
        b2,
        s2,
        w2_bias if w2_bias is not None else x,
        out,
        ids,
        weights,
        h,
        b2.shape[2],
        inter.stride(0),
        b2.stride(0),
        b2.stride(1),
        s2.stride(0),
        s2.stride(1),
        w2_bias.stride(0) if w2_bias is not None else 0,
        out.stride(0),
        TOP_K=top_k,
        HAS_BIAS=w2_bias is not None,
        BLOCK_N=BLOCK_N,
        GROUPS=GROUPS,
    )
    return out
