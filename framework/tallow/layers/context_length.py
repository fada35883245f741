"""The context length of every token's sequence at the current step.

Some rotary variants choose their frequencies by how long a sequence is when a token is
computed (dynamic NTK scaling, LongRoPE); this is where that length comes from.
"""

from __future__ import annotations

import torch

from .attention import get_forward_context


def context_lengths(positions: torch.Tensor) -> torch.Tensor:
    """``int64 [T]``: for each token of the step, the length of its sequence's context (tokens
    cached before plus this step's).

    Read from the step's :class:`~tallow.layers.AttentionMetadata` (``query_start_loc`` and
    ``seq_lens``, on the device, so a CUDA graph replays it); outside a step (a test calling a
    layer directly) the tokens are taken as one sequence of ``max(positions) + 1`` tokens.
    """
    n = positions.shape[0]
    try:
        meta = get_forward_context().meta
    except RuntimeError:
        meta = None
    if meta is None:
        return (positions.max() + 1).expand(n).to(torch.int64)
    starts = meta.query_start_loc.to(positions.device)
    rows = torch.arange(n, device=positions.device, dtype=starts.dtype)
    seq = torch.searchsorted(starts[1:].contiguous(), rows, right=True)
    # rows past the last sequence (padding of a captured batch) borrow the last one's length
    seq = seq.clamp_(max=meta.seq_lens.shape[0] - 1)
    return meta.seq_lens.to(positions.device)[seq].to(torch.int64)
