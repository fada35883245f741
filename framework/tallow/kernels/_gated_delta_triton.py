"""Triton kernels of :mod:`tallow.kernels.gated_delta` (same contracts; the torch references
and the chunked form's algebra are there).

Prefill runs two kernels:

1. ``_chunk_inverse``, one program per (sequence, chunk of ``CHUNK`` tokens, value head), all
   chunks at once: the inverse ``T = (I + A)^-1`` of the chunk's unit lower triangular system
   (``A_tj = beta_t exp(G_t - G_j) k_t . k_j``, ``j < t``) by forward elimination, stored per
   token row (``[tokens, Hv, CHUNK]`` float32, so no chunk numbering is needed);
2. ``_chunk_scan``, one program per (sequence, value head, block of value features), over the
   sequence's chunks in order, the state ``[Dk, BV]`` in registers: the corrections ``U = T
   (beta (V - e^G K S))``, the outputs ``(Q e^G) S + (Q K^T * decay) U`` and the next state
   ``e^G_C S + (K e^(G_C - G))^T U`` are matrix products.

Decode (``_step``): one program per (row, value head, block of value features), the gating,
the q/k normalisation and the update fused; the grid is fixed by the number of rows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .jit import step_jit

#: tokens of one chunk (the reference's chunk size; any size gives the same result)
CHUNK = 64
L2_EPS = 1e-6


def _features(d: int) -> int:
    """A tile size covering ``d`` features (tl.dot needs at least 16)."""
    return max(16, triton.next_power_of_2(d))


@triton.jit
def _load_rows(ptr, rows, mask, stride_t, cols, num_cols):
    return tl.load(
        ptr + rows[:, None] * stride_t + cols[None, :],
        mask=mask[:, None] & (cols < num_cols)[None, :],
        other=0.0,
    ).to(tl.float32)


@triton.jit
def _l2(x, QK_L2NORM: tl.constexpr):
    if QK_L2NORM:
        x = x / tl.sqrt(tl.sum(x * x, axis=1) + 1e-6)[:, None]
    return x


@triton.jit
def _span(qsl_ptr, seq):
    """(first row, token count) of sequence ``seq``."""
    start = tl.load(qsl_ptr + seq).to(tl.int64)
    return start, (tl.load(qsl_ptr + seq + 1) - start).to(tl.int32)


@triton.jit
def _gates(g_ptr, beta_ptr, rows, mask, stride_g, head):
    g = tl.load(g_ptr + rows * stride_g + head, mask=mask, other=0.0).to(tl.float32)
    beta = tl.load(beta_ptr + rows * stride_g + head, mask=mask, other=0.0).to(tl.float32)
    return tl.cumsum(g, axis=0), beta


@step_jit(
    values=("stride_kt", "stride_g"), pointers=("k_ptr", "g_ptr", "beta_ptr", "qsl_ptr", "inv_ptr")
)
def _chunk_inverse(
    k_ptr,
    g_ptr,
    beta_ptr,
    qsl_ptr,
    inv_ptr,
    stride_kt,
    stride_kh,
    stride_g,
    DK,
    HEADS_PER_K: tl.constexpr,
    QK_L2NORM: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    chunk = tl.program_id(1)
    head = tl.program_id(2)
    hv = tl.num_programs(2)
    start, length = _span(qsl_ptr, seq)
    if chunk * BT >= length:
        return
    r = tl.arange(0, BT)
    mask = chunk * BT + r < length
    rows = start + chunk * BT + r
    kcols = tl.arange(0, BK)
    k = _l2(
        _load_rows(k_ptr + (head // HEADS_PER_K) * stride_kh, rows, mask, stride_kt, kcols, DK),
        QK_L2NORM,
    )
    gc, beta = _gates(g_ptr, beta_ptr, rows, mask, stride_g, head)
    lower = r[:, None] > r[None, :]
    decay = tl.exp(tl.where(lower, gc[:, None] - gc[None, :], 0.0))
    a = tl.where(
        lower, tl.dot(k, tl.trans(k), input_precision=PRECISION) * decay * beta[:, None], 0.0
    )
    # forward elimination: row j of T is final once the rows above it have been subtracted
    t = tl.where(r[:, None] == r[None, :], 1.0, 0.0)
    for j in range(0, BT - 1):
        row_j = tl.sum(tl.where(r[:, None] == j, t, 0.0), axis=0)
        col_j = tl.sum(tl.where(r[None, :] == j, a, 0.0), axis=1)
        t -= col_j[:, None] * row_j[None, :]
    tl.store(inv_ptr + (rows[:, None] * hv + head) * BT + r[None, :], t, mask=mask[:, None])


@step_jit(
    values=("stride_qt", "stride_vt", "stride_g", "stride_ot"),
    pointers=(
        "q_ptr",
        "k_ptr",
        "v_ptr",
        "g_ptr",
        "beta_ptr",
        "inv_ptr",
        "state_ptr",
        "slots_ptr",
        "qsl_ptr",
        "out_ptr",
    ),
)
def _chunk_scan(
    q_ptr,
    k_ptr,
    v_ptr,
    g_ptr,
    beta_ptr,
    inv_ptr,
    state_ptr,
    slots_ptr,
    qsl_ptr,
    out_ptr,
    stride_qt,
    stride_qh,
    stride_vt,
    stride_vh,
    stride_g,
    stride_ot,
    stride_oh,
    DK,
    DV,
    scale,
    HEADS_PER_K: tl.constexpr,
    QK_L2NORM: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    vb = tl.program_id(2)
    hv = tl.num_programs(1)
    start, length = _span(qsl_ptr, seq)
    if length == 0:
        return
    slot = tl.load(slots_ptr + seq).to(tl.int64)
    kcols = tl.arange(0, BK)
    vcols = vb * BV + tl.arange(0, BV)
    smask = (kcols < DK)[:, None] & (vcols < DV)[None, :]
    s_ptrs = state_ptr + ((slot * hv + head) * DK + kcols[:, None]) * DV + vcols[None, :]
    s = tl.load(s_ptrs, mask=smask, other=0.0)
    r = tl.arange(0, BT)
    causal = r[:, None] >= r[None, :]
    kh = head // HEADS_PER_K
    for c in range(0, tl.cdiv(length, BT)):
        mask = c * BT + r < length
        rows = start + c * BT + r
        gc, beta = _gates(g_ptr, beta_ptr, rows, mask, stride_g, head)
        g_last = tl.sum(tl.where(r == BT - 1, gc, 0.0), axis=0)
        decay = tl.exp(tl.where(causal, gc[:, None] - gc[None, :], float("-inf")))
        k = _l2(_load_rows(k_ptr + kh * stride_qh, rows, mask, stride_qt, kcols, DK), QK_L2NORM)
        # q first, so that it is dead before the corrections are formed
        q = (
            _l2(_load_rows(q_ptr + kh * stride_qh, rows, mask, stride_qt, kcols, DK), QK_L2NORM)
            * scale
        )
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION) * decay
        o = tl.dot(q * tl.exp(gc)[:, None], s, input_precision=PRECISION)
        # U = T (beta (V - e^G K S)): the same as T (beta V) - T (beta e^G K) S, one product
        # fewer and no [BT, Dk] intermediate
        v = _load_rows(v_ptr + head * stride_vh, rows, mask, stride_vt, vcols, DV)
        known = tl.dot(k * tl.exp(gc)[:, None], s, input_precision=PRECISION)
        t = tl.load(
            inv_ptr + (rows[:, None] * hv + head) * BT + r[None, :], mask=mask[:, None], other=0.0
        )
        u = tl.dot(t, (v - known) * beta[:, None], input_precision=PRECISION)
        o += tl.dot(qk, u, input_precision=PRECISION)
        tl.store(
            out_ptr + rows[:, None] * stride_ot + head * stride_oh + vcols[None, :],
            o.to(out_ptr.dtype.element_ty),
            mask=mask[:, None] & (vcols < DV)[None, :],
        )
        s = s * tl.exp(g_last) + tl.dot(
            tl.trans(k * tl.exp(g_last - gc)[:, None]), u, input_precision=PRECISION
        )
    tl.store(s_ptrs, s, mask=smask)


@step_jit(
    values=("stride_qt", "stride_vt", "stride_at", "stride_ot"),
    pointers=("q_ptr", "k_ptr", "v_ptr", "a_ptr", "b_ptr", "state_ptr", "slots_ptr", "out_ptr"),
)
def _step(
    q_ptr,
    k_ptr,
    v_ptr,
    a_ptr,
    b_ptr,
    alog_ptr,
    dt_ptr,
    state_ptr,
    slots_ptr,
    out_ptr,
    stride_qt,
    stride_qh,
    stride_vt,
    stride_vh,
    stride_at,
    stride_ot,
    stride_oh,
    DK,
    DV,
    scale,
    HEADS_PER_K: tl.constexpr,
    QK_L2NORM: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    vb = tl.program_id(2)
    hv = tl.num_programs(1)
    slot = tl.load(slots_ptr + row).to(tl.int64)
    kcols = tl.arange(0, BK)
    vcols = vb * BV + tl.arange(0, BV)
    kmask = kcols < DK
    vmask = vcols < DV
    kh = head // HEADS_PER_K
    q = tl.load(q_ptr + row * stride_qt + kh * stride_qh + kcols, mask=kmask, other=0.0).to(
        tl.float32
    )
    k = tl.load(k_ptr + row * stride_qt + kh * stride_qh + kcols, mask=kmask, other=0.0).to(
        tl.float32
    )
    if QK_L2NORM:
        q = q / tl.sqrt(tl.sum(q * q, axis=0) + 1e-6)
        k = k / tl.sqrt(tl.sum(k * k, axis=0) + 1e-6)
    q = q * scale
    v = tl.load(v_ptr + row * stride_vt + head * stride_vh + vcols, mask=vmask, other=0.0).to(
        tl.float32
    )
    a = tl.load(a_ptr + row * stride_at + head).to(tl.float32)
    b = tl.load(b_ptr + row * stride_at + head).to(tl.float32)
    x = a + tl.load(dt_ptr + head).to(tl.float32)
    softplus = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))
    g = -tl.exp(tl.load(alog_ptr + head).to(tl.float32)) * softplus
    beta = 1.0 / (1.0 + tl.exp(-b))
    s_ptrs = state_ptr + ((slot * hv + head) * DK + kcols[:, None]) * DV + vcols[None, :]
    smask = kmask[:, None] & vmask[None, :]
    s = tl.load(s_ptrs, mask=smask, other=0.0) * tl.exp(g)
    delta = (v - tl.sum(s * k[:, None], axis=0)) * beta
    s += k[:, None] * delta[None, :]
    tl.store(s_ptrs, s, mask=smask)
    o = tl.sum(s * q[:, None], axis=0)
    tl.store(
        out_ptr + row * stride_ot + head * stride_oh + vcols,
        o.to(out_ptr.dtype.element_ty),
        mask=vmask,
    )


def _last_contiguous(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t if t.stride(-1) == 1 else t.contiguous() for t in tensors]


def chunk_gated_delta_rule_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    slots: torch.Tensor,
    query_start_loc: torch.Tensor,
    *,
    max_query_len: int,
    scale: float | None,
    qk_l2norm: bool,
) -> torch.Tensor:
    if not state.is_contiguous():
        raise ValueError("state: expected a contiguous tensor")
    if q.stride() != k.stride():
        q, k = q.contiguous(), k.contiguous()
    q, k, v = _last_contiguous(q, k, v)
    g, beta = g.float().contiguous(), beta.float().contiguous()
    tokens, hk, dk = q.shape
    hv, dv = v.shape[1], v.shape[2]
    scale = dk**-0.5 if scale is None else scale
    num_seqs = slots.shape[0]
    bk = _features(dk)
    bv = min(32, _features(dv))
    # float32 models get exact float32 products; 16-bit ones tf32 (tensor cores), finer than
    # their inputs. Eight warps: a chunk's q, k and state tiles are float32 (64 x 128 each).
    precision = "ieee" if v.dtype == torch.float32 else "tf32"
    inverse = torch.empty((tokens, hv, CHUNK), dtype=torch.float32, device=q.device)
    _chunk_inverse[(num_seqs, triton.cdiv(max(max_query_len, 1), CHUNK), hv)](
        k,
        g,
        beta,
        query_start_loc,
        inverse,
        k.stride(0),
        k.stride(1),
        g.stride(0),
        dk,
        HEADS_PER_K=hv // hk,
        QK_L2NORM=qk_l2norm,
        BT=CHUNK,
        BK=bk,
        PRECISION=precision,
        num_warps=8,
    )
    out = torch.zeros((tokens, hv, dv), dtype=v.dtype, device=v.device)
    _chunk_scan[(num_seqs, hv, triton.cdiv(dv, bv))](
        q,
        k,
        v,
        g,
        beta,
        inverse,
        state,
        slots,
        query_start_loc,
        out,
        q.stride(0),
        q.stride(1),
        v.stride(0),
        v.stride(1),
        g.stride(0),
        out.stride(0),
        out.stride(1),
        dk,
        dv,
        scale,
        HEADS_PER_K=hv // hk,
        QK_L2NORM=qk_l2norm,
        BT=CHUNK,
        BK=bk,
        BV=bv,
        PRECISION=precision,
        num_warps=8,
        # a pipelined chunk loop keeps three chunks' float32 q, k, v and T tiles in shared
        # memory (~264 KB), more than a Hopper SM has; 16-bit tiles fit (~156 KB)
        num_stages=1 if v.dtype == torch.float32 else 3,
    )
    return out


def gated_delta_step_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    slots: torch.Tensor,
    *,
    scale: float | None,
    qk_l2norm: bool,
) -> torch.Tensor:
    if not state.is_contiguous():
        raise ValueError("state: expected a contiguous tensor")
    if q.stride() != k.stride():
        q, k = q.contiguous(), k.contiguous()
    q, k, v = _last_contiguous(q, k, v)
    if a.stride() != b.stride() or a.stride(-1) != 1:
        a, b = a.contiguous(), b.contiguous()
    rows, hk, dk = q.shape
    hv, dv = v.shape[1], v.shape[2]
    scale = dk**-0.5 if scale is None else scale
    bv = min(32, _features(dv))
    out = torch.empty((rows, hv, dv), dtype=v.dtype, device=v.device)
    _step[(rows, hv, triton.cdiv(dv, bv))](
        q,
        k,
        v,
        a,
        b,
        A_log,
        dt_bias,
        state,
        slots,
        out,
        q.stride(0),
        q.stride(1),
        v.stride(0),
        v.stride(1),
        a.stride(0),
        out.stride(0),
        out.stride(1),
        dk,
        dv,
        scale,
        HEADS_PER_K=hv // hk,
        QK_L2NORM=qk_l2norm,
        BK=_features(dk),
        BV=bv,
    )
    return out
