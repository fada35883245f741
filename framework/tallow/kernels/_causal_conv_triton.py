"""Triton kernels of :mod:`tallow.kernels.causal_conv` (same contracts; the torch references
are there).

Prefill: one program per (sequence, block of tokens, block of channels); the first token
block of a sequence also writes its new conv state, after a barrier, since it is the only
block that reads the old one (token blocks are at least ``K - 1`` long). Decode: one program
per (row, block of channels), the grid fixed by the number of rows, no host synchronisation.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .jit import step_jit

BLOCK_C = 128
BLOCK_T = 32


@triton.jit
def _silu(y):
    return y / (1.0 + tl.exp(-y))


@step_jit(
    values=("num_channels", "stride_x", "stride_out"),
    pointers=("x_ptr", "out_ptr", "state_ptr", "slots_ptr", "qsl_ptr"),
)
def _conv_prefill(
    x_ptr,
    w_ptr,
    bias_ptr,
    state_ptr,
    slots_ptr,
    qsl_ptr,
    out_ptr,
    num_channels,
    stride_x,
    stride_out,
    stride_w,
    stride_slot,
    stride_tap,
    TAPS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SILU: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
):
    seq = tl.program_id(0)
    tb = tl.program_id(1)
    cb = tl.program_id(2)
    start = tl.load(qsl_ptr + seq).to(tl.int64)
    length = (tl.load(qsl_ptr + seq + 1) - start).to(tl.int32)
    if tb * BT >= length:
        return
    slot = tl.load(slots_ptr + seq).to(tl.int64)
    cols = cb * BC + tl.arange(0, BC)
    cmask = cols < num_channels
    t = tb * BT + tl.arange(0, BT)
    tmask = t < length
    state = state_ptr + slot * stride_slot
    acc = tl.zeros((BT, BC), dtype=tl.float32)
    for j in tl.static_range(TAPS):
        # input position of tap j for token t: t - (TAPS - 1) + j; negative ones are the state
        p = t - (TAPS - 1) + j
        from_x = tl.load(
            x_ptr + (start + p)[:, None] * stride_x + cols[None, :],
            mask=(tmask & (p >= 0))[:, None] & cmask[None, :],
            other=0.0,
        )
        from_state = tl.load(
            state + (p + TAPS - 1)[:, None] * stride_tap + cols[None, :],
            mask=(tmask & (p < 0))[:, None] & cmask[None, :],
            other=0.0,
        )
        w = tl.load(w_ptr + cols * stride_w + j, mask=cmask, other=0.0).to(tl.float32)
        acc += (from_x.to(tl.float32) + from_state.to(tl.float32)) * w[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    if SILU:
        acc = _silu(acc)
    tl.store(
        out_ptr + (start + t)[:, None] * stride_out + cols[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=tmask[:, None] & cmask[None, :],
    )
    if tb == 0:
        # the new state: the last TAPS - 1 inputs of (old state ++ x)
        r = tl.arange(0, BT)
        rmask = r < TAPS - 1
        p = length - (TAPS - 1) + r
        new_x = tl.load(
            x_ptr + (start + p)[:, None] * stride_x + cols[None, :],
            mask=(rmask & (p >= 0))[:, None] & cmask[None, :],
            other=0.0,
        )
        new_s = tl.load(
            state + (p + TAPS - 1)[:, None] * stride_tap + cols[None, :],
            mask=(rmask & (p < 0))[:, None] & cmask[None, :],
            other=0.0,
        )
        new = new_x.to(tl.float32) + new_s.to(tl.float32)
        tl.debug_barrier()  # every read of the old state above is done
        tl.store(
            state + r[:, None] * stride_tap + cols[None, :],
            new.to(state_ptr.dtype.element_ty),
            mask=rmask[:, None] & cmask[None, :],
        )


@step_jit(
    values=("num_channels", "stride_x", "stride_out"),
    pointers=("x_ptr", "out_ptr", "state_ptr", "slots_ptr"),
)
def _conv_update(
    x_ptr,
    w_ptr,
    bias_ptr,
    state_ptr,
    slots_ptr,
    out_ptr,
    num_channels,
    stride_x,
    stride_out,
    stride_w,
    stride_slot,
    stride_tap,
    TAPS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SILU: tl.constexpr,
    BC: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cb = tl.program_id(1)
    slot = tl.load(slots_ptr + row).to(tl.int64)
    cols = cb * BC + tl.arange(0, BC)
    cmask = cols < num_channels
    state = state_ptr + slot * stride_slot
    x = tl.load(x_ptr + row * stride_x + cols, mask=cmask, other=0.0).to(tl.float32)
    acc = x * tl.load(w_ptr + cols * stride_w + (TAPS - 1), mask=cmask, other=0.0).to(tl.float32)
    for j in tl.static_range(TAPS - 1):
        s = tl.load(state + j * stride_tap + cols, mask=cmask, other=0.0).to(tl.float32)
        acc += s * tl.load(w_ptr + cols * stride_w + j, mask=cmask, other=0.0).to(tl.float32)
        if j > 0:
            # each thread rewrites only the channels it read: no barrier needed
            tl.store(
                state + (j - 1) * stride_tap + cols, s.to(state_ptr.dtype.element_ty), mask=cmask
            )
    tl.store(state + (TAPS - 2) * stride_tap + cols, x.to(state_ptr.dtype.element_ty), mask=cmask)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    if SILU:
        acc = _silu(acc)
    tl.store(out_ptr + row * stride_out + cols, acc.to(out_ptr.dtype.element_ty), mask=cmask)


def _rowwise(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def causal_conv1d_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_state: torch.Tensor,
    slots: torch.Tensor,
    query_start_loc: torch.Tensor,
    *,
    max_query_len: int,
    activation: str | None,
) -> torch.Tensor:
    x, weight = _rowwise(x), _rowwise(weight)
    if conv_state.stride(-1) != 1 or conv_state.stride(1) != conv_state.shape[2]:
        raise ValueError("conv_state: expected rows contiguous per slot")
    taps = weight.shape[1]
    if taps - 1 > BLOCK_T:
        raise ValueError(f"weight: at most {BLOCK_T + 1} taps, got {taps}")
    num_tokens, channels = x.shape
    out = torch.zeros((num_tokens, channels), dtype=x.dtype, device=x.device)
    num_seqs = slots.shape[0]
    grid = (num_seqs, triton.cdiv(max(max_query_len, 1), BLOCK_T), triton.cdiv(channels, BLOCK_C))
    _conv_prefill[grid](
        x,
        weight,
        bias if bias is not None else weight,
        conv_state,
        slots,
        query_start_loc,
        out,
        channels,
        x.stride(0),
        out.stride(0),
        weight.stride(0),
        conv_state.stride(0),
        conv_state.stride(1),
        TAPS=taps,
        HAS_BIAS=bias is not None,
        SILU=activation == "silu",
        BT=BLOCK_T,
        BC=BLOCK_C,
    )
    return out


def causal_conv1d_update_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_state: torch.Tensor,
    slots: torch.Tensor,
    *,
    activation: str | None,
) -> torch.Tensor:
    x, weight = _rowwise(x), _rowwise(weight)
    if conv_state.stride(-1) != 1:
        raise ValueError("conv_state: expected contiguous channels")
    rows, channels = x.shape
    out = torch.empty((rows, channels), dtype=x.dtype, device=x.device)
    grid = (rows, triton.cdiv(channels, BLOCK_C))
    _conv_update[grid](
        x,
        weight,
        bias if bias is not None else weight,
        conv_state,
        slots,
        out,
        channels,
        x.stride(0),
        out.stride(0),
        weight.stride(0),
        conv_state.stride(0),
        conv_state.stride(1),
        TAPS=weight.shape[1],
        HAS_BIAS=bias is not None,
        SILU=activation == "silu",
        BC=BLOCK_C,
    )
    return out
