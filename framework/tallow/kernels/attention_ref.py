"""Plain-torch paged attention: the reference every attention kernel is checked against, and
the CPU path of the engine."""

from __future__ import annotations

import torch


def cache_saturation(dtype: torch.dtype) -> float:
    """The magnitude K/V values are clamped to before they are cast into a cache of ``dtype``:
    the largest finite value of an 8-bit float (which has no infinity, so an overflowing cast
    would give NaN), 0.0 (no clamp) for wider dtypes."""
    if dtype.is_floating_point and dtype.itemsize == 1:
        return float(torch.finfo(dtype).max)
    return 0.0


def to_cache_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` as stored in a cache of ``dtype``: clamped (:func:`cache_saturation`), then
    rounded to nearest even."""
    limit = cache_saturation(dtype)
    if limit:
        x = x.clamp(-limit, limit)
    return x.to(dtype)


def indexable(t: torch.Tensor) -> torch.Tensor:
    """``t`` in a form every torch index operation takes: an 8-bit float tensor as a view of
    its bytes (uint8; not every gather/scatter is implemented for 8-bit floats), others as
    they are. Copying the bytes copies the values exactly."""
    return t.view(torch.uint8) if t.dtype.itemsize == 1 else t


def store_kv_ref(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
    """Write ``k``/``v`` [T, Hkv, D] into ``kv_cache`` [2, blocks, block_size, Hkv, D] at
    ``slot_mapping`` [T]; rows with slot -1 are skipped. Values are converted with
    :func:`to_cache_dtype`."""
    block_size = kv_cache.shape[2]
    keep = slot_mapping >= 0
    if not bool(keep.all()):
        slot_mapping, k, v = slot_mapping[keep], k[keep], v[keep]
    blocks = torch.div(slot_mapping, block_size, rounding_mode="floor")
    offsets = slot_mapping % block_size
    k, v = to_cache_dtype(k, kv_cache.dtype), to_cache_dtype(v, kv_cache.dtype)
    kv_cache, k, v = indexable(kv_cache), indexable(k), indexable(v)
    kv_cache[0, blocks, offsets] = k
    kv_cache[1, blocks, offsets] = v


def gather_context_ref(kv_cache: torch.Tensor, block_table: torch.Tensor,
                       seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V [seq_len, Hkv, D] of one sequence, read through its block table."""
    block_size = kv_cache.shape[2]
    n_blocks = (seq_len + block_size - 1) // block_size
    blocks = block_table[:n_blocks].long()
    raw = indexable(kv_cache)
    k = raw[0, blocks].reshape(-1, *kv_cache.shape[3:])[:seq_len]
    v = raw[1, blocks].reshape(-1, *kv_cache.shape[3:])[:seq_len]
    return k.view(kv_cache.dtype), v.view(kv_cache.dtype)


def attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float,
                  context_len: int, sliding_window: int | None = None,
                  logit_softcap: float | None = None, causal: bool = True) -> torch.Tensor:
    """Attention of the last ``q.shape[0]`` tokens of a sequence over its whole context.

    q [Q, Hq, D]; k, v [S, Hkv, D] with S = ``context_len``; query i sits at position
    ``S - Q + i`` and, when ``causal``, sees the keys up to that position; otherwise every
    query sees all ``S`` keys (bidirectional, as in encoders). Computed in float32; returns
    q's dtype.
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
    probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs, vf)  # [Hq, Q, D]
    return out.transpose(0, 1).to(q.dtype)


def paged_attention_ref(q: torch.Tensor, kv_cache: torch.Tensor, *, query_start_loc: list[int],
                        seq_lens: list[int], block_tables: torch.Tensor, scale: float,
                        sliding_window: int | None = None,
                        logit_softcap: float | None = None, causal: bool = True) -> torch.Tensor:
    """Attention for a flat batch whose K/V are already in the paged cache (``causal``: see
    :func:`attention_ref`)."""
    out = torch.zeros_like(q)
    for i, seq_len in enumerate(seq_lens):
        start, end = query_start_loc[i], query_start_loc[i + 1]
        if end == start:
            continue
        k, v = gather_context_ref(kv_cache, block_tables[i], seq_len)
        out[start:end] = attention_ref(q[start:end], k, v, scale=scale, context_len=seq_len,
                                       sliding_window=sliding_window,
                                       logit_softcap=logit_softcap, causal=causal)
    return out
