"""Device helpers shared by the prefill and decode kernels.

Scores are kept in the log2 domain (``exp2`` is one instruction; ``exp`` is ``exp2`` of a
product), so callers pass ``qk_scale`` and ``softcap`` pre-multiplied as
:func:`tallow_attention_triton.ops.score_constants` describes.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def saturate(x, LIMIT: tl.constexpr):
    """``x`` clamped to [-LIMIT, LIMIT] (in fp32) when LIMIT > 0, else unchanged: values bound
    for an 8-bit float cache, whose casts have no infinity to overflow to (LIMIT is
    :func:`tallow.kernels.kv_cache.cache_saturation` of the cache dtype)."""
    if LIMIT > 0:
        x = tl.minimum(tl.maximum(x.to(tl.float32), -LIMIT), LIMIT)
    return x


@triton.jit
def first_visible_key(pos, window, CHUNKED: tl.constexpr):
    """The first key position a query at ``pos`` sees on a layer with a window of ``window``
    tokens: the last ``window`` keys up to it (a sliding window), or with ``CHUNKED`` the keys
    of its own ``window``-token chunk (chunked local attention: positions
    ``[pos - pos % window, pos]``). Negative for a sliding window near the start: callers
    clamp at 0 where it bounds a loop."""
    if CHUNKED:
        return pos - pos % window
    return pos - window + 1


@triton.jit
def tanh(x):
    """tanh through one exp2; exp2 overflowing to inf (or to 0) gives exactly +1 (or -1)."""
    e = tl.exp2(x * 2.8853900817779268)  # 2 * log2(e)
    return 1.0 - 2.0 / (e + 1.0)


@triton.jit
def dot(a, b, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """``a @ b`` accumulated in fp32.

    ``UPCAST`` widens the operands to fp32 first: only set for bf16 under the Triton
    interpreter, whose matmul reads bf16 storage as integers.
    """
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def scores(
    q,
    k,
    qk_scale,
    softcap,
    USE_SOFTCAP: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """log2-domain attention scores of ``q`` [M, D] against ``k`` [N, D] -> [M, N] fp32.

    Without softcap: ``qk * qk_scale`` with qk_scale = scale * log2(e). With softcap c:
    ``softcap * tanh(qk * qk_scale)`` with qk_scale = scale / c and softcap = c * log2(e).
    """
    s = dot(q, tl.trans(k), PRECISION, UPCAST)
    if USE_SOFTCAP:
        s = softcap * tanh(s * qk_scale)
    else:
        s = s * qk_scale
    return s


@triton.jit
def scaled_scores(
    q,
    k,
    key_scale,
    qk_scale,
    softcap,
    USE_SOFTCAP: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """:func:`scores` of ``q`` against keys ``k`` [N, D] stored as codes, each key's scale
    ``key_scale`` [N] multiplying its column of products (before the softcap)."""
    s = dot(q, tl.trans(k), PRECISION, UPCAST) * key_scale[None, :]
    if USE_SOFTCAP:
        s = softcap * tanh(s * qk_scale)
    else:
        s = s * qk_scale
    return s


@triton.jit
def online_softmax_step_scaled(
    acc, l_i, m_i, s, v, value_scale, PRECISION: tl.constexpr, UPCAST: tl.constexpr
):
    """:func:`online_softmax_step` for values ``v`` [N, D] stored as codes with scales
    ``value_scale`` [N]: the scales multiply the softmax weights' columns before the product
    (the row sums take the weights alone)."""
    pv, alpha, l_i, m_new = scaled_weights(l_i, m_i, s, value_scale, v.dtype)
    acc = acc * alpha[:, None] + dot(pv, v, PRECISION, UPCAST)
    return acc, l_i, m_new


@triton.jit
def scaled_weights(l_i, m_i, s, value_scale, DTYPE: tl.constexpr):
    """The online softmax's step for log2-domain scores ``s`` [M, N] over values stored as
    codes with scales ``value_scale`` [N]: (softmax weights times the scales, in ``DTYPE``,
    for the product with the codes; the factor that rescales the accumulator; the new row sum;
    the new row max)."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.exp2(s - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    return (p * value_scale[None, :]).to(DTYPE), alpha, l_i, m_new


