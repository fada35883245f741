"""The short causal depthwise convolution of linear-attention layers, over state slots.

Channel ``c`` of token ``t``: ``y_t = act(bias_c + sum_j weight[c, j] * x_{t - K + 1 + j})``
(``K`` taps; the ``K - 1`` inputs before a sequence's first token of the step come from its
conv state). The state of a sequence is its last ``K - 1`` inputs, ``conv_state[slot]`` of
``[K - 1, C]`` (oldest first), updated in place; the engine zeroes a slot when a sequence
takes it, so a prompt starts from zero padding and later chunks carry the state.

Entry points (the Triton kernels on CUDA tensors, the references elsewhere):

* :func:`causal_conv1d`: any number of tokens per sequence (prefill, chunks);
* :func:`causal_conv1d_update`: one token per sequence (decode), capturable.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._dispatch import triton_enabled

__all__ = [
    "causal_conv1d",
    "causal_conv1d_ref",
    "causal_conv1d_update",
    "causal_conv1d_update_ref",
    "CONV_ACTIVATIONS",
]

#: activations applied after the convolution (None: none)
CONV_ACTIVATIONS = (None, "silu")


def _check(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_state: torch.Tensor,
    slots: torch.Tensor,
    activation: str | None,
) -> None:
    if x.dim() != 2:
        raise ValueError(f"x: expected [T, C], got {tuple(x.shape)}")
    c = x.shape[1]
    if weight.dim() != 2 or weight.shape[0] != c or weight.shape[1] < 2:
        raise ValueError(f"weight: expected [{c}, K] with K >= 2, got {tuple(weight.shape)}")
    if bias is not None and bias.shape != (c,):
        raise ValueError(f"bias: expected [{c}], got {tuple(bias.shape)}")
    taps = weight.shape[1]
    if conv_state.dim() != 3 or tuple(conv_state.shape[1:]) != (taps - 1, c):
        raise ValueError(
            f"conv_state: expected [slots + 1, {taps - 1}, {c}], got {tuple(conv_state.shape)}"
        )
    if slots.dim() != 1 or slots.dtype != torch.int64:
        raise ValueError(
            f"slots: expected int64 [num_seqs], got {slots.dtype} {tuple(slots.shape)}"
        )
    if activation not in CONV_ACTIVATIONS:
        raise ValueError(f"activation: expected one of {CONV_ACTIVATIONS}, got {activation!r}")


def _act(y: torch.Tensor, activation: str | None) -> torch.Tensor:
    return F.silu(y) if activation == "silu" else y


def causal_conv1d_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_state: torch.Tensor,
    slots: torch.Tensor,
    query_start_loc: torch.Tensor | list[int],
    *,
    activation: str | None = "silu",
) -> torch.Tensor:
    """Plain-torch reference of :func:`causal_conv1d` (same contract)."""
    _check(x, weight, bias, conv_state, slots, activation)
    starts = (
        query_start_loc.tolist()
        if isinstance(query_start_loc, torch.Tensor)
        else list(query_start_loc)
    )
    taps = weight.shape[1]
    out = torch.zeros_like(x)
    w = weight.float()
    for i, slot in enumerate(slots.tolist()):
        a, e = starts[i], starts[i + 1]
        if e == a:
            continue
        window = torch.cat([conv_state[slot].to(x.dtype), x[a:e]], 0).float()  # [K-1+L, C]
        # y[t] = sum_j w[:, j] * window[t + j]
        y = torch.zeros(e - a, x.shape[1], dtype=torch.float32, device=x.device)
        for j in range(taps):
            y += w[:, j] * window[j : j + e - a]
        if bias is not None:
            y = y + bias.float()
        out[a:e] = _act(y, activation).to(x.dtype)
        conv_state[slot] = window[-(taps - 1) :].to(conv_state.dtype)
    return out


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_state: torch.Tensor,
    slots: torch.Tensor,
    query_start_loc: torch.Tensor,
    *,
    max_query_len: int | None = None,
    query_start_loc_cpu: list[int] | None = None,
    activation: str | None = "silu",
) -> torch.Tensor:
    """The convolution of a step's flat sequences (see the module docstring): ``x`` ``[T,
    C]``, ``weight`` ``[C, K]``, ``bias`` ``[C]`` or None, ``conv_state`` ``[slots + 1, K - 1,
    C]`` updated in place at ``slots`` ``[N]`` (int64), ``query_start_loc`` ``[N + 1]`` (int32,
    on the device). ``max_query_len`` sizes the Triton grid (default: every row);
    ``query_start_loc_cpu`` spares the reference a copy from the device. Returns ``[T, C]`` in
    ``x``'s dtype (sums in float32; rows of no sequence are zero)."""
    _check(x, weight, bias, conv_state, slots, activation)
    if triton_enabled(x) and x.shape[0]:
        from ._causal_conv_triton import causal_conv1d_triton

        return causal_conv1d_triton(
            x,
            weight,
            bias,
            conv_state,
            slots,
            query_start_loc,
            max_query_len=max_query_len or x.shape[0],
            activation=activation,
        )
    starts = query_start_loc_cpu if query_start_loc_cpu is not None else query_start_loc
    return causal_conv1d_ref(x, weight, bias, conv_state, slots, starts, activation=activation)


def causal_conv1d_update_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_state: torch.Tensor,
    slots: torch.Tensor,
    *,
    activation: str | None = "silu",
) -> torch.Tensor:
    """Plain-torch reference of :func:`causal_conv1d_update` (same contract)."""
    _check(x, weight, bias, conv_state, slots, activation)
    window = torch.cat([conv_state.index_select(0, slots).to(x.dtype), x[:, None]], 1)
    y = (window.float() * weight.float().T).sum(1)
    if bias is not None:
        y = y + bias.float()
    conv_state.index_copy_(0, slots, window[:, 1:].to(conv_state.dtype))
    return _act(y, activation).to(x.dtype)


def causal_conv1d_update(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_state: torch.Tensor,
    slots: torch.Tensor,
    *,
    activation: str | None = "silu",
) -> torch.Tensor:
    """One token per sequence: row ``i`` of ``x`` ``[N, C]`` is the next input of the sequence
    holding ``slots[i]`` (padding rows of a CUDA graph name the dummy slot). Returns ``[N,
    C]``; no host synchronisation: capturable."""
    _check(x, weight, bias, conv_state, slots, activation)
    if slots.shape[0] != x.shape[0]:
        raise ValueError(f"slots: expected one per row ({x.shape[0]}), got {slots.shape[0]}")
    if triton_enabled(x) and x.shape[0]:
        from ._causal_conv_triton import causal_conv1d_update_triton

        return causal_conv1d_update_triton(
            x, weight, bias, conv_state, slots, activation=activation
        )
    return causal_conv1d_update_ref(x, weight, bias, conv_state, slots, activation=activation)
