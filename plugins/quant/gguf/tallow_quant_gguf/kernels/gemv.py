"""The one-row quantized product (batch-1 decode): ``y = x @ W.T (+ b)`` for a single row x,
on the CUDA cores, in float32.

At batch 1 a decode step streams every weight once, and a quantized weight carries four to
eight times as many values per byte as a bf16 one: the kernel is fast only if it spends few
instructions per weight. So:

- A program owns ``BN`` output rows and ``num_warps`` warps; each iteration every thread takes
  one 32-element chunk of each of its rows (a 16-byte vector of 4-bit codes, 32 bytes of 8-bit
  codes), the warps side by side along K (``G = 32 * num_warps`` chunks per iteration). The
  thread reuses each activation it loads for its ``BN`` rows.
- Codes become float32 without a conversion instruction: a byte of codes is shifted so that
  one 4-bit field (or an 8-bit code) lands in bits 15..22 of a word whose exponent bits hold
  256.0, and that word, read as a float, *is* ``256 + q`` (or ``256 + 16q`` for the nibble
  above it, bits 19..22). One shift feeds two nibbles; a mask-and-or (``mask_lo``, ``mask_hi``,
  ``magic``, passed as runtime values so that the compiler keeps them in registers and forms
  one three-input logic instruction) and one fused multiply-add per weight remain.
  ``sum((256 + q) * x) = 256 * sum(x) + sum(q * x)``: the offset comes out once per chunk
  through the activation sums that the group minimums need anyway.
- The group scale and min are applied once per chunk and row, to the partial sums.
- The next iteration's codes and scales are loaded before the current ones are used
  (``PREFETCH``): two tiles of loads in flight per thread. With Programmatic Dependent Launch
  the first tile is requested before the kernel waits for the one that wrote x.
- Split-K (``n_split > 1``): each program sums a slice of K and the last one of a row block
  adds the slices (:mod:`~tallow_quant_gguf.kernels.splitk`).

``MODE`` picks the decoding: 1 for 4-bit codes alone (Q4_0, Q4_1, Q4_K), 2 for 8-bit codes
(Q8_0), 0 for every other type (the code assembled from its planes, then the same float
trick, or the IQ4 table). Every value is a float32 product of the exact code and the exact
activation; only the order of the float32 additions differs from the reference.

The activation of a gated MLP can be applied as x is read (``GATE``): x is then
``[gate | up]``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tallow.kernels import (
    ACTIVATION_KINDS as KINDS,
    allow_next,
    bit_constants,
    bits_as_float as _as_float,
    byte_to_bits_15 as _byte_to_bits_15,
    gated_value,
    pdl_enabled,
    step_jit,
    wait_prior,
)

from ..packing import PackedWeight
from .decode import (
    group_scales,
    load_codes,
    load_group_fields,
    plane_args,
    quad_range,
    quads_per_chunk,
    slot_code,
    slot_columns,
    type_constants,
)
from .splitk import counters, finish_tile, split_chunks, workspace

#: decoding modes (see the module docstring)
MODE_GENERIC, MODE_NIB, MODE_BYTE = 0, 1, 2


def gemv_mode(p: PackedWeight) -> int:
    qt = p.qtype
    if qt.byte:
        return MODE_BYTE
    if qt.nib and not (qt.pair or qt.bit or qt.lut) and qt.group == 32:
        return MODE_NIB
    return MODE_GENERIC


@triton.jit
def _load_x(xb, xmask, K, GATE: tl.constexpr, X_TY: tl.constexpr, MASKED: tl.constexpr):
    """Activations at ``xb`` (a ``[1, Q, 4]`` pointer tile) in float32; with a gate, the row is
    ``[gate | up]`` and the value ``act(gate) * up`` as the activation kernel rounds it."""
    if MASKED:
        x = tl.load(xb, mask=xmask, other=0.0)
    else:
        x = tl.load(xb)
    if GATE >= 0:
        if MASKED:
            up = tl.load(xb + K, mask=xmask, other=0.0)
        else:
            up = tl.load(xb + K)
        x = gated_value(x, up, GATE, X_TY)
    return x.to(tl.float32)


@triton.jit
def _load_tile(
    nib_ptr,
    pair_ptr,
    bit_ptr,
    byte_ptr,
    d_ptr,
    dm_ptr,
    sc_ptr,
    mn_ptr,
    rows,
    row_mask,
    q0,
    q_in,
    q_end,
    zero,
    u2,
    s_nib,
    s_pair,
    s_bit,
    s_byte,
    s_d,
    s_sc,
    NIB: tl.constexpr,
    PAIR: tl.constexpr,
    BIT: tl.constexpr,
    BYTE: tl.constexpr,
    GROUP: tl.constexpr,
    QBLOCK: tl.constexpr,
    SCALES: tl.constexpr,
    MINS: tl.constexpr,
    EVEN: tl.constexpr,
):
    """The codes (``[BN * Q, 4]``) and scale fields (``[BN * Q]``) of quads ``q0 + q_in`` of
    ``rows`` (the entries' rows: ``BN`` blocks of ``Q``). ``EVEN``: the tile is whole or wholly
    past ``q_end`` (then nothing is read)."""
    quads = q0 + q_in
    if EVEN:
        mask2 = q0 < q_end
        mask1 = mask2
    else:
        mask1 = row_mask & (quads < q_end)
        mask2 = mask1[:, None] & (u2 >= 0)
    nib, pair, bit, byte = load_codes(
        nib_ptr,
        pair_ptr,
        bit_ptr,
        byte_ptr,
        rows[:, None],
        quads[:, None],
        u2,
        mask2,
        s_nib,
        s_pair,
        s_bit,
        s_byte,
        NIB,
        PAIR,
        BIT,
        BYTE,
        not EVEN,
    )
    # ``zero`` (0 at run time) hides the alignment of these narrow loads from the compiler, so
    # that it reads one value per entry, in the code tile's layout (one quad per thread)
    chunks = (quads // 2 if BYTE else quads) + zero
    d, dm, sc0, sc1, mn = load_group_fields(
        d_ptr,
        dm_ptr,
        sc_ptr,
        mn_ptr,
        rows,
        chunks,
        mask1,
        s_d,
        s_sc,
        GROUP,
        QBLOCK,
        SCALES,
        MINS,
        not EVEN,
    )
    return nib, pair, bit, byte, d, dm, sc0, sc1, mn


@triton.jit
def _generic_slot(
    nib,
    pair,
    bit,
    byte,
    lut_ptr,
    x_ptr,
    q2,
    u2,
    xmask,
    K,
    magic,
    S: tl.constexpr,
    NIB: tl.constexpr,
    PAIR: tl.constexpr,
    BIT: tl.constexpr,
    BYTE: tl.constexpr,
    LUT: tl.constexpr,
    GATE: tl.constexpr,
    X_TY: tl.constexpr,
    EVEN: tl.constexpr,
):
    """Slot ``S`` of any type: (its values times x, x) for the program's ``[BN * Q, 4]`` tile.
    The assembled code placed in bits 15..22 reads as ``256 + q``; table types multiply their
    table values."""
    q = slot_code(nib, pair, bit, byte, S, NIB, PAIR, BIT, BYTE)
    xv = _load_x(x_ptr + slot_columns(q2, u2, S, BYTE), xmask, K, GATE, X_TY, not EVEN)
    if LUT:
        v = tl.load(lut_ptr + q)
    else:
        v = (q * 32768 + magic).to(tl.float32, bitcast=True)
    return v * xv, xv


@triton.jit
def rows_dot(
    x_ptr,
    nib_ptr,
    pair_ptr,
    bit_ptr,
    byte_ptr,
    d_ptr,
    dm_ptr,
    sc_ptr,
    mn_ptr,
    lut_ptr,
    tile,
    rows,
    row_mask,
    q_in,
    q_begin,
    q_end,
    zero,
    K,
    s_nib,
    s_pair,
    s_bit,
    s_byte,
    s_d,
    s_sc,
    mask_lo,
    mask_hi,
    magic_lo,
    magic_hi,
    BN: tl.constexpr,
    Q: tl.constexpr,
    NIB: tl.constexpr,
    PAIR: tl.constexpr,
    BIT: tl.constexpr,
    BYTE: tl.constexpr,
    OFFSET: tl.constexpr,
    LUT: tl.constexpr,
    GROUP: tl.constexpr,
    QBLOCK: tl.constexpr,
    SCALES: tl.constexpr,
    MINS: tl.constexpr,
    MODE: tl.constexpr,
    PREFETCH: tl.constexpr,
    EVEN: tl.constexpr,
    GATE: tl.constexpr,
):
    """The float32 partial dot products ``[BN * Q]`` of the one activation row at ``x_ptr``
    with weight rows ``rows`` (``BN`` blocks of ``Q`` entries, one block per row) over quads
    ``q_begin .. q_end``: the GEMV's loop, shared by every kernel that streams quantized rows
    against one activation row (this module's GEMV, the experts of
    :mod:`~tallow_quant_gguf.kernels.moe`). With ``PREFETCH`` ``tile`` is the first tile
    (:func:`_load_tile` at ``q_begin``), loaded by the caller; otherwise it is unused. The
    caller sums each block of ``Q`` entries."""
    u2 = tl.arange(0, 4)[None, :]
    SLOTS: tl.constexpr = 4 if BYTE else 8
    X_TY: tl.constexpr = x_ptr.dtype.element_ty
    acc = tl.zeros((BN * Q,), dtype=tl.float32)
    for q0 in range(q_begin, q_end, Q):
        if PREFETCH:
            upcoming = _load_tile(
                nib_ptr,
                pair_ptr,
                bit_ptr,
                byte_ptr,
                d_ptr,
                dm_ptr,
                sc_ptr,
                mn_ptr,
                rows,
                row_mask,
                q0 + Q,
                q_in,
                q_end,
                zero,
                u2,
                s_nib,
                s_pair,
                s_bit,
                s_byte,
                s_d,
                s_sc,
                NIB,
                PAIR,
                BIT,
                BYTE,
                GROUP,
                QBLOCK,
                SCALES,
                MINS,
                EVEN,
            )
            current = tile
        else:
            current = _load_tile(
                nib_ptr,
                pair_ptr,
                bit_ptr,
                byte_ptr,
                d_ptr,
                dm_ptr,
                sc_ptr,
                mn_ptr,
                rows,
                row_mask,
                q0,
                q_in,
                q_end,
                zero,
                u2,
                s_nib,
                s_pair,
                s_bit,
                s_byte,
                s_d,
                s_sc,
                NIB,
                PAIR,
                BIT,
                BYTE,
                GROUP,
                QBLOCK,
                SCALES,
                MINS,
                EVEN,
            )
        nib, pair, bit, byte, d, dm, sc0, sc1, mn = current
        q2 = (q0 + q_in)[:, None]
        xmask = (q2 < q_end) & (u2 >= 0)
        scale, low_min = group_scales(d, dm, sc0, mn, SCALES, MINS)
        if MODE == 1:
            # 4-bit codes: slots 2p and 2p+1 are the nibbles of byte p of every word, read as
            # 256 + q and 16 + q; each sum starts from the first product
            xb = x_ptr + 32 * q2 + u2
            t = _byte_to_bits_15(nib, 0)
            x_lo = _load_x(xb, xmask, K, GATE, X_TY, not EVEN)
            x_hi = _load_x(xb + 4, xmask, K, GATE, X_TY, not EVEN)
            part = _as_float(t, mask_lo, magic_lo) * x_lo
            part += _as_float(t, mask_hi, magic_hi) * x_hi
            for p in tl.static_range(1, 4):
                t = _byte_to_bits_15(nib, p)
                xl = _load_x(xb + 8 * p, xmask, K, GATE, X_TY, not EVEN)
                xh = _load_x(xb + 8 * p + 4, xmask, K, GATE, X_TY, not EVEN)
                part += _as_float(t, mask_lo, magic_lo) * xl
                part += _as_float(t, mask_hi, magic_hi) * xh
                x_lo += xl
                x_hi += xh
            xs_lo = tl.sum(x_lo, axis=1)
            xs_hi = tl.sum(x_hi, axis=1)
            xsum = xs_lo + xs_hi
            # sum(q * x) = sum(v * x) - 256 * sum(x_lo) - 16 * sum(x_hi); the offset and the
            # min are per group, over all of the chunk's x
            base = 256.0 * xs_lo + 16.0 * xs_hi + OFFSET * xsum
            acc += scale * (tl.sum(part, axis=1) - base)
            if MINS != 0:
                acc -= low_min * xsum
        elif MODE == 2:
            # 8-bit codes stored as q + 128: 256 + (q + 128) per value
            xb = x_ptr + slot_columns(q2, u2, 0, BYTE)
            x8 = _load_x(xb, xmask, K, GATE, X_TY, not EVEN)
            p8 = _as_float(_byte_to_bits_15(byte, 0), mask_lo, magic_lo) * x8
            for p in tl.static_range(1, 4):
                xv = _load_x(xb + 8 * p, xmask, K, GATE, X_TY, not EVEN)
                p8 += _as_float(_byte_to_bits_15(byte, p), mask_lo, magic_lo) * xv
                x8 += xv
            xsum = tl.sum(x8, axis=1)
            acc += scale * (tl.sum(p8, axis=1) - (256.0 + OFFSET) * xsum)
        else:
            # any type: the assembled code placed in bits 15..22 gives 256 + q (table types
            # multiply their table values directly); 16-element groups keep their halves apart
            p_a, x_a = _generic_slot(
                nib,
                pair,
                bit,
                byte,
                lut_ptr,
                x_ptr,
                q2,
                u2,
                xmask,
                K,
                magic_lo,
                0,
                NIB,
                PAIR,
                BIT,
                BYTE,
                LUT,
                GATE,
                X_TY,
                EVEN,
            )
            for s in tl.static_range(1, SLOTS // 2 if GROUP == 16 else SLOTS):
                pv, xv = _generic_slot(
                    nib,
                    pair,
                    bit,
                    byte,
                    lut_ptr,
                    x_ptr,
                    q2,
                    u2,
                    xmask,
                    K,
                    magic_lo,
                    s,
                    NIB,
                    PAIR,
                    BIT,
                    BYTE,
                    LUT,
                    GATE,
                    X_TY,
                    EVEN,
                )
                p_a += pv
                x_a += xv
            if GROUP == 16:
                p_b, x_b = _generic_slot(
                    nib,
                    pair,
                    bit,
                    byte,
                    lut_ptr,
                    x_ptr,
                    q2,
                    u2,
                    xmask,
                    K,
                    magic_lo,
                    SLOTS // 2,
                    NIB,
                    PAIR,
                    BIT,
                    BYTE,
                    LUT,
                    GATE,
                    X_TY,
                    EVEN,
                )
                for s in tl.static_range(SLOTS // 2 + 1, SLOTS):
                    pv, xv = _generic_slot(
                        nib,
                        pair,
                        bit,
                        byte,
                        lut_ptr,
                        x_ptr,
                        q2,
                        u2,
                        xmask,
                        K,
                        magic_lo,
                        s,
                        NIB,
                        PAIR,
                        BIT,
                        BYTE,
                        LUT,
                        GATE,
                        X_TY,
                        EVEN,
                    )
                    p_b += pv
                    x_b += xv
            base: tl.constexpr = 0.0 if LUT else 256.0 + OFFSET
            xs_a = tl.sum(x_a, axis=1)
            acc += scale * (tl.sum(p_a, axis=1) - base * xs_a)
            if MINS != 0:
                acc -= low_min * xs_a
            if GROUP == 16:
                scale_b, low_min_b = group_scales(d, dm, sc1, mn, SCALES, MINS)
                xs_b = tl.sum(x_b, axis=1)
                acc += scale_b * (tl.sum(p_b, axis=1) - base * xs_b)
                if MINS != 0:
                    acc -= low_min_b * xs_b
        if PREFETCH:
            tile = upcoming

    return acc


@step_jit(
    values=["quads_per_split", "n_split", "zero"], pointers=["x_ptr", "y_ptr", "b_ptr", "ws_ptr"]
)
def _gemv_kernel(
    x_ptr,
    nib_ptr,
    pair_ptr,
    bit_ptr,
    byte_ptr,
    d_ptr,
    dm_ptr,
    sc_ptr,
    mn_ptr,
    lut_ptr,
    b_ptr,
    y_ptr,
    ws_ptr,
    cnt_ptr,
    N,
    K,
    quads_per_split,
    n_split,
    zero,
    s_nib,
    s_pair,
    s_bit,
    s_byte,
    s_d,
    s_sc,
    mask_lo,
    mask_hi,
    magic_lo,
    magic_hi,
    BN: tl.constexpr,
    Q: tl.constexpr,
    NIB: tl.constexpr,
    PAIR: tl.constexpr,
    BIT: tl.constexpr,
    BYTE: tl.constexpr,
    OFFSET: tl.constexpr,
    LUT: tl.constexpr,
    GROUP: tl.constexpr,
    QBLOCK: tl.constexpr,
    SCALES: tl.constexpr,
    MINS: tl.constexpr,
    MODE: tl.constexpr,
    PREFETCH: tl.constexpr,
    EVEN: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SPLIT: tl.constexpr,
    GATE: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    # the program's entries are BN blocks of Q quads, one block per row: the compiler lays the
    # quads across the threads and repeats the blocks in each thread, so every thread holds
    # the same quad of each of its BN rows (and loads that quad's activations once: the
    # repeated loads of one address are merged)
    entry = tl.arange(0, BN * Q)
    q_in = entry % Q
    rows = pid_n * BN + entry // Q
    row_mask = rows < N
    q_begin, q_end = quad_range(pid_k, quads_per_split, K, BYTE)
    u2 = tl.arange(0, 4)[None, :]

    if PREFETCH:  # the weights are no kernel's output: requested before the wait for x
        tile = _load_tile(
            nib_ptr,
            pair_ptr,
            bit_ptr,
            byte_ptr,
            d_ptr,
            dm_ptr,
            sc_ptr,
            mn_ptr,
            rows,
            row_mask,
            q_begin,
            q_in,
            q_end,
            zero,
            u2,
            s_nib,
            s_pair,
            s_bit,
            s_byte,
            s_d,
            s_sc,
            NIB,
            PAIR,
            BIT,
            BYTE,
            GROUP,
            QBLOCK,
            SCALES,
            MINS,
            EVEN,
        )
    else:
        tile = (0, 0, 0, 0, 0, 0, 0, 0, 0)
    wait_prior(USE_PDL)
    allow_next(USE_PDL)
    acc = rows_dot(
        x_ptr,
        nib_ptr,
        pair_ptr,
        bit_ptr,
        byte_ptr,
        d_ptr,
        dm_ptr,
        sc_ptr,
        mn_ptr,
        lut_ptr,
        tile,
        rows,
        row_mask,
        q_in,
        q_begin,
        q_end,
        zero,
        K,
        s_nib,
        s_pair,
        s_bit,
        s_byte,
        s_d,
        s_sc,
        mask_lo,
        mask_hi,
        magic_lo,
        magic_hi,
        BN,
        Q,
        NIB,
        PAIR,
        BIT,
        BYTE,
        OFFSET,
        LUT,
        GROUP,
        QBLOCK,
        SCALES,
        MINS,
        MODE,
        PREFETCH,
        EVEN,
        GATE,
    )

    y = tl.sum(tl.reshape(acc, (BN, Q)), axis=1)[None, :]
    out_rows = pid_n * BN + tl.arange(0, BN)
    out_mask = out_rows < N
    offs_m = tl.arange(0, 1)
    mask = out_mask[None, :]
    if SPLIT:
        finish_tile(
            y,
            ws_ptr,
            cnt_ptr,
            pid_n,
            pid_k,
            n_split,
            offs_m,
            out_rows,
            out_mask,
            mask,
            N,
            N,
            y_ptr,
            N,
            b_ptr,
            HAS_BIAS,
        )
    else:
        if HAS_BIAS:
            y += tl.load(b_ptr + out_rows, mask=out_mask, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + out_rows[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


#: (rows per program, warps, K slices, prefetch): the starting point where no tuned entry exists
DEFAULT_GEMV = (4, 1, 1, True)
#: elements a plane may have: the kernels index them with 32-bit offsets
MAX_PLANE_ELEMENTS = 2**31 - 1


def check_offsets(p: PackedWeight) -> None:
    """The kernels address planes with 32-bit offsets: refuse a weight too large for that."""
    big = max(t.numel() for t in p.planes.values())
    if big > MAX_PLANE_ELEMENTS:
        raise ValueError(
            f"quantized matmul: a {p.type_name} weight of [{p.rows}, {p.cols}] "
            f"has a plane of {big} elements, more than 32-bit offsets address"
        )


def gemv_triton(
    x: torch.Tensor,
    p: PackedWeight,
    bias: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
    gate: str | None = None,
    config: tuple[int, int, int, bool] | None = None,
) -> torch.Tensor:
    """``x [1, K] @ W.T (+ bias)`` → ``[1, N]`` in x's dtype (``x [1, 2K]`` with ``gate``).
    ``out`` (``[1, N]``, contiguous, e.g. a column slice of a wider output's single row)
    receives it in place. ``config`` is ``(rows per program, warps, K slices, prefetch)``."""
    if x.shape[0] != 1:
        raise ValueError(f"gemv: expected one row of x, got {x.shape[0]}")
    n, k = p.rows, p.cols
    check_offsets(p)
    if x.stride(-1) != 1:
        x = x.contiguous()
    if out is None:
        out = torch.empty(1, n, dtype=x.dtype, device=x.device)
    bn, warps, splits, prefetch = config or DEFAULT_GEMV
    q = 32 * warps
    n_quads = k // 32 * quads_per_chunk(p)
    per, n_split = split_chunks(n_quads, q, splits)
    grid_n = triton.cdiv(n, bn)
    split = n_split > 1
    ws = workspace(n_split, 1, n, x.device) if split else out
    cnt = counters(x.device) if split else ws
    if split and grid_n > cnt.numel():
        raise ValueError(f"gemv: {grid_n} row blocks exceed the {cnt.numel()} split counters")
    mode = gemv_mode(p)
    ptrs, strides = plane_args(p)
    use_pdl = pdl_enabled(x)
    even = n % bn == 0 and per % q == 0 and n_quads % per == 0
    _gemv_kernel[(grid_n, n_split)](
        x,
        *ptrs,
        bias if bias is not None else ptrs[4],
        out,
        ws,
        cnt,
        n,
        k,
        per,
        n_split,
        0,
        *strides,
        *bit_constants(mode == MODE_BYTE),
        BN=bn,
        Q=q,
        **type_constants(p),
        MODE=mode,
        PREFETCH=prefetch,
        EVEN=even,
        HAS_BIAS=bias is not None,
        SPLIT=split,
        GATE=-1 if gate is None else KINDS[gate],
        USE_PDL=use_pdl,
        num_warps=warps,
        num_stages=1,
        launch_pdl=use_pdl,
    )
    return out
