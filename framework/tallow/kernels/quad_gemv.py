"""What the small-batch kernels of packed 4- and 8-bit weights share (the quad layout of
:mod:`tallow.kernels.quads`): which quads of a tile exist, and how many warps a program spreads
along K so that the launch keeps every SM busy.

Such a kernel gives each program ``BN`` weight rows and lets its warps walk K side by side, one
quad (16 bytes of codes) per thread and row per iteration, and sums across the warps once at
the end. Rows per program are chosen for the instructions each weight costs; warps per program
are chosen here for the shape: a projection with few output rows (``o_proj``, ``down_proj`` at
batch 1) launches too few one-warp programs to fill 132 SMs, and more warps per program split
its K dimension inside the program instead (no second kernel, no partial sums in memory).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

#: resident warps per SM the launch aims at: the one-row kernels hold ~170 registers a thread,
#: so an SM keeps about 12 of their warps
WARPS_PER_SM = 12
#: the most warps one program spreads along K
MAX_WARPS = 8
#: SMs assumed where no GPU is asked (the interpreter): a Hopper data-centre GPU's count
DEFAULT_SMS = 132


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (:data:`DEFAULT_SMS` off a CUDA device)."""
    if device.type != "cuda":
        return DEFAULT_SMS
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


def warps_along_k(programs: int, quads_per_row: int, sms: int, warps: int = 1) -> int:
    """Warps per program (a power of two from ``warps`` to :data:`MAX_WARPS`) for a launch of
    ``programs`` programs over rows of ``quads_per_row`` quads: doubled while the launch holds
    fewer than :data:`WARPS_PER_SM` warps per SM and each iteration (32 quads per warp) still
    fits in a row."""
    while (
        warps < MAX_WARPS and programs * warps < sms * WARPS_PER_SM and 64 * warps <= quads_per_row
    ):
        warps *= 2
    return warps


def launch_config(
    base: tuple[int, int, int, bool], m: int, n: int, quads_per_row: int, device: torch.device
) -> tuple[int, int, int, bool]:
    """``base`` (rows of x, weight rows, warps, prefetch per program) with its warps widened
    by :func:`warps_along_k` for an ``[m, K] @ [n, K].T`` launch on ``device``."""
    bm, bn, warps, prefetch = base
    programs = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    return bm, bn, warps_along_k(programs, quads_per_row, sm_count(device), warps), prefetch


@triton.jit
def tile_mask(rows, quads, N, n_quads, EVEN_N: tl.constexpr):
    """Which quads ``quads [1, Q]`` of weight rows ``rows [BN]`` exist: ``[1, Q]`` when every
    row does (``EVEN_N``), else ``[BN, Q]``."""
    if EVEN_N:
        mask = quads < n_quads
    else:
        mask = (rows[:, None] < N) & (quads < n_quads)
    return mask
