"""Plain-torch multi-head latent attention (MLA) over a paged latent cache: the reference the
MLA kernels are checked against, and the CPU path of the engine.

The cache of one layer is ``[num_blocks, block_size, W]`` with ``W = kv_lora_rank +
qk_rope_head_dim``: per token the compressed K/V ``c`` (``kv_lora_rank``) then the rotated key
part ``k_pe`` (``qk_rope_head_dim``), shared by every head. With the up-projections
``w_uk [H, Dn, R]`` and ``w_uv [H, Dv, R]``, head ``h`` attends with

- **expanded** K/V: ``k = [w_uk[h] c, k_pe]``, ``v = w_uv[h] c``, ``q = [q_nope, q_pe]``
  (what a prefill computes: K/V of every context token for every head);
- **absorbed** up-projections: ``q_lat = q_nope w_uk[h]`` (``[R]``), scores
  ``q_lat . c + q_pe . k_pe``, ``o_lat = sum_j p_j c_j``, output ``w_uv[h] o_lat`` (what a
  decode computes: the latent is read once for all heads, no K/V are expanded).

The two are the same attention up to rounding; :func:`mla_attention_ref` takes either (by
default the absorbed form for single-query sequences, as the decode kernels do).
"""

from __future__ import annotations

import torch

from .kv_cache import indexable, to_cache_dtype

__all__ = [
    "store_latent_ref",
    "gather_latent",
    "mla_attention_ref",
    "absorb_queries",
    "mla_expanded_ref",
    "mla_absorbed_ref",
]


def _check_cache(cache: torch.Tensor, width: int) -> None:
    if cache.dim() != 3 or cache.shape[-1] != width:
        raise ValueError(
            f"latent cache must be [num_blocks, block_size, {width}], got {list(cache.shape)}"
        )


def store_latent_ref(cache: torch.Tensor, latent: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Write ``latent`` [T, W] into ``cache`` [blocks, block_size, W] at ``slot_mapping`` [T]
    (slot = block * block_size + offset; -1 skips the row), cast into the cache's dtype (an
    8-bit float saturates)."""
    _check_cache(cache, latent.shape[-1])
    if latent.shape[0] != slot_mapping.shape[0]:
        raise ValueError(f"latent has {latent.shape[0]} rows, slot_mapping {slot_mapping.shape[0]}")
    keep = slot_mapping >= 0
    rows = to_cache_dtype(latent[keep], cache.dtype)
    indexable(cache).view(-1, cache.shape[-1])[slot_mapping[keep]] = indexable(rows)


def gather_latent(cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> torch.Tensor:
    """The first ``seq_len`` latent rows [seq_len, W] of one sequence, float32."""
    block_size = cache.shape[1]
    blocks = block_table[: -(-seq_len // block_size)].long()
    rows = indexable(cache)[blocks].view(cache.dtype)
    return rows.reshape(-1, cache.shape[-1])[:seq_len].float()


def _causal_mask(n_q: int, context_len: int, device: torch.device) -> torch.Tensor:
    q_pos = torch.arange(context_len - n_q, context_len, device=device)[:, None]
    return torch.arange(context_len, device=device)[None, :] <= q_pos  # [Q, S]


def absorb_queries(q_nope: torch.Tensor, w_uk: torch.Tensor) -> torch.Tensor:
    """``q_nope`` [T, H, Dn] through ``w_uk`` [H, Dn, R]: the latent queries [T, H, R] (in
    ``q_nope``'s dtype; float32 accumulation)."""
    out = torch.einsum("thn,hnr->thr", q_nope.float(), w_uk.float())
    return out.to(q_nope.dtype)


def mla_expanded_ref(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    latent: torch.Tensor,
    w_uk: torch.Tensor,
    w_uv: torch.Tensor,
    *,
    scale: float,
) -> torch.Tensor:
    """Causal MLA of the last ``Q`` tokens of one sequence over its ``S`` latent rows
    ``latent`` [S, W] with K/V expanded per head; ``q_nope`` [Q, H, Dn], ``q_pe`` [Q, H, Dr].
    Returns [Q, H, Dv] float32."""
    rank = w_uk.shape[-1]
    c, k_pe = latent[:, :rank].float(), latent[:, rank:].float()
    k_nope = torch.einsum("sr,hnr->hsn", c, w_uk.float())  # [H, S, Dn]
    v = torch.einsum("sr,hvr->hsv", c, w_uv.float())  # [H, S, Dv]
    qn, qp = q_nope.float().transpose(0, 1), q_pe.float().transpose(0, 1)  # [H, Q, *]
    scores = (qn @ k_nope.transpose(1, 2) + qp @ k_pe.T) * scale  # [H, Q, S]
    allowed = _causal_mask(q_nope.shape[0], latent.shape[0], latent.device)
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    return (probs @ v).transpose(0, 1)


def mla_absorbed_ref(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    latent: torch.Tensor,
    w_uk: torch.Tensor,
    w_uv: torch.Tensor,
    *,
    scale: float,
) -> torch.Tensor:
    """The same attention as :func:`mla_expanded_ref` with the up-projections absorbed: the
    scores and the weighted sum run on the latent rows once for all heads."""
    rank = w_uk.shape[-1]
    c, k_pe = latent[:, :rank].float(), latent[:, rank:].float()
    q_lat = torch.einsum("qhn,hnr->qhr", q_nope.float(), w_uk.float())  # [Q, H, R]
    scores = (q_lat @ c.T + q_pe.float() @ k_pe.T) * scale  # [Q, H, S]
    allowed = _causal_mask(q_nope.shape[0], latent.shape[0], latent.device)
    probs = scores.masked_fill(~allowed[:, None, :], float("-inf")).softmax(-1)
    o_lat = probs @ c  # [Q, H, R]
    return torch.einsum("qhr,hvr->qhv", o_lat, w_uv.float())


def mla_attention_ref(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    cache: torch.Tensor,
    *,
    w_uk: torch.Tensor,
    w_uv: torch.Tensor,
    query_start_loc: list[int],
    seq_lens: list[int],
    block_tables: torch.Tensor,
    scale: float,
    absorbed: bool | None = None,
) -> torch.Tensor:
    """MLA for a flat batch whose latent rows are already in the paged ``cache``: sequence
    ``i`` owns query rows ``query_start_loc[i]:query_start_loc[i+1]`` (its last tokens) and a
    context of ``seq_lens[i]`` rows read through ``block_tables[i]``. ``absorbed`` picks the
    form for every sequence; None: absorbed for single-query sequences, expanded for the
    others. Returns [T, H, Dv] in ``q_nope``'s dtype."""
    _check_cache(cache, w_uk.shape[-1] + q_pe.shape[-1])
    heads, dv = q_nope.shape[1], w_uv.shape[1]
    out = torch.zeros(q_nope.shape[0], heads, dv, dtype=q_nope.dtype, device=q_nope.device)
    for i, seq_len in enumerate(seq_lens):
        start, end = query_start_loc[i], query_start_loc[i + 1]
        if end == start:
            continue
        latent = gather_latent(cache, block_tables[i], seq_len)
        use_absorbed = (end - start == 1) if absorbed is None else absorbed
        attend = mla_absorbed_ref if use_absorbed else mla_expanded_ref
        out[start:end] = attend(
            q_nope[start:end], q_pe[start:end], latent, w_uk, w_uv, scale=scale
        ).to(out.dtype)
    return out
