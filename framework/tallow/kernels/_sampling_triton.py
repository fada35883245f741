"""Triton sampling kernels: sparse logit edits and fused temperature + Gumbel-noise argmax.

They repeat, operation for operation, the torch references in ``sampling.py`` and
``gumbel.py``, and are launched with floating-point contraction off so that no multiply-add is
fused: the chosen token is then the same as the reference's, bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .logit_edits import LogitEdits

_EDIT_BLOCK = 256
_VOCAB_BLOCK = 1024


@triton.jit
def _mix32(x):
    """lowbias32 on uint32 (wrapping multiplies: the reference's split products mod 2**32)."""
    x = x ^ (x >> 16)
    x = x * tl.full((), 0x7FEB352D, tl.uint32)
    x = x ^ (x >> 15)
    x = x * tl.full((), 0x846CA68B, tl.uint32)
    x = x ^ (x >> 16)
    return x


@triton.jit
def _log_f32(x):
    """``gumbel.log_f32``: exponent/mantissa split and an atanh series, float32 mul/add only
    plus one correctly rounded division."""
    bits = x.to(tl.int32, bitcast=True)
    e = (bits >> 23) - 127
    m = ((bits & 0x7FFFFF) | 0x3F800000).to(tl.float32, bitcast=True)
    big = m > 1.4142135381698608
    m = tl.where(big, m * 0.5, m)
    e = tl.where(big, e + 1, e)
    s = tl.math.div_rn(m - 1.0, m + 1.0)
    s2 = s * s
    p = s2 * 0.09090909361839294 + 0.1111111119389534
    p = p * s2 + 0.1428571492433548
    p = p * s2 + 0.20000000298023224
    p = p * s2 + 0.3333333432674408
    p = p * s2 + 1.0
    t = s * p
    t = t + t
    return t + e.to(tl.float32) * 0.6931471824645996


@triton.jit
def _gumbel(offs, key1, key2):
    """Gumbel noise of token indices ``offs`` under a row's keys (``gumbel.gumbel_noise_ref``)."""
    h = _mix32(_mix32(offs.to(tl.uint32) ^ key1) ^ key2)
    u = ((h >> 9) * 2 + 1).to(tl.float32) * 5.960464477539063e-08
    return -_log_f32(-_log_f32(u))


@triton.jit
def _gumbel_noise_kernel(key1_ptr, key2_ptr, out_ptr, vocab, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    key1 = tl.load(key1_ptr + row).to(tl.uint32)
    key2 = tl.load(key2_ptr + row).to(tl.uint32)
    tl.store(
        out_ptr + row.to(tl.int64) * vocab + offs, _gumbel(offs, key1, key2), mask=offs < vocab
    )


@triton.jit
def _gumbel_argmax_kernel(
    logits_ptr,
    stride_row,
    inv_temp_ptr,
    greedy_ptr,
    key1_ptr,
    key2_ptr,
    part_max_ptr,
    part_idx_ptr,
    vocab,
    n_chunks,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    valid = offs < vocab
    logits = tl.load(
        logits_ptr + row.to(tl.int64) * stride_row + offs, mask=valid, other=float("-inf")
    )
    scores = logits
    if tl.load(greedy_ptr + row) == 0:
        key1 = tl.load(key1_ptr + row).to(tl.uint32)
        key2 = tl.load(key2_ptr + row).to(tl.uint32)
        scores = logits * tl.load(inv_temp_ptr + row) + _gumbel(offs, key1, key2)
    scores = tl.where(valid, scores, float("-inf"))
    best = tl.max(scores, axis=0)
    where = tl.argmax(scores, axis=0, tie_break_left=True)
    tl.store(part_max_ptr + row * n_chunks + chunk, best)
    tl.store(part_idx_ptr + row * n_chunks + chunk, (chunk * BLOCK + where).to(tl.int64))


@triton.jit
def _logit_edits_kernel(
    logits_ptr,
    stride_row,
    rows_ptr,
    tokens_ptr,
    bias_ptr,
    masked_ptr,
    counts_ptr,
    in_rep_ptr,
    rep_ptr,
    freq_ptr,
    pres_ptr,
    n_entries,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    valid = offs < n_entries
    row = tl.load(rows_ptr + offs, mask=valid, other=0)
    tok = tl.load(tokens_ptr + offs, mask=valid, other=0)
    ptrs = logits_ptr + row * stride_row + tok
    v = tl.load(ptrs, mask=valid, other=0.0)
    v = v + tl.load(bias_ptr + offs, mask=valid, other=0.0)
    masked = tl.load(masked_ptr + offs, mask=valid, other=0)
    v = tl.where(masked != 0, float("-inf"), v)
    rep = tl.load(rep_ptr + row, mask=valid, other=1.0)
    penalised = tl.where(v > 0, tl.math.div_rn(v, rep), v * rep)
    in_rep = tl.load(in_rep_ptr + offs, mask=valid, other=0)
    v = tl.where(in_rep != 0, penalised, v)
    count = tl.load(counts_ptr + offs, mask=valid, other=0.0)
    v = v - count * tl.load(freq_ptr + row, mask=valid, other=0.0)
    v = v - (count > 0).to(tl.float32) * tl.load(pres_ptr + row, mask=valid, other=0.0)
    tl.store(ptrs, v, mask=valid)


def _check_logits(logits: torch.Tensor) -> None:
    if logits.dtype != torch.float32 or logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(
            f"logits: expected a 2-D float32 tensor with unit last stride, got "
            f"{logits.dtype} {tuple(logits.shape)} strides {logits.stride()}"
        )


def gumbel_argmax_triton(
    logits: torch.Tensor,
    inv_temperature: torch.Tensor,
    greedy: torch.Tensor,
    key1: torch.Tensor,
    key2: torch.Tensor,
) -> torch.Tensor:
    """Triton version of ``gumbel.gumbel_argmax_ref`` (same contract, same tokens)."""
    _check_logits(logits)
    n, vocab = logits.shape
    out = torch.empty(n, dtype=torch.int64, device=logits.device)
    if n == 0:
        return out
    block = min(_VOCAB_BLOCK, triton.next_power_of_2(vocab))
    n_chunks = triton.cdiv(vocab, block)
    part_max = torch.empty(n, n_chunks, dtype=torch.float32, device=logits.device)
    part_idx = torch.empty(n, n_chunks, dtype=torch.int64, device=logits.device)
    _gumbel_argmax_kernel[(n, n_chunks)](
        logits,
        logits.stride(0),
        inv_temperature.float().contiguous(),
        greedy.to(torch.int8).contiguous(),
        key1.contiguous(),
        key2.contiguous(),
        part_max,
        part_idx,
        vocab,
        n_chunks,
        BLOCK=block,
        enable_fp_fusion=False,
    )
    # The first chunk holding the row maximum holds its lowest-index maximum.
    best_chunk = part_max.argmax(dim=1, keepdim=True)
    return part_idx.gather(1, best_chunk).squeeze(1)


def gumbel_noise_triton(key1: torch.Tensor, key2: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Triton version of ``gumbel.gumbel_noise_ref`` (equal to the bit)."""
    n = key1.shape[0]
    out = torch.empty(n, vocab_size, dtype=torch.float32, device=key1.device)
    if n == 0 or vocab_size == 0:
        return out
    block = min(_VOCAB_BLOCK, triton.next_power_of_2(vocab_size))
    _gumbel_noise_kernel[(n, triton.cdiv(vocab_size, block))](
        key1.contiguous(), key2.contiguous(), out, vocab_size, BLOCK=block, enable_fp_fusion=False
    )
    return out


def apply_logit_edits_triton(logits: torch.Tensor, edits: LogitEdits) -> None:
    """Triton version of ``sampling.apply_logit_edits_ref`` (in place, same values)."""
    _check_logits(logits)
    n_entries = edits.num_entries
    if n_entries == 0:
        return
    _logit_edits_kernel[(triton.cdiv(n_entries, _EDIT_BLOCK),)](
        logits,
        logits.stride(0),
        edits.rows,
        edits.tokens,
        edits.bias,
        edits.masked.to(torch.int8),
        edits.counts,
        edits.in_rep.to(torch.int8),
        edits.repetition_penalty,
        edits.frequency_penalty,
        edits.presence_penalty,
        n_entries,
        BLOCK=_EDIT_BLOCK,
        enable_fp_fusion=False,
    )
