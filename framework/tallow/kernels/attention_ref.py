"""Plain-torch paged attention: the reference every attention kernel is checked against, and
the CPU path of the engine. The cache is read through its codec's reference ``decode``, so
every KV codec is served here.

Memory is bounded whatever the context: when the ``[heads, queries, keys]`` float32 score
matrix would exceed ``max_score_elements``, the queries and keys are taken in blocks and the
softmax is accumulated online over the key blocks (running maximum, running sum, rescaled
output), so the work space stays near ``max_score_elements`` floats for any prompt length.
Smaller problems take the direct formula in one piece.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # pragma: no cover
    from .kv_cache import LayerKVCache

#: the largest score matrix (heads × queries × keys, float32) computed in one piece: 32 MiB
MAX_SCORE_ELEMENTS = 1 << 23
#: the most keys of one block of the blocked path
_MAX_KEY_BLOCK = 1024


def _mask(
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    context_len: int,
    causal: bool,
    sliding_window: int | None,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """Which keys each query sees: [Q, 1] query and [1, S] key positions → [Q, S] bool."""
    allowed = k_pos <= q_pos if causal else k_pos < context_len
    if sliding_window:
        allowed = allowed & (q_pos - k_pos < sliding_window)
    if chunk_size:
        allowed = allowed & (
            torch.div(q_pos, chunk_size, rounding_mode="floor")
            == torch.div(k_pos, chunk_size, rounding_mode="floor")
        )
    return allowed


def _scores(
    qf: torch.Tensor, kf: torch.Tensor, scale: float, logit_softcap: float | None
) -> torch.Tensor:
    scores = torch.matmul(qf, kf.transpose(1, 2)) * scale
    if logit_softcap:
        scores = logit_softcap * torch.tanh(scores / logit_softcap)
    return scores


def attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
    context_len: int,
    sliding_window: int | None = None,
    logit_softcap: float | None = None,
    causal: bool = True,
    sinks: torch.Tensor | None = None,
    attention_chunk_size: int | None = None,
    max_score_elements: int = MAX_SCORE_ELEMENTS,
) -> torch.Tensor:
    """Attention of the last ``q.shape[0]`` tokens of a sequence over its whole context.

    q [Q, Hq, D]; k, v [S, Hkv, D] with S = ``context_len``; query i sits at position
    ``S - Q + i`` and, when ``causal``, sees the keys up to that position; otherwise every
    query sees all ``S`` keys (bidirectional, as in encoders). ``sinks`` [Hq] (attention
    sinks): one more logit per head in every softmax, whose probability is dropped (it has no
    value), so the weights of the keys sum to less than one. ``attention_chunk_size``: a query
    sees only the keys of its own chunk of that many positions (Llama 4's chunked local
    attention). Computed in float32; returns q's
    dtype. A score matrix over ``max_score_elements`` floats is computed in blocks (see the
    module docstring).
    """
    n_q, n_heads, _ = q.shape
    if n_heads * n_q * context_len > max_score_elements:
        return _blocked_attention(
            q,
            k,
            v,
            scale=scale,
            context_len=context_len,
            sliding_window=sliding_window,
            logit_softcap=logit_softcap,
            causal=causal,
            sinks=sinks,
            chunk_size=attention_chunk_size,
            max_score_elements=max_score_elements,
        )
    group = n_heads // k.shape[1]
    qf = q.float().transpose(0, 1)  # [Hq, Q, D]
    kf = k.float().repeat_interleave(group, dim=1).transpose(0, 1)  # [Hq, S, D]
    vf = v.float().repeat_interleave(group, dim=1).transpose(0, 1)
    scores = _scores(qf, kf, scale, logit_softcap)  # [Hq, Q, S]
    q_pos = torch.arange(context_len - n_q, context_len, device=q.device)[:, None]
    k_pos = torch.arange(context_len, device=q.device)[None, :]
    allowed = _mask(q_pos, k_pos, context_len, causal, sliding_window, attention_chunk_size)
    scores = scores.masked_fill(~allowed, float("-inf"))
    if sinks is not None:
        sink = sinks.float().reshape(n_heads, 1, 1).expand(n_heads, n_q, 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs, vf)  # [Hq, Q, D]
    return out.transpose(0, 1).to(q.dtype)


def _blocked_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
    context_len: int,
    sliding_window: int | None,
    logit_softcap: float | None,
    causal: bool,
    sinks: torch.Tensor | None,
    max_score_elements: int,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """:func:`attention_ref` over query blocks × key blocks with an online softmax."""
    n_q, n_heads, _ = q.shape
    group = n_heads // k.shape[1]
    key_block = max(1, min(_MAX_KEY_BLOCK, math.isqrt(max(1, max_score_elements // n_heads))))
    query_block = max(1, max_score_elements // (n_heads * key_block))
    out = torch.empty(n_q, n_heads, v.shape[-1], dtype=q.dtype, device=q.device)
    first = context_len - n_q  # position of query 0
    for q0 in range(0, n_q, query_block):
        q1 = min(n_q, q0 + query_block)
        qf = q[q0:q1].float().transpose(0, 1)  # [Hq, qb, D]
        q_pos = torch.arange(first + q0, first + q1, device=q.device)[:, None]
        # only the keys some query of the block can see: none past the last query when causal,
        # none before the first query's window
        k_end = min(context_len, first + q1) if causal else context_len
        k_start = max(0, first + q0 - sliding_window + 1) if sliding_window else 0
        if chunk_size:  # nor before the first query's chunk
            k_start = max(k_start, (first + q0) // chunk_size * chunk_size)
        run_max = torch.full((n_heads, q1 - q0, 1), float("-inf"), device=q.device)
        run_sum = torch.zeros((n_heads, q1 - q0, 1), device=q.device)
        acc = torch.zeros((n_heads, q1 - q0, v.shape[-1]), device=q.device)
        for k0 in range(k_start, k_end, key_block):
            k1 = min(k_end, k0 + key_block)
            kf = k[k0:k1].float().repeat_interleave(group, dim=1).transpose(0, 1)
            vf = v[k0:k1].float().repeat_interleave(group, dim=1).transpose(0, 1)
            scores = _scores(qf, kf, scale, logit_softcap)  # [Hq, qb, kb]
            k_pos = torch.arange(k0, k1, device=q.device)[None, :]
            scores.masked_fill_(
                ~_mask(q_pos, k_pos, context_len, causal, sliding_window, chunk_size), float("-inf")
            )
            new_max = torch.maximum(run_max, scores.amax(dim=-1, keepdim=True))
            # a row with no visible key yet keeps a -inf maximum: shift it by 0 instead
            shift = torch.where(torch.isinf(new_max), torch.zeros_like(new_max), new_max)
            probs = torch.exp(scores - shift)
            rescale = torch.exp(run_max - shift)
            run_sum = run_sum * rescale + probs.sum(dim=-1, keepdim=True)
            acc = acc * rescale + torch.matmul(probs, vf)
            run_max = new_max
        if sinks is not None:  # the sink's logit joins the denominator only
            sink = sinks.float().reshape(n_heads, 1, 1)
            new_max = torch.maximum(run_max, sink)
            rescale = torch.exp(run_max - new_max)
            run_sum = run_sum * rescale + torch.exp(sink - new_max)
            acc = acc * rescale
        out[q0:q1] = (acc / run_sum).transpose(0, 1).to(q.dtype)
    return out


def paged_attention_ref(
    q: torch.Tensor,
    kv_cache: "LayerKVCache",
    *,
    query_start_loc: list[int],
    seq_lens: list[int],
    block_tables: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    logit_softcap: float | None = None,
    causal: bool = True,
    sinks: torch.Tensor | None = None,
    attention_chunk_size: int | None = None,
) -> torch.Tensor:
    """Attention for a flat batch whose K/V are already in the paged cache (``causal``,
    ``sinks`` and ``attention_chunk_size``: see :func:`attention_ref`)."""
    out = torch.zeros_like(q)
    block_size = kv_cache.block_size
    for i, seq_len in enumerate(seq_lens):
        start, end = query_start_loc[i], query_start_loc[i + 1]
        if end == start:
            continue
        blocks = block_tables[i, : -(-seq_len // block_size)].long()
        k, v = kv_cache.codec.decode(kv_cache, blocks)
        out[start:end] = attention_ref(
            q[start:end],
            k[:seq_len],
            v[:seq_len],
            scale=scale,
            context_len=seq_len,
            sliding_window=sliding_window,
            logit_softcap=logit_softcap,
            causal=causal,
            sinks=sinks,
            attention_chunk_size=attention_chunk_size,
        )
    return out
