"""Mixture-of-experts MLPs: every token through its ``top_k`` experts, weighted and summed.

Expert weights are stacked: ``w13 [E, 2I, H]`` (each expert's gate rows, then its up rows) and
``w2 [E, H, I]``. A token ``t`` routed to experts ``ids[t, j]`` with weights ``weights[t, j]``
gets ``sum_j weights[t, j] * down_e(act(gate_e(x_t), up_e(x_t)))``.

Entry points (the Triton kernels of :mod:`._moe_triton` on CUDA tensors and under
``TRITON_INTERPRET=1``, the ``*_ref`` references elsewhere):

* :func:`softmax_topk` — the softmax top-k router (optionally renormalised) in one launch;
* :func:`moe_align` — token → expert sorting and block alignment for the grouped GEMM: the
  flat ``(token, slot)`` indices sorted by expert, each expert's run padded to the GEMM's
  ``BLOCK_M`` rows, the expert of every block, and how many rows are in use. Buffers are sized
  for the worst case of the token count, never for the routing, so the path is CUDA-graph safe.
* :func:`fused_moe` — the whole expert MLP: gate/up as one grouped GEMM with the activation
  fused, down as a second with the routing weight fused, then a small sum over each token's
  ``top_k`` rows. A few tokens take a GEMV path instead (:func:`moe_config` says how few):
  each ``(token, expert)`` pair streams only its expert's rows, so batch 1 reads the
  ``top_k`` selected experts' weights and nothing else, and the down kernel sums each token's
  experts itself.

The sum over ``top_k``: the GEMV path fuses it (one program computes a token's block of
outputs for each of its experts in slot order and adds them up in float32). The grouped GEMM
runs a token's experts in different programs, so fusing there would mean atomic adds into the
output, which makes the result depend on the order programs finish (float addition does not
associate) and, in bf16, rounds at every add; it writes ``[T * top_k, H]`` instead and one
memory-bound torch sum adds each token's rows — a pass over 4 MB at 256 tokens of a 2048-wide,
top-8 model, small beside the GEMMs' weight traffic — so determinism costs little.

Activations (``activation``): ``"silu"`` — SwiGLU, ``silu(gate) * up``; ``"swiglu_clamp"`` —
gpt-oss's clamped SwiGLU, ``gate = min(gate, limit)``, ``up = clamp(up, -limit, limit)``,
``(up + 1) * gate * sigmoid(alpha * gate)``; ``"gelu_tanh"`` — GeGLU, ``gelu_tanh(gate) * up``
(Gemma 4). Optional biases ``w13_bias [E, 2I]`` and
``w2_bias [E, H]`` are added before the activation and before the routing weight.

Rounding: products accumulate in float32; bias and activation in float32; the intermediate
``[T * top_k, I]`` is stored in x's dtype; the down product times the routing weight is stored
in x's dtype (the reference and the grouped GEMM; the GEMV path keeps it in float32); the sum
over ``top_k`` runs in float32 and is rounded once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._dispatch import triton_enabled
from ._moe_layout import ACTIVATIONS, MOE_ACTIVATION_CODES, MoEAlignment, padded_capacity
from .moe_config import MoEConfig, moe_config


__all__ = [
    "ACTIVATIONS",
    "MOE_ACTIVATION_CODES",
    "MoEAlignment",
    "MoEConfig",
    "check_moe_routing",
    "fused_moe",
    "fused_moe_ref",
    "moe_align",
    "moe_align_ref",
    "moe_config",
    "padded_capacity",
    "softmax_topk",
    "softmax_topk_ref",
]


def _check_ids(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> None:
    if topk_ids.dim() != 2:
        raise ValueError(
            f"moe_align: topk_ids must be [tokens, top_k], got {tuple(topk_ids.shape)}"
        )
    if num_experts < 1 or block_m < 1:
        raise ValueError(
            f"moe_align: num_experts ({num_experts}) and block_m ({block_m}) must be positive"
        )


def moe_align_ref(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> MoEAlignment:
    """Plain-torch reference of :func:`moe_align`: within an expert, rows in ascending order."""
    _check_ids(topk_ids, num_experts, block_m)
    flat = topk_ids.reshape(-1).long()
    num_valid = flat.numel()
    capacity = padded_capacity(num_valid, num_experts, block_m)
    counts = torch.bincount(flat, minlength=num_experts)[:num_experts]
    padded = (counts + block_m - 1) // block_m * block_m
    starts = torch.cumsum(padded, 0) - padded
    order = torch.sort(flat, stable=True).indices
    rank = (
        torch.arange(num_valid, device=flat.device)
        - (torch.cumsum(counts, 0) - counts)[flat[order]]
    )
    sorted_ids = torch.full((capacity,), num_valid, dtype=torch.int32, device=flat.device)
    sorted_ids[starts[flat[order]] + rank] = order.to(torch.int32)
    ends = torch.cumsum(padded, 0)
    block_start = torch.arange(capacity // block_m, device=flat.device) * block_m
    expert_ids = (ends[None, :] <= block_start[:, None]).sum(1).clamp(max=num_experts - 1)
    rows_used = padded.sum().reshape(1)
    return MoEAlignment(
        sorted_ids, expert_ids.to(torch.int32), rows_used.to(torch.int32), block_m, num_valid
    )


def moe_align(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> MoEAlignment:
    """Sort the rows of a routing ``topk_ids [T, top_k]`` by expert and pad each expert's rows
    to whole blocks of ``block_m`` (see :class:`MoEAlignment`). On the device three small
    kernels (count, offsets, scatter) run with no host sync; rows of one expert may then come
    in any order (they are independent rows of the GEMM)."""
    _check_ids(topk_ids, num_experts, block_m)
    if not triton_enabled(topk_ids) or topk_ids.numel() == 0:
        return moe_align_ref(topk_ids, num_experts, block_m)
    from ._moe_triton import moe_align_triton

    return moe_align_triton(topk_ids, num_experts, block_m)


def softmax_topk_ref(
    logits: torch.Tensor, top_k: int, renormalize: bool = False, scale: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain-torch reference of :func:`softmax_topk`."""
    weights, ids = logits.softmax(-1, dtype=torch.float32).topk(top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return (weights * scale if scale != 1.0 else weights), ids


def softmax_topk(
    logits: torch.Tensor, top_k: int, renormalize: bool = False, scale: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """The softmax top-k router of ``logits [T, E]``: (weights float32 ``[T, top_k]``, ids
    int64 ``[T, top_k]``), largest first, renormalised to sum to one when asked, times
    ``scale``. One Triton launch on the device (torch needs four or five kernels)."""
    if logits.dim() != 2 or not 1 <= top_k <= logits.shape[1]:
        raise ValueError(
            f"softmax_topk: expected logits [T, E >= top_k={top_k}], got {tuple(logits.shape)}"
        )
    if not triton_enabled(logits) or logits.stride(1) != 1:
        return softmax_topk_ref(logits, top_k, renormalize, scale)
    from ._moe_triton import softmax_topk_triton

    return softmax_topk_triton(logits, top_k, renormalize, scale)


def check_moe_routing(
    who: str,
    x: torch.Tensor,
    hidden: int,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str,
) -> None:
    """Raise ``ValueError`` (its message starting with ``who``) unless ``activation`` is one of
    :data:`ACTIVATIONS`, ``x`` is ``[T, hidden]`` and ``topk_ids`` / ``topk_weights`` are both
    ``[T, top_k]``: the checks every fused-MoE entry point makes, whatever its weights."""
    if activation not in ACTIVATIONS:
        raise ValueError(
            f"{who}: activation must be one of {', '.join(ACTIVATIONS)}, got {activation!r}"
        )
    if x.dim() != 2 or x.shape[1] != hidden:
        raise ValueError(f"{who}: x must be [T, {hidden}], got {tuple(x.shape)}")
    if (
        topk_ids.dim() != 2
        or topk_ids.shape != topk_weights.shape
        or topk_ids.shape[0] != x.shape[0]
    ):
        raise ValueError(
            f"{who}: topk_ids {tuple(topk_ids.shape)} and topk_weights "
            f"{tuple(topk_weights.shape)} must both be [T={x.shape[0]}, top_k]"
        )


def _check(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str,
    w13_bias: torch.Tensor | None,
    w2_bias: torch.Tensor | None,
) -> None:
    if x.dim() != 2 or w13.dim() != 3 or w2.dim() != 3:
        raise ValueError(
            f"fused_moe: expected x [T, H], w13 [E, 2I, H], w2 [E, H, I]; got "
            f"{tuple(x.shape)}, {tuple(w13.shape)}, {tuple(w2.shape)}"
        )
    e, two_i, h = w13.shape
    if x.shape[1] != h or two_i % 2 or tuple(w2.shape) != (e, h, two_i // 2):
        raise ValueError(
            f"fused_moe: shapes do not fit: x {tuple(x.shape)}, w13 "
            f"{tuple(w13.shape)}, w2 {tuple(w2.shape)}"
        )
    check_moe_routing("fused_moe", x, h, topk_weights, topk_ids, activation)
    if w13_bias is not None and tuple(w13_bias.shape) != (e, two_i):
        raise ValueError(f"fused_moe: w13_bias must be [{e}, {two_i}], got {tuple(w13_bias.shape)}")
    if w2_bias is not None and tuple(w2_bias.shape) != (e, h):
        raise ValueError(f"fused_moe: w2_bias must be [{e}, {h}], got {tuple(w2_bias.shape)}")


def apply_activation_ref(
    gate_up: torch.Tensor, activation: str, alpha: float, limit: float
) -> torch.Tensor:
    """The gated activation of float32 ``gate_up [..., 2I]`` → float32 ``[..., I]``."""
    gate, up = gate_up.chunk(2, dim=-1)
    if activation == "silu":
        return F.silu(gate) * up
    if activation == "gelu_tanh":
        return F.gelu(gate, approximate="tanh") * up
    gate = gate.clamp(max=limit)
    up = up.clamp(-limit, limit)
    return (up + 1.0) * (gate * torch.sigmoid(gate * alpha))


def fused_moe_ref(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str = "silu",
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    swiglu_alpha: float = 1.702,
    swiglu_limit: float = 7.0,
) -> torch.Tensor:
    """Plain-torch reference of :func:`fused_moe` (one matmul per expert that has rows)."""
    _check(x, w13, w2, topk_weights, topk_ids, activation, w13_bias, w2_bias)
    tokens, top_k = topk_ids.shape
    flat = topk_ids.reshape(-1).long()
    weights = topk_weights.reshape(-1).float()
    token_of = torch.arange(tokens, device=x.device).repeat_interleave(top_k)
    out_k = torch.zeros(tokens * top_k, x.shape[1], dtype=x.dtype, device=x.device)
    for expert in torch.unique(flat).tolist():
        rows = (flat == expert).nonzero().squeeze(1)
        h = x[token_of[rows]].float() @ w13[expert].float().T
        if w13_bias is not None:
            h = h + w13_bias[expert].float()
        inter = apply_activation_ref(h, activation, swiglu_alpha, swiglu_limit).to(x.dtype)
        y = inter.float() @ w2[expert].float().T
        if w2_bias is not None:
            y = y + w2_bias[expert].float()
        out_k[rows] = (y * weights[rows, None]).to(x.dtype)
    return out_k.view(tokens, top_k, x.shape[1]).float().sum(1).to(x.dtype)


def fused_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str = "silu",
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    swiglu_alpha: float = 1.702,
    swiglu_limit: float = 7.0,
    config: MoEConfig | None = None,
) -> torch.Tensor:
    """The expert MLP of ``x [T, H]`` → ``[T, H]`` in x's dtype (see the module docstring).

    ``topk_ids [T, top_k]`` (int32 or int64) and ``topk_weights [T, top_k]`` (any float
    dtype, read in float32) come from a router. ``config`` overrides
    :func:`moe_config` (the sweep script passes its candidates)."""
    _check(x, w13, w2, topk_weights, topk_ids, activation, w13_bias, w2_bias)
    if not triton_enabled(x) or x.shape[0] == 0:
        return fused_moe_ref(
            x,
            w13,
            w2,
            topk_weights,
            topk_ids,
            activation=activation,
            w13_bias=w13_bias,
            w2_bias=w2_bias,
            swiglu_alpha=swiglu_alpha,
            swiglu_limit=swiglu_limit,
        )
    from ._moe_triton import fused_moe_triton

    e, two_i, h = w13.shape
    cfg = config or moe_config(e, two_i // 2, h, x.shape[0], w13.dtype)
    return fused_moe_triton(
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
        config=cfg,
    )
