"""tallow's step metadata as FlashInfer's page arguments.

tallow gives each sequence a row of ``block_tables`` (its blocks in order) and its length;
FlashInfer takes the pages of all sequences end to end (``indices``), where each sequence's run
starts (``kv_indptr``), how many tokens its last page holds (``last_page_len``) and where its
query rows start (``qo_indptr``). The offsets are needed on the host (FlashInfer schedules the
batch there); the page list is built on the device from the block tables, without a transfer
or a sync, so that it can be rebuilt before every replay of a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch


@dataclass
class PageArgs:
    """Host tensors (int32) of one step's batch."""

    qo_indptr: torch.Tensor  # [B + 1]: where sequence i's query rows start
    kv_indptr: torch.Tensor  # [B + 1]: where sequence i's pages start in the page list
    last_page_len: torch.Tensor  # [B]: tokens in sequence i's last page (1 ... block_size)
    seq_lens: torch.Tensor  # [B]
    num_pages: int
    num_rows: int  # query rows that belong to a sequence

    @property
    def num_seqs(self) -> int:
        return len(self.last_page_len)


def host_page_args(
    query_start_loc: Sequence[int], seq_lens: Sequence[int], block_size: int
) -> PageArgs:
    """The offsets of a batch whose sequence i has query rows ``query_start_loc[i] ...
    query_start_loc[i + 1] - 1`` and ``seq_lens[i]`` tokens in the cache (this step's
    included). Raises ValueError naming the argument that does not fit."""
    lens = np.asarray(seq_lens, dtype=np.int64)
    starts = np.asarray(query_start_loc, dtype=np.int64)
    if block_size < 1:
        raise ValueError(f"block_size must be positive, got {block_size}")
    if lens.ndim != 1 or len(lens) == 0:
        raise ValueError(f"seq_lens must list one length per sequence, got {list(seq_lens)}")
    if starts.shape != (len(lens) + 1,):
        raise ValueError(
            f"query_start_loc must have {len(lens) + 1} entries (one more than "
            f"seq_lens), got {len(starts)}"
        )
    query_lens = np.diff(starts)
    if starts[0] != 0 or (query_lens < 1).any():
        raise ValueError(
            "query_start_loc must start at 0 and grow by at least 1 per sequence, "
            f"got {list(query_start_loc)}"
        )
    if (lens < query_lens).any():
        bad = int(np.argmax(lens < query_lens))
        raise ValueError(
            f"seq_lens[{bad}] = {int(lens[bad])} is shorter than the sequence's "
            f"{int(query_lens[bad])} query rows"
        )
    pages = (lens + block_size - 1) // block_size
    kv_indptr = np.zeros(len(lens) + 1, dtype=np.int32)
    np.cumsum(pages, out=kv_indptr[1:])
    return PageArgs(
        qo_indptr=torch.from_numpy(starts.astype(np.int32)),
        kv_indptr=torch.from_numpy(kv_indptr),
        last_page_len=torch.from_numpy(((lens - 1) % block_size + 1).astype(np.int32)),
        seq_lens=torch.from_numpy(lens.astype(np.int32)),
        num_pages=int(kv_indptr[-1]),
        num_rows=int(starts[-1]),
    )


def page_list(
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    block_size: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The pages of every sequence end to end, from the device's ``seq_lens`` [B] and
    ``block_tables`` [B, W], with fixed-size operations only (capturable, no sync): entry
    ``kv_indptr[i] + j`` is ``block_tables[i, j]`` for each of sequence i's pages. Returns
    ``out`` (int32 [B * W + 1], allocated when None); entries past the last page are
    unspecified (the last one collects the table entries past each sequence's pages)."""
    num_seqs, width = block_tables.shape
    size = num_seqs * width + 1
    if out is None:
        out = torch.empty(size, dtype=torch.int32, device=block_tables.device)
    elif out.shape != (size,) or out.dtype != torch.int32:
        raise ValueError(f"out must be int32 [{size}], got {out.dtype} {list(out.shape)}")
    pages = (seq_lens.to(torch.int64) + (block_size - 1)) // block_size
    first = torch.cumsum(pages, 0) - pages  # where each sequence's pages start
    column = torch.arange(width, device=block_tables.device)
    dest = first[:, None] + column[None, :]
    dest = torch.where(column[None, :] < pages[:, None], dest, size - 1)
    out.scatter_(0, dest.reshape(-1), block_tables.reshape(-1).to(torch.int32))
    return out
