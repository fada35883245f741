"""Paged attention of Gemma's shape through the Triton backend, against the torch reference.

Gemma layers have 256-wide heads, grouped K/V heads, a sliding window on most layers and (Gemma
2) a softcap on the scores. The attention plugin's own cases cover windows and softcaps on
64-wide heads; these cover them at Gemma's head size, with windows that start inside a block and
inside a key tile, prefill chunks that straddle the window's edge, and decode rows beside them.

Not collected on its own (no ``test_`` prefix): ``test_attention_kernels.py`` runs it in a
subprocess under ``TRITON_INTERPRET=1`` (the kernels' logic on the CPU) and, on a CUDA machine,
natively.
"""

from __future__ import annotations

import zlib

import pytest
import torch

triton_backend = pytest.importorskip(
    "tallow_attention_triton.backend", reason="tallow-attention-triton is not installed"
)
from tallow_attention_triton import ops  # noqa: E402
from tallow_attention_triton.testing import make_case, run_and_check  # noqa: E402

if ops.interpreting():
    DEVICE = "cpu"
elif torch.cuda.is_available():
    DEVICE = "cuda"
else:
    pytest.skip(
        "needs a CUDA GPU or TRITON_INTERPRET=1 set before triton is imported",
        allow_module_level=True,
    )


def backend(num_splits: int | None) -> object:
    be = triton_backend.TritonAttentionBackend()
    be.num_splits = num_splits
    return be


@pytest.mark.parametrize(
    ("window", "softcap", "dtype"),
    [
        (19, None, torch.bfloat16),  # Gemma 3: window only
        (19, 50.0, torch.float16),  # Gemma 2: window and softcap
        (None, 50.0, torch.bfloat16),  # Gemma 2's global layers: softcap only
    ],
)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_gemma_heads(window, softcap, dtype, num_splits):
    cases = (("decode", [1, 1, 1, 1], [0, 18, 19, 70]), ("mixed", [1, 27, 9, 1], [44, 0, 15, 5]))
    for kind, query_lens, context_lens in cases:
        seed = zlib.crc32(repr((kind, window, softcap, num_splits)).encode())
        case = make_case(
            query_lens=query_lens,
            context_lens=context_lens,
            num_heads=8,
            num_kv_heads=4,
            head_dim=256,
            block_size=16,
            dtype=dtype,
            device=DEVICE,
            sliding_window=window,
            logit_softcap=softcap,
            scale=256**-0.5,
            seed=seed,
        )
        run_and_check(case, backend(num_splits))