@triton.jit
def online_softmax_step(acc, l_i, m_i, s, v, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """Fold one tile of log2-domain scores ``s`` [M, N] (masked entries -inf) and its values
    ``v`` [N, D] into the running (acc, row sum, row max).

    ``m_i`` starts at a large finite negative number rather than -inf, so a row whose every
    score so far is masked keeps ``p == 0`` and ``alpha == 1`` instead of producing NaN.
    """
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.exp2(s - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + dot(p.to(v.dtype), v, PRECISION, UPCAST)
    return acc, l_i, m_new


@triton.jit
def online_softmax_step_lazy(acc, l_i, m_i, s, v, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """:func:`online_softmax_step` that rescales the accumulator only when some row's maximum
    grew by more than 8 (log2 domain) since the last rescale: otherwise the old maximum stays
    the reference, and the tile's weights, at most 2^8, are as exact in fp16 as below 1
    (accumulator and row sum stay consistent, so the result is the same). Rescaling touches
    the whole padded accumulator: 64 multiplies per thread per tile of a one-warp decode
    program at head size 128, out of ~840 instructions (sm_90 SASS)."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    if tl.max(m_new - m_i, 0) > 8.0:
        alpha = tl.exp2(m_i - m_new)
        acc = acc * alpha[:, None]
        l_i = l_i * alpha
        m_i = m_new
    p = tl.exp2(s - m_i[:, None])
    l_i = l_i + tl.sum(p, 1)
    acc = acc + dot(p.to(v.dtype), v, PRECISION, UPCAST)
    return acc, l_i, m_i


@triton.jit
def sink_mass(sinks_ptr, heads, m, mask, USE_SINKS: tl.constexpr):
    """What the attention sinks of query ``heads`` add to the online softmax's row sums whose
    log2-domain row maxima are ``m``: ``2 ** (sink * log2(e) - m)`` (a sink is a natural-log
    logit of the head that joins the denominator and has no value), or 0 without sinks."""
    if USE_SINKS:
        sink = tl.load(sinks_ptr + heads, mask=mask, other=float("-inf")).to(tl.float32)
        return tl.exp2(sink * 1.4426950408889634 - m)
    return tl.zeros_like(m)


@triton.jit
def kv_offsets(
    block_table_row, offs_n, n_mask, stride_cb, stride_co, kv_head_off, BLOCK_SIZE: tl.constexpr
):
    """Element offsets [N] of context tokens ``offs_n`` of one sequence and one KV head in a
    cache of strides (block, offset-in-block); tokens outside ``n_mask`` read block 0."""
    blk = tl.load(block_table_row + offs_n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
    return blk * stride_cb + (offs_n % BLOCK_SIZE) * stride_co + kv_head_off


@triton.jit
def turbo_offsets(
    block_table_row,
    offs_n,
    n_mask,
    stride_cb,
    stride_co,
    code_head_off,
    stride_sb,
    stride_so,
    kv_head,
    BLOCK_SIZE: tl.constexpr,
):
    """(code byte offsets, scale offsets) [N] of context tokens ``offs_n`` of one sequence and
    one KV head in a turbo cache (codes of strides (block, offset-in-block), scales of
    strides (block, offset-in-block) and 1 per head), from one read of the block table;
    tokens outside ``n_mask`` read block 0."""
    blk = tl.load(block_table_row + offs_n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
    pos = offs_n % BLOCK_SIZE
    return (
        blk * stride_cb + pos * stride_co + code_head_off,
        blk * stride_sb + pos * stride_so + kv_head,
    )


@triton.jit
def product_operand(q, F16: tl.constexpr):
    """``q`` in the dtype of the tile products. Over an 8-bit cache that is fp16 (``F16``):
    one instruction widens two fp8 values to fp16, while reaching bf16 takes one more per
    value, and the decode kernel is bound by that widening, not by memory. A bf16 ``q`` is
    clamped to fp16's range first; inside it the conversion is exact down to fp16's smallest
    normal (6.1e-5), below which it keeps fp16's subnormal steps (6e-8)."""
    if F16:
        q = tl.minimum(tl.maximum(q.to(tl.float32), -65504.0), 65504.0).to(tl.float16)
    return q


@triton.jit
def widen_fp8_in_ptx(x, anchor):
    """An 8-bit float tile (e4m3 or e5m2) widened to fp16 by inline PTX, four values per call:
    e4m3 pairs through ``cvt.rn.f16x2.e4m3x2`` (sm_89 and later, where the e4m3 cache is
    allowed at all); e5m2 bytes moved into the high bytes of fp16 (e5m2 is fp16's top byte).

    ``anchor``, an int32 tensor of the tile's shape that the PTX ignores, is there for Triton's
    layout choice: with an operand that comes from neither the load nor a constant, Triton
    widens the tile in registers and stages it as fp16 for the transposed tensor-core loads of
    the P.V product. Without one (a plain ``.to``, or this conversion alone) it moves the
    widening after its loads in the dot-operand layout, and the transposed product reads the
    8-bit tile one byte at a time. A ``tl.where`` after a plain widening also keeps it in
    registers, but costs two selects and two byte permutes per pair of values (sm_90 SASS)."""
    bits = x.to(tl.uint8, bitcast=True)
    if x.dtype == tl.float8e5:
        return tl.inline_asm_elementwise(
            "{ .reg .b32 z; mov.b32 z, 0; prmt.b32 $0, $2, z, 0x1404; "
            "prmt.b32 $1, $2, z, 0x3424; }",
            "=r,=r,r,r,r,r,r",
            [bits, anchor],
            dtype=tl.float16,
            is_pure=True,
            pack=4,
        )
    return tl.inline_asm_elementwise(
        "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.rn.f16x2.e4m3x2 $0, lo; "
        "cvt.rn.f16x2.e4m3x2 $1, hi; }",
        "=r,=r,r,r,r,r,r",
        [bits, anchor],
        dtype=tl.float16,
        is_pure=True,
        pack=4,
    )
