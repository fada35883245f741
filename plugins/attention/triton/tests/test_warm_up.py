"""The backend's warm-up launches every kernel variant that serving steps launch.

Triton compiles a kernel variant (one set of ``constexpr`` values and launch options) the first
time it is launched, which takes seconds. Here the kernels are replaced by recorders of the
variant each launch asks for, so any batch shape can be "launched" on a CPU without running
anything (the backend is told it runs under Triton's interpreter, which accepts CPU tensors):
the variants of many serving-like batches must all have been launched by ``warm_up`` already.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from tallow.kernels import LayerKVCache, allocate_layer
from tallow.layers import AttentionLayer, AttentionMetadata
from tallow_attention_triton import ops
from tallow_attention_triton.backend import TritonAttentionBackend
from tallow_attention_triton.heuristics import MIN_TOKENS_PER_SPLIT
from tallow_attention_triton.testing import cast_codec

KERNELS = ("decode_split_kernel", "decode_reduce_kernel", "prefill_kernel", "store_kv_kernel")


class _Recorder:
    """Stands in for a Triton kernel: ``kernel[grid](*args, **variant)`` records the variant."""

    def __init__(self, name: str, seen: set[tuple[Any, ...]]) -> None:
        self.name, self.seen = name, seen

    def __getitem__(self, grid: tuple[int, ...]):  # noqa: ANN204
        def launch(*args: Any, **variant: Any) -> None:
            self.seen.add((self.name, tuple(sorted(variant.items()))))

        return launch


@pytest.fixture
def launched(monkeypatch: pytest.MonkeyPatch) -> set[tuple[Any, ...]]:
    seen: set[tuple[Any, ...]] = set()
    # CPU tensors pass the backend's device check as under the interpreter; nothing runs
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for name in KERNELS:
        monkeypatch.setattr(ops, name, _Recorder(name, seen))
    return seen


def _batch(
    layer: AttentionLayer,
    dtype: torch.dtype,
    query_lens: list[int],
    seq_lens: list[int],
    padding: int,
    host_copies: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, AttentionMetadata]:
    """q/k/v and metadata of a batch of any size: nothing runs, so the values do not matter
    (and no cache of that size is needed), only the shapes and the metadata's numbers."""
    n_tokens = sum(query_lens)
    total = n_tokens + padding
    qsl = [0]
    for n in query_lens:
        qsl.append(qsl[-1] + n)
    meta = AttentionMetadata(
        num_seqs=len(query_lens),
        num_tokens=total,
        query_start_loc=torch.tensor(qsl, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=torch.zeros(len(query_lens), 1, dtype=torch.int32),
        slot_mapping=torch.zeros(total, dtype=torch.int64),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        block_size=16,
        query_start_loc_cpu=qsl if host_copies else None,
        seq_lens_cpu=seq_lens if host_copies else None,
    )
    q = torch.zeros(total, layer.num_heads, layer.head_dim, dtype=dtype)
    k = torch.zeros(total, layer.num_kv_heads, layer.head_dim, dtype=dtype)
    return q, k, k.clone(), meta


def _serving_batches(rng: random.Random, count: int):  # noqa: ANN202
    """(query lengths, sequence lengths, padding rows) as serving produces them: decode-only
    steps of any batch size (CUDA-graph batches padded), prompts beside decodes, prompt-only
    steps; contexts from a few tokens to many thousands (several splits per sequence)."""
    for _ in range(count):
        kind = rng.choice(["decode", "decode", "mixed", "prompt"])
        n = rng.choice([1, 2, 3, 5, 8, 13, 40, 96, 200, 511, 1000])
        seq_lens = [
            rng.choice([1, 7, 100, MIN_TOKENS_PER_SPLIT + 1, 900, 3000, 9000, 40000])
            for _ in range(n)
        ]
        if kind == "decode":
            query_lens, padding = [1] * n, rng.choice([0, 0, 3])
        elif kind == "mixed":
            query_lens = [1] * n + [rng.randint(2, 600)]
            seq_lens = seq_lens + [query_lens[-1] + rng.choice([0, 100, 5000])]
            padding = 0
        else:  # a prompt step holds a few thousand tokens
            query_lens = [rng.randint(2, 900) for _ in range(min(n, 8))]
            seq_lens = [q + rng.choice([0, 0, 300]) for q in query_lens]
            padding = 0
        yield query_lens, seq_lens, padding


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=str)
@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim", "window", "softcap"),
    [
        (32, 8, 128, None, None),  # llama-3-8b
        (16, 8, 64, 512, 30.0),  # a sliding-window, soft-capped layer
        (8, 8, 256, None, None),  # 4-warp tiles even over an 8-bit cache
    ],
)
def test_warm_up_launches_what_serving_launches(
    launched: set[tuple[Any, ...]],
    cache_dtype: torch.dtype,
    heads: int,
    kv_heads: int,
    head_dim: int,
    window: int | None,
    softcap: float | None,
) -> None:
    dtype = torch.bfloat16
    layer = AttentionLayer(
        layer_index=3,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        scale=head_dim**-0.5,
        sliding_window=window,
        logit_softcap=softcap,
    )
    cache = allocate_layer(
        cast_codec(cache_dtype),
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        block_size=16,
        num_blocks=4,
        model_dtype=dtype,
    )
    be = TritonAttentionBackend()
    be.warm_up([layer, layer], [cache, cache], dtype)
    warmed = set(launched)
    assert be.num_splits is None  # the backend's own setting is back

    launched.clear()
    rng = random.Random(7)
    for query_lens, seq_lens, padding in _serving_batches(rng, 150):
        q, k, v, meta = _batch(
            layer, dtype, query_lens, seq_lens, padding, host_copies=rng.random() < 0.7
        )
        be.forward(layer, q, k, v, cache, meta)
    served = set(launched)
    missing = served - warmed
    assert not missing, f"{len(missing)} variants compile while serving: {sorted(missing)[:2]}"
    # the batches reach what short warm-up prompts do not: split contexts beside prompts
    assert any(
        name == "decode_split_kernel"
        and ("MIXED", True) in variant
        and ("SINGLE_SPLIT", False) in variant
        for name, variant in served
    )
    assert {name for name, _ in served} == set(KERNELS)


