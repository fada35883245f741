"""KV-sharing layers (``AttentionLayer.kv_shared_from``) through the Triton kernels: a layer
that reads an earlier layer's cache attends over it like the torch reference and stores
nothing, on the decode path (with the store that rides in the split launch), the prefill path
and mixed steps, under a sliding window and a softcap, over a cast and an fp8 cache.

Not collected on its own: ``test_interpret.py`` runs it under ``TRITON_INTERPRET=1``; on a
CUDA machine ``python -m pytest plugins/attention/triton/tests/kv_sharing_cases.py`` runs it
on the GPU.
"""

from __future__ import annotations

import dataclasses
import zlib

import pytest
import torch

from tallow.plugin.testing.seeds import base_seed
from tallow_attention_triton import ops
from tallow_attention_triton.backend import TritonAttentionBackend
from tallow_attention_triton.testing import check_output, describe, make_case, run_and_check

if ops.interpreting():
    DEVICE = "cpu"
elif torch.cuda.is_available():
    DEVICE = "cuda"
else:
    pytest.skip(
        "needs a CUDA GPU or TRITON_INTERPRET=1 set before triton is imported "
        "(test_interpret.py runs this module that way)",
        allow_module_level=True,
    )


def seed_of(*parts: object) -> int:
    return (zlib.crc32(repr(parts).encode()) ^ base_seed()) % (2**31)


@pytest.mark.parametrize(
    ("kind", "q_lens", "ctx"),
    [
        ("decode", [1, 1, 1], [0, 19, 40]),
        ("prefill", [13, 6], [0, 21]),
        ("mixed", [9, 1, 1], [3, 30, 7]),
    ],
)
@pytest.mark.parametrize(
    ("window", "softcap", "cache_dtype"),
    [(None, None, None), (6, 3.0, None), (None, None, torch.float8_e5m2)],
    ids=str,
)
@pytest.mark.parametrize("head_dim", [32, 512])  # 512: Gemma 4's shared full-attention layers
def test_shared_layer_reads_the_source_cache_and_stores_nothing(
    kind, q_lens, ctx, window, softcap, cache_dtype, head_dim
):
    case = make_case(
        query_lens=q_lens,
        context_lens=ctx,
        num_heads=4,
        num_kv_heads=2,
        head_dim=head_dim,
        block_size=8,
        dtype=torch.bfloat16,
        cache_dtype=cache_dtype,
        device=DEVICE,
        sliding_window=window,
        scale=0.4,
        seed=seed_of("kv-sharing", kind, window, cache_dtype, head_dim),
    )
    backend = TritonAttentionBackend()
    backend.num_splits = 4  # the decode path's fused store, which a shared layer must skip
    run_and_check(case, backend)  # the source layer stores this step's K/V
    stored = [t.clone() for t in case.kv_cache.paged()]
    shared = dataclasses.replace(
        case.layer,
        layer_index=case.layer.layer_index + 1,
        num_heads=8,
        scale=0.25,
        logit_softcap=softcap,
        kv_shared_from=case.layer.layer_index,
    )
    g = torch.Generator().manual_seed(seed_of("kv-sharing-q", kind))
    q = torch.randn(case.q.shape[0], 8, head_dim, generator=g).to(torch.bfloat16).to(DEVICE)
    placeholder = q.new_zeros(()).expand(q.shape[0], 2, head_dim)
    out = backend.forward(shared, q, placeholder, placeholder, case.kv_cache, case.meta)
    for before, after in zip(stored, case.kv_cache.paged()):
        assert torch.equal(before.view(torch.uint8), after.view(torch.uint8)), (
            f"a KV-sharing layer wrote to the cache ({describe(case)})"
        )
    ref_case = dataclasses.replace(case, layer=shared, q=q)
    check_output(
        out[: case.valid_rows],
        ref_case.reference_output(case.kv_cache),
        q.dtype,
        describe(ref_case),
    )
