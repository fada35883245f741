"""Launch choices of the Triton paged-attention kernels: tile shapes and split counts.

Pure Python (no torch, no triton) so the choices can be unit-tested anywhere. Every choice here
is a *speed* choice: the kernels are correct for any tile shape and any split count, which is
what makes the decode path safe to capture in a CUDA graph (see :func:`decode_num_splits`).
"""

from __future__ import annotations

from dataclasses import dataclass

#: head sizes the kernels are tested on; any multiple of 16 in [16, 512] compiles and works
#: (512: Gemma 4's full-attention layers)
TESTED_HEAD_DIMS: tuple[int, ...] = (64, 80, 96, 128, 256, 512)
MIN_HEAD_DIM = 16
MAX_HEAD_DIM = 512
#: the turbo cache's kernels (a [D, D] rotation in registers) stop at 256
TURBO_MAX_HEAD_DIM = 256
#: KV-cache block sizes accepted (powers of two keep the in-kernel divisions shifts)
BLOCK_SIZES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
#: the most partitions one sequence's context is cut into by split-K decode
MAX_SPLITS = 64
#: a split below this many context tokens costs more in the reduce than it saves
MIN_TOKENS_PER_SPLIT = 128
#: aim for this many decode programs per SM (4-warp programs; several are resident at once)
PROGRAMS_PER_SM = 2
#: the SM count and compute capability assumed where none can be asked for (the Triton
#: interpreter on a CPU): a Hopper data-centre GPU's
DEFAULT_SM_COUNT = 132
DEFAULT_CAPABILITY = 90


