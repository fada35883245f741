"""Split-K inside one launch: the programs of one output tile that each summed a slice of K add
their partial sums up without a second kernel.

Each program stores its float32 partial tile in a workspace ``[splits, M, N]``, then counts
itself in the tile's counter with an atomic add (release: its stores are visible before the
count; acquire: the last one sees every other's). The program that counts last adds the
partials in slice order (the result does not depend on which program finished last), writes
the output and sets the counter back to zero, so the counters are zero again at the end of
every launch, with nothing to reset between launches or CUDA-graph replays.

The counters are one int32 buffer per device (:func:`counters`), allocated before any capture;
launches of one device run in one stream, one after the other, so they never share a counter
at the same time (a PDL launch touches the counters only after its wait, when the launch
before it has completed).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .decode import per_device

#: output tiles a split launch may have (one counter each)
MAX_TILES = 1 << 16
_COUNTERS: dict[torch.device, torch.Tensor] = {}


def counters(device: torch.device) -> torch.Tensor:
    """The zeroed tile counters of ``device``, made once (before any CUDA-graph capture)."""
    return per_device(
        _COUNTERS,
        device,
        lambda: torch.zeros(MAX_TILES, dtype=torch.int32, device=device),
        "split-K counters",
    )


@triton.jit
def finish_tile(
    part,
    ws_ptr,
    cnt_ptr,
    tile,
    pid_k,
    n_split,
    offs_m,
    rows,
    row_mask,
    mask,
    stride_wsk,
    stride_wsm,
    y_ptr,
    stride_ym,
    b_ptr,
    HAS_BIAS: tl.constexpr,
):
    """Add the float32 partial ``part [BM, BN]`` (rows ``offs_m`` of the output, columns
    ``rows``) to the tile's other slices; the last program of the tile writes
    ``sum + bias`` to ``y`` in y's dtype. ``mask [BM, BN]`` marks the real entries,
    ``row_mask [BN]`` the real columns."""
    where = offs_m[:, None].to(tl.int64) * stride_wsm + rows[None, :]
    tl.store(ws_ptr + pid_k * stride_wsk + where, part, mask=mask)
    tl.debug_barrier()  # every thread's partial is stored before the count is released
    count = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
    if count == n_split - 1:
        total = tl.zeros(part.shape, dtype=tl.float32)
        for k in range(0, n_split):
            total += tl.load(
                ws_ptr + k * stride_wsk + where, mask=mask, other=0.0, cache_modifier=".cg"
            )
        if HAS_BIAS:
            total += tl.load(b_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)[None, :]
        out = y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + rows[None, :]
        tl.store(out, total.to(y_ptr.dtype.element_ty), mask=mask)
        tl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed", scope="gpu")


def workspace(n_split: int, m: int, n: int, device: torch.device) -> torch.Tensor:
    """The float32 partial sums of a split launch, ``[n_split, m, n]`` (a tensor of one size per
    shape: CUDA graphs capture its allocation)."""
    return torch.empty(n_split, m, n, dtype=torch.float32, device=device)


def split_chunks(n_chunks: int, step: int, splits: int) -> tuple[int, int]:
    """(chunks per slice, slices): ``n_chunks`` cut into at most ``splits`` slices of whole
    ``step``-chunk iterations."""
    per = triton.cdiv(triton.cdiv(n_chunks, max(1, splits)), step) * step
    return per, triton.cdiv(n_chunks, per)