def test_warm_up_leaves_the_given_caches_untouched(
    launched: set[tuple[Any, ...]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """It launches on caches of its own: the engine's caches only describe the layout."""
    layer = AttentionLayer(layer_index=0, num_heads=4, num_kv_heads=2, head_dim=64, scale=0.125)
    cache = allocate_layer(
        cast_codec(torch.bfloat16),
        num_kv_heads=2,
        head_dim=64,
        block_size=16,
        num_blocks=3,
        model_dtype=torch.bfloat16,
    )
    for tensor in cache.tensors.values():
        tensor.fill_(5.0)
    ptrs: set[int] = set()
    original = ops.store_kv

    def store_kv(kv_cache: LayerKVCache, *args: Any) -> None:
        ptrs.update(t.data_ptr() for t in kv_cache.tensors.values())
        original(kv_cache, *args)

    monkeypatch.setattr(ops, "store_kv", store_kv)
    TritonAttentionBackend().warm_up([layer], [cache], torch.bfloat16)
    assert ptrs and not ptrs & {t.data_ptr() for t in cache.tensors.values()}
    assert all(torch.equal(t, torch.full_like(t, 5.0)) for t in cache.tensors.values())


def test_warm_up_covers_the_steps_of_an_encoder(launched: set[tuple[Any, ...]]) -> None:
    """A bidirectional (causal=False) layer, as all-MiniLM-L6-v2's: embedding steps hold whole
    inputs of any length, one-token inputs among them; warm-up launched every variant."""
    dtype = torch.bfloat16
    layer = AttentionLayer(
        layer_index=0, num_heads=12, num_kv_heads=12, head_dim=32, scale=32**-0.5, causal=False
    )
    cache = allocate_layer(
        cast_codec(dtype),
        num_kv_heads=12,
        head_dim=32,
        block_size=16,
        num_blocks=4,
        model_dtype=dtype,
    )
    be = TritonAttentionBackend()
    be.warm_up([layer], [cache], dtype)
    warmed = set(launched)
    launched.clear()
    rng = random.Random(11)
    for _ in range(60):
        n = rng.choice([1, 2, 7, 64, 256])
        query_lens = [rng.choice([1, 2, 9, 128, 512]) for _ in range(n)]
        q, k, v, meta = _batch(layer, dtype, query_lens, list(query_lens), 0, host_copies=True)
        be.forward(layer, q, k, v, cache, meta)
    served = set(launched)
    assert any(
        name == "prefill_kernel" and ("CAUSAL", False) in variant for name, variant in served
    )
    missing = served - warmed
    assert not missing, f"{len(missing)} variants compile while serving: {sorted(missing)[:2]}"
