"""Plain-torch paged attention: the reference every attention kernel is checked against, and
the CPU path of the engine."""

from __future__ import annotations

import torch


def store_kv_ref(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
    """Write ``k``/``v`` [T, Hkv, D] into ``kv_cache`` [2, blocks, block_size, Hkv, D] at
    ``slot_mapping`` [T]; rows with slot -1 are skipped."""
    block_size = kv_cache.shape[2]
    keep = slot_mapping >= 0
    if not bool(keep.all()):
        slot_mapping, k, v = slot_mapping[keep], k[keep], v[keep]
    blocks = torch.div(slot_mapping, block_size, rounding_mode="floor")
    offsets = slot_mapping % block_size
    kv_cache[0, blocks, offsets] = k.to(kv_cache.dtype)
    kv_cache[1, blocks, offsets] = v.to(kv_cache.dtype)


def gather_context_ref(kv_cache: torch.Tensor, block_table: torch.Tensor,
                       seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V [seq_len, Hkv, D] of one sequence, read through its block table."""
    block_size = kv_cache.shape[2]
    n_blocks = (seq_len + block_size - 1) // block_size
    blocks = block_table[:n_blocks].long()
    k = kv_cache[0, blocks].reshape(-1, *kv_cache.shape[3:])[:seq_len]
    v = kv_cache[1, blocks].reshape(-1, *kv_cache.shape[3:])[:seq_len]
    return k, v


def attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float,
                  context_len: int, sliding_window: int | None = None,
                  logit_softcap: float | None = None) -> torch.Tensor:
    """Causal attention of the last ``q.shape[0]`` tokens of a sequence over its whole context.

    q [Q, Hq, D]; k, v [S, Hkv, D] with S = ``context_len``; query i sits at position
    ``S - Q + i``. Computed in float32; returns q's dtype.
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
    allowed = k_pos <= q_pos
    if sliding_window:
        allowed = allowed & (q_pos - k_pos < sliding_window)
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs, vf)  # [Hq, Q, D]
    return out.transpose(0, 1).to(q.dtype)


def paged_attention_ref(q: torch.Tensor, kv_cache: torch.Tensor, *, query_start_loc: list[int],
                        seq_lens: list[int], block_tables: torch.Tensor, scale: float,
                        sliding_window: int | None = None,
                        logit_softcap: float | None = None) -> torch.Tensor:
    """Attention for a flat batch whose K/V are already in the paged cache."""
    out = torch.zeros_like(q)
    for i, seq_len in enumerate(seq_lens):
        start, end = query_start_loc[i], query_start_loc[i + 1]
        if end == start:
            continue
        k, v = gather_context_ref(kv_cache, block_tables[i], seq_len)
        out[start:end] = attention_ref(q[start:end], k, v, scale=scale, context_len=seq_len,
                                       sliding_window=sliding_window,
                                       logit_softcap=logit_softcap)
    return out
