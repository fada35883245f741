"""Run a ``tallow`` command with the Triton decode kernel's launch parameters for 8-bit caches
overridden, for A/B runs of a tile choice through the whole engine without a code change.

Usage: python bench/gpu/with_decode_tiles.py '{"TILE_N": 128, "num_stages": 2}' bench throughput ...
The JSON object's keys are decode_spec keys (TILE_N, num_stages, num_warps, maxnreg, ...).
"""

from __future__ import annotations

import json
import sys

from tallow_attention_triton import ops


def main() -> int:
    overrides = json.loads(sys.argv[1])
    original = ops.decode_spec

    def decode_spec(**kw):
        spec = original(**kw)
        return {**spec, **overrides} if kw.get("cache_bytes", 2) == 1 else spec

    ops.decode_spec = decode_spec
    from tallow.cli import main as tallow_main

    return tallow_main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
