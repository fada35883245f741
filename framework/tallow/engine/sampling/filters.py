"""Filters on scaled logits (logits * inv_temperature): removed tokens become -inf."""

from __future__ import annotations

import torch

# First try top-p over this many most likely tokens; a full sort only if they hold too little.
_TOP_P_CANDIDATES = 1024


def apply_top_k(scores: torch.Tensor, k: torch.Tensor, kmax: int | None = None) -> torch.Tensor:
    """Keep, per row, the tokens scoring at least the row's k-th best (ties at the boundary are
    kept). scores [n, V]; k [n] int64 in [1, V]; ``kmax`` = max(k) when the caller knows it
    (saves a device sync)."""
    if kmax is None:
        kmax = int(k.max())
    top = torch.topk(scores, kmax, dim=-1).values  # [n, kmax], descending
    threshold = top.gather(1, (k - 1).unsqueeze(1))
    return scores.masked_fill(scores < threshold, float("-inf"))


def _top_p_threshold(sorted_probs: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """The smallest kept probability per row, given descending probabilities: a token is kept
    when the mass strictly before it is < p (so at least one is always kept)."""
    cum = sorted_probs.cumsum(dim=-1)
    before = cum - sorted_probs
    n_keep = (before < p.unsqueeze(1)).sum(dim=-1).clamp(min=1)
    return sorted_probs.gather(1, (n_keep - 1).unsqueeze(1))


def apply_top_p(scores: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Nucleus filter: keep the most likely tokens until their mass reaches p. scores [n, V];
    p [n] in (0, 1]. Looks at the best ``_TOP_P_CANDIDATES`` tokens first and sorts the whole
    row only for rows whose candidates hold less than p."""
    probs = torch.softmax(scores, dim=-1)
    vocab = scores.shape[-1]
    n_cand = min(vocab, _TOP_P_CANDIDATES)
    cand = torch.topk(probs, n_cand, dim=-1).values
    threshold = _top_p_threshold(cand, p)
    # Rows whose candidates hold less than p may keep tokens beyond them.
    short = cand.sum(dim=-1) < p if n_cand < vocab else torch.zeros_like(p, dtype=torch.bool)
    if bool(short.any()):
        rows = short.nonzero().flatten()
        full = torch.sort(probs[rows], dim=-1, descending=True).values
        threshold[rows] = _top_p_threshold(full, p[rows])
    return scores.masked_fill(probs < threshold, float("-inf"))


def apply_min_p(scores: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Keep tokens whose probability is at least ``min_p`` times the row's largest."""
    probs = torch.softmax(scores, dim=-1)
    threshold = probs.max(dim=-1, keepdim=True).values * min_p.unsqueeze(1)
    return scores.masked_fill(probs < threshold, float("-inf"))