def next_pow2(n: int) -> int:
    """Smallest power of two >= ``n`` (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def head_dim_reasons(head_dim: int) -> list[str]:
    """Why the kernels cannot run this head size (empty when they can); a turbo cache stops
    lower (:data:`TURBO_MAX_HEAD_DIM`, checked with its layout)."""
    if (
        not isinstance(head_dim, int)
        or head_dim < MIN_HEAD_DIM
        or head_dim > MAX_HEAD_DIM
        or head_dim % 16
    ):
        return [
            f"head size {head_dim!r} is not supported (expected a multiple of 16 in "
            f"[{MIN_HEAD_DIM}, {MAX_HEAD_DIM}]; tested: "
            f"{', '.join(map(str, TESTED_HEAD_DIMS))})"
        ]
    return []


def block_size_reasons(block_size: int) -> list[str]:
    if block_size not in BLOCK_SIZES:
        return [
            f"cache.block_size {block_size!r} is not supported (expected one of "
            f"{', '.join(map(str, BLOCK_SIZES))})"
        ]
    return []


@dataclass(frozen=True)
class PrefillTiles:
    """Tile shape of the varlen prefill kernel.

    ``block_m`` rows of one program are ``block_q`` query tokens times the ``group`` query heads
    that share a KV head, so each K/V tile is loaded once per group.
    """

    block_m: int
    block_q: int
    tile_n: int
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class DecodeTiles:
    """Tile shape of the split-K decode kernel: ``g_pad`` rows (the group's query heads, padded
    to the 16 rows a tensor-core product needs) against ``tile_n`` context tokens per step."""

    g_pad: int
    tile_n: int
    num_warps: int
    num_stages: int


def dot_precision(elem_bytes: int) -> str:
    """``tl.dot`` input precision: fp32 inputs use three TF32 products (about fp32 accuracy on
    tensor cores; plain "ieee" spills registers badly on Hopper), 16-bit inputs are exact."""
    return "tf32x3" if elem_bytes >= 4 else "tf32"


def prefill_tiles(
    head_dim: int,
    group: int,
    elem_bytes: int,
    capability: int = 90,
    windowed_or_capped: bool = False,
    cache_bytes: int = 2,
    codes: bool = False,
) -> PrefillTiles:
    """Tiles for the prefill kernel. 16-bit inputs: sized to run without register spills on
    Hopper's wgmma and on Ampere's mma (checked by compiling for sm_80 and sm_90 in the tests;
    Ampere keeps accumulators in more registers, so it pipelines one stage less). fp32 inputs
    are a correctness path: small tiles, some spills at head size 256. An 8-bit cache
    (``cache_bytes`` 1) is widened in registers, which the 128-key tile cannot afford; packed
    codes (``codes``: a turbo cache) are unpacked there too, which at head size 256 needs
    16-key tiles."""
    d_pad = next_pow2(head_dim)
    if elem_bytes >= 4:
        block_m, tile_n, warps, stages = (32, 32, 4, 2) if d_pad <= 128 else (16, 16, 4, 2)
        if d_pad > 256:
            stages = 1  # two stages of 512-wide fp32 K and V tiles are 128 KiB of shared memory
    elif d_pad > 256:
        # 512-wide heads: 32-row blocks keep Q and the accumulator within 8 warps' registers
        # (mma.sync: Hopper's wgmma would hold 64 rows of 512 accumulators per warp group);
        # Ampere's mma needs the 16-key tile to stay free of spills
        block_m, tile_n, warps, stages = 32, 32 if capability >= 90 else 16, 8, 2
    elif d_pad <= 128:
        # measured on Hopper (4096-token prefill, D 128): 128x128 tiles, 3 stages beat
        # 128x64; Ampere's mma needs the smaller key tile to stay in registers
        # (the window mask and the softcap's tanh need the registers of the smaller tile too)
        if capability >= 90 and not windowed_or_capped and cache_bytes >= 2:
            block_m, tile_n, warps, stages = 128, 128, 8, 3
        elif capability >= 90:
            block_m, tile_n, warps, stages = 128, 64, 8, 3
        else:
            block_m, tile_n, warps, stages = 128, 64, 8, 2
    else:
        block_m, tile_n, warps, stages = 64, 16 if codes else 32, 8, 2
    block_m = max(block_m, next_pow2(group))
    return PrefillTiles(
        block_m=block_m, block_q=block_m // group, tile_n=tile_n, num_warps=warps, num_stages=stages
    )


def decode_tiles(
    head_dim: int, group: int, elem_bytes: int, cache_bytes: int | None = None, codes: bool = False
) -> DecodeTiles:
    """Tiles for the decode kernel: 16 KiB of K (and of V) per step for 16-bit inputs, so each
    program keeps several loads in flight (the kernel is bandwidth-bound; the product shape
    matters little). fp32 takes 16-token steps to stay within registers.

    An 8-bit cache (``cache_bytes`` 1) is widened to fp16 in the kernel, and the tile's
    softmax reductions across warps then cost more than the loads: one-warp programs on
    32-key tiles (no cross-warp reductions or barriers) are faster, in
    ``bench/gpu/kv_fp8_probe.py`` and in the llama-3-8b throughput run alike
    (docs/benchmarks.md). Head sizes above 128
    and groups above 16 keep the 4-warp tiles: one warp would spill registers there.

    Packed codes (``codes``: a turbo cache, passed with ``cache_bytes`` 2) take the 4-warp
    tiles, 16 keys at head size 256, where unpacking 32 keys spills (sm_90)."""
    d_pad = next_pow2(head_dim)
    g_pad = max(16, next_pow2(group))
    if elem_bytes >= 4:
        # one stage of 512-wide fp32 K and V tiles: two would be 128 KiB of shared memory
        tile_n, warps, stages = 16, 4, 2 if d_pad <= 256 else 1
    elif cache_bytes == 1 and d_pad <= 128 and g_pad <= 16:
        tile_n, warps, stages = 32, 1, 3
    else:
        tile_n, warps, stages = min(64, max(16, 8192 // d_pad)), 4, 3
        if codes and d_pad > 128:
            tile_n = 16
    return DecodeTiles(g_pad=g_pad, tile_n=tile_n, num_warps=warps, num_stages=stages)


def nibble_decode_tiles(head_dim: int, group: int, elem_bytes: int) -> DecodeTiles:
    """Tiles for the 4-bit turbo decode kernel (kernels/turbo_decode.py). With 16-bit
    activations at head sizes up to 128 and groups up to 16: one-warp programs on 32-key tiles,
    as for an 8-bit float cache (no cross-warp reductions or barriers; 2,362 sm_90 instructions
    per 64 keys at head size 128, against 3,244 for 4-warp programs on 64-key tiles). Larger
    heads and groups spill one warp's registers and take 4-warp programs; fp32 products take
    16-key steps."""
    d_pad = next_pow2(head_dim)
    g_pad = max(16, next_pow2(group))
    if elem_bytes >= 4:
        return DecodeTiles(g_pad=g_pad, tile_n=16, num_warps=4, num_stages=2)
    if d_pad <= 128 and g_pad <= 16:
        return DecodeTiles(g_pad=g_pad, tile_n=32, num_warps=1, num_stages=3)
    return DecodeTiles(g_pad=g_pad, tile_n=32 if d_pad > 128 else 64, num_warps=4, num_stages=2)


def decode_num_splits(
    num_seqs: int, num_kv_heads: int, *, sm_count: int, max_seq_len: int | None, num_warps: int = 4
) -> int:
    """How many partitions split-K decode cuts each sequence's context into.

    Enough (sequence, KV head, split) programs to fill the GPU (``PROGRAMS_PER_SM`` 4-warp
    programs per SM, or as many warps in programs of ``num_warps``), but
    no split shorter than ``MIN_TOKENS_PER_SPLIT`` tokens of ``max_seq_len`` when that is known,
    rounded up to a power of two and capped at ``MAX_SPLITS``. ``max_seq_len`` is a hint only:
    the kernel computes each sequence's split boundaries from its own length on the device, so
    any split count gives the same result. Pass None under CUDA-graph capture, where the graph
    must serve every context length.
    """
    programs = max(1, num_seqs * num_kv_heads)
    splits = cdiv(max(1, PROGRAMS_PER_SM * sm_count * 4 // num_warps), programs)
    if max_seq_len is not None:
        splits = min(splits, max(1, cdiv(max_seq_len, MIN_TOKENS_PER_SPLIT)))
    return min(next_pow2(max(1, splits)), MAX_SPLITS)
