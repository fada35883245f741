"""Random GGML blocks for tests: random bytes, with the fp16 scale fields of half the blocks
set to extreme values (zeros of both signs, the largest and smallest fp16 magnitudes,
subnormals, infinities, NaN)."""

from __future__ import annotations

import numpy as np

from tallow_quant_gguf.qtypes import QUANT_TYPES

#: byte offsets of each type's fp16 fields (d, and dmin / m where the type has one)
FP16_FIELDS = {
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q8_0": (0,),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
    "IQ4_NL": (0,),
    "IQ4_XS": (0,),
}
EXTREMES = np.array(
    [
        0.0,
        -0.0,
        65504.0,
        -65504.0,
        2.0**-24,
        -(2.0**-24),
        2.0**-14,
        6.0e-5,
        np.inf,
        -np.inf,
        np.nan,
        1.0,
        -1.0,
        0.5,
    ],
    dtype=np.float16,
)


def random_blocks(
    qtype: str,
    rows: int,
    blocks_per_row: int,
    seed: int = 0,
    extremes: bool = True,
    d_range: tuple[float, float] = (1e-4, 0.5),
) -> np.ndarray:
    """uint8 ``[rows, blocks_per_row * block_bytes]`` of GGML blocks of ``qtype``; the ordinary
    fp16 fields are drawn with magnitudes in ``d_range``."""
    qt = QUANT_TYPES[qtype]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(rows * blocks_per_row, qt.block_bytes), dtype=np.uint8)
    n = blocks.shape[0]
    for at in FP16_FIELDS[qtype]:
        # ordinary scales everywhere first, then extremes in every other block
        normal = (rng.uniform(*d_range, n) * rng.choice([-1, 1], n)).astype(np.float16)
        if extremes:
            pick = rng.integers(0, len(EXTREMES), n)
            normal = np.where(np.arange(n) % 2 == 1, EXTREMES[pick], normal).astype(np.float16)
        blocks[:, at : at + 2] = normal.view(np.uint8).reshape(n, 2)
    return blocks.reshape(rows, blocks_per_row * qt.block_bytes)
