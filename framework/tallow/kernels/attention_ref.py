"""Plain-torch paged attention: the reference every attention kernel is checked against, and
the CPU path of the engine. The cache is read through its codec's reference ``decode``, so
every KV codec is served here."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # pragma: no cover
    from .kv_cache import LayerKVCache


def attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float,
                  context_len: int, sliding_window: int | None = None,
                  logit_softcap: float | None = None, causal: bool = True,
                  sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of the last ``q.shape[0]`` tokens of a sequence over its whole context.

    q [Q, Hq, D]; k, v [S, Hkv, D] with S = ``context_len``; query i sits at position
    ``S - Q + i`` and, when ``causal``, sees the keys up to that position; otherwise every
    query sees all ``S`` keys (bidirectional, as in encoders). ``sinks`` [Hq] (attention
    sinks): one more logit per head in every softmax, whose probability is dropped (it has no
    value), so the weights of the keys sum to less than one. Computed in float32; returns q's
    dtype.
    """
    n_q, n_heads, _ = q.shape
    n_kv = k.shape[1]
    group = n_heads // n_kv
    qf = q.float().transpose(0, 1)  # [Hq, Q, D]
    kf = k.float().repeat_interleave(group, dim=1).transpose(0, 1)  # [Hq, S, D]
    vf = v.float().repeat_interleave(group, dim=1).transpose(0, 1)
    scores = torch.matmul(qf, kf.transpose(1, 2)) * scale  # [Hq, Q, S]
    if logit_softcap:
        scores = logit_softcap * torch.tanh(scores / logit_softcap)
    q_pos = torch.arange(context_len - n_q, context_len, device=q.device)[:, None]
    k_pos = torch.arange(context_len, device=q.device)[None, :]
    allowed = k_pos <= q_pos if causal else k_pos < context_len
    if sliding_window:
        allowed = allowed & (q_pos - k_pos < sliding_window)
    scores = scores.masked_fill(~allowed, float("-inf"))
    if sinks is not None:
        sink = sinks.float().reshape(n_heads, 1, 1).expand(n_heads, n_q, 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs, vf)  # [Hq, Q, D]
    return out.transpose(0, 1).to(q.dtype)


def paged_attention_ref(q: torch.Tensor, kv_cache: "LayerKVCache", *,
                        query_start_loc: list[int], seq_lens: list[int],
                        block_tables: torch.Tensor, scale: float,
                        sliding_window: int | None = None,
                        logit_softcap: float | None = None, causal: bool = True,
                        sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Attention for a flat batch whose K/V are already in the paged cache (``causal`` and
    ``sinks``: see :func:`attention_ref`)."""
    out = torch.zeros_like(q)
    block_size = kv_cache.block_size
    for i, seq_len in enumerate(seq_lens):
        start, end = query_start_loc[i], query_start_loc[i + 1]
        if end == start:
            continue
        blocks = block_tables[i, :-(-seq_len // block_size)].long()
        k, v = kv_cache.codec.decode(kv_cache, blocks)
        out[start:end] = attention_ref(q[start:end], k[:seq_len], v[:seq_len], scale=scale,
                                       context_len=seq_len, sliding_window=sliding_window,
                                       logit_softcap=logit_softcap, causal=causal,
                                       sinks=sinks)
    return out
