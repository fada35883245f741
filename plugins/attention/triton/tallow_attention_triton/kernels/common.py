"""Device helpers shared by the prefill and decode kernels.

Scores are kept in the log2 domain (``exp2`` is one instruction; ``exp`` is ``exp2`` of a
product), so callers pass ``qk_scale`` and ``softcap`` pre-multiplied as
:func:`tallow_attention_triton.ops.score_constants` describes.
"""

from __future__ import annotations

import triton
import triton.language as tl


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
def scores(q, k, qk_scale, softcap, USE_SOFTCAP: tl.constexpr, PRECISION: tl.constexpr,
           UPCAST: tl.constexpr):
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
def kv_offsets(block_table_row, offs_n, n_mask, stride_cb, stride_co, kv_head_off,
               BLOCK_SIZE: tl.constexpr):
    """Element offsets [N] of context tokens ``offs_n`` of one sequence and one KV head in a
    cache of strides (block, offset-in-block); tokens outside ``n_mask`` read block 0."""
    blk = tl.load(block_table_row + offs_n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
    return blk * stride_cb + (offs_n % BLOCK_SIZE) * stride_co + kv_head_off


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
