"""Gemma 3's attention among the tokens of one image: bidirectional, on a causal text model.

transformers builds Gemma 3's masks from ``token_type_ids``: a query that is an image token
also sees the later tokens of the same image (a run of consecutive image tokens), on top of the
causal mask; on sliding layers the window still applies (``query - key < window``). The core
attention backends know only causal masks, so :class:`ImageBlockAttention` wraps a layer's
:class:`tallow.layers.Attention`: the backend computes every row causally (and stores the
step's K/V in the paged cache), then the rows of image tokens are computed again in torch
over their sequence's cached K/V with the image's block opened.

This needs every image whole within one step: its later tokens' K/V must exist when its
earlier ones are computed. The model declares ``whole_images``, so the scheduler never ends a
prefill chunk inside an image; as a guard, a step whose last row of a sequence is an image token
(an image's tokens are always followed by the end-of-image token) raises. Any backend other
than ``torch`` is refused (the Triton kernels cannot take the mask, and computing without it
would be silently wrong).
"""

from __future__ import annotations

import torch
from torch import nn

from tallow.layers import Attention, current_multimodal_step, get_forward_context


def image_runs(rows: list[int], query_start_loc: list[int]) -> list[tuple[int, int, int]]:
    """``(sequence, first row, end row)`` of each run of consecutive image rows of one
    sequence in a flat batch (``rows`` sorted)."""
    runs: list[tuple[int, int, int]] = []
    seq = 0
    for r in rows:
        while r >= query_start_loc[seq + 1]:
            seq += 1
        if runs and runs[-1][0] == seq and runs[-1][2] == r:
            runs[-1] = (seq, runs[-1][1], r + 1)
        else:
            runs.append((seq, r, r + 1))
    return runs


def image_block_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    first: int,
    image_start: int,
    scale: float,
    sliding_window: int | None,
) -> torch.Tensor:
    """Attention of ``q [n, Hq, D]``, the queries at positions ``first .. first + n - 1``
    (image tokens), over ``k, v [S, Hkv, D]`` (positions ``0 .. S - 1``): a query sees the keys
    up to itself and every key from ``image_start`` on (its image), within the window."""
    n, heads, _ = q.shape
    group = heads // k.shape[1]
    qf = q.float().transpose(0, 1)
    kf = k.float().repeat_interleave(group, dim=1).transpose(0, 1)
    vf = v.float().repeat_interleave(group, dim=1).transpose(0, 1)
    scores = torch.matmul(qf, kf.transpose(1, 2)) * scale  # [Hq, n, S]
    q_pos = torch.arange(first, first + n, device=q.device)[:, None]
    k_pos = torch.arange(k.shape[0], device=q.device)[None, :]
    allowed = (k_pos <= q_pos) | (k_pos >= image_start)
    if sliding_window:
        allowed = allowed & (q_pos - k_pos < sliding_window)
    probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    return torch.matmul(probs, vf).transpose(0, 1).to(q.dtype)


class ImageBlockAttention(nn.Module):
    """``forward(q, k, v)`` of the wrapped :class:`Attention`, with the rows of image tokens
    attending bidirectionally within their image (see the module docstring)."""

    def __init__(self, inner: Attention) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = self.inner(q, k, v)
        step = current_multimodal_step()
        if step is None or step.rows is None or step.rows.numel() == 0:
            return out
        ctx = get_forward_context()
        backend = getattr(ctx.backend, "name", type(ctx.backend).__name__)
        if backend != "torch":
            raise NotImplementedError(
                f"Gemma 3 image tokens attend bidirectionally within an image; the "
                f"{backend!r} attention backend has no such mask (use the torch "
                "backend for prompts with images)"
            )
        spec, cache = self.inner.layer, self.inner.kv_cache
        assert cache is not None  # the inner call above has checked it
        meta = ctx.meta.group(self.inner.cache_group)
        qsl = list(meta.query_start_loc_cpu or meta.query_start_loc.tolist())
        lens = list(meta.seq_lens_cpu or meta.seq_lens.tolist())
        n = q.shape[0]
        out = out.view(n, spec.num_heads, spec.head_dim).clone()
        qh = q.view(n, spec.num_heads, spec.head_dim)
        rows = sorted(int(r) for r in step.rows.tolist())
        for seq, lo, hi in image_runs(rows, qsl):
            if hi == qsl[seq + 1]:
                raise RuntimeError(
                    "a Gemma 3 image was cut between two scheduler steps, but its tokens attend "
                    "to each other (the scheduler keeps images whole for models that declare "
                    "whole_images)"
                )
            base = lens[seq] - (qsl[seq + 1] - qsl[seq])  # position of the sequence's first row
            first, end = base + lo - qsl[seq], base + hi - qsl[seq]
            blocks = meta.block_tables[seq, : -(-end // cache.block_size)].long()
            keys, values = cache.codec.decode(cache, blocks)
            out[lo:hi] = image_block_attention(
                qh[lo:hi],
                keys[:end],
                values[:end],
                first=first,
                image_start=first,
                scale=spec.scale,
                sliding_window=spec.sliding_window,
            )
        return out.reshape(n, spec.num_heads * spec.head_dim)
