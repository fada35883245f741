"""One llama-3-8b decode attention launch (443 sequences, contexts 1000..1480) of a chosen cache
and tile variant, for Nsight Compute to read the hardware counters of.

Usage: ncu --clock-control none -k regex:decode_split --launch-skip 1 --launch-count 1 \
           python bench/gpu/ncu_decode.py VARIANT
VARIANT: bf16 | fp8 (the default tiles of an 8-bit cache: one warp, 32 keys) | fp8-4w (4-warp
programs, 64-key tiles) | fp8-128 (4 warps, 128-key tiles, 2 stages).
"""

from __future__ import annotations

import sys

import torch

from tallow_attention_triton import ops
from tallow_attention_triton.backend import TritonAttentionBackend

from kv_fp8_probe import decode_case  # this folder is on sys.path as a script

VARIANTS = {
    "bf16": (torch.bfloat16, {}),
    "fp8": (torch.float8_e4m3fn, {}),
    "fp8-4w": (torch.float8_e4m3fn, dict(TILE_N=64, num_warps=4, num_stages=3)),
    "fp8-128": (torch.float8_e4m3fn, dict(TILE_N=128, num_warps=4, num_stages=2)),
}


def main() -> None:
    cache_dtype, overrides = VARIANTS[sys.argv[1]]
    original = ops.decode_spec
    ops.decode_spec = lambda **kw: {**original(**kw), **overrides}
    case, _ = decode_case(443, cache_dtype)
    be = TritonAttentionBackend()
    for _ in range(2):  # the first launch compiles; the profiler takes the second
        be.forward(case.layer, case.q, case.k, case.v, case.kv_cache, case.meta)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
