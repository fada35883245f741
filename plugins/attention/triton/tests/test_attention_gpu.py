"""The Triton kernels on a CUDA GPU against the torch reference, at realistic sizes: long and
mixed contexts, every head size and GQA ratio, windows, softcap, block sizes, and replay of a
captured CUDA graph. Random inputs from the test seed (TALLOW_TEST_SEED=random explores others)."""

from __future__ import annotations

import random
import zlib

import pytest
import torch
import triton
import triton.language as tl

from tallow.plugin.testing.seeds import base_seed
from tallow.kernels import allocate_layer
from tallow.layers import AttentionMetadata
from tallow_attention_triton.backend import TritonAttentionBackend
from tallow_attention_triton.kernels.turbo import load_nibble_halves
from tallow_attention_triton.testing import (
    assert_same_cache,
    calibrate_randomly,
    cast_codec,
    grow_keys,
    make_case,
    run_and_check,
    tolerance,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

BASE_SEED = base_seed()
HALF = [torch.bfloat16, torch.float16]


def seed_of(*parts: object) -> int:
    return (zlib.crc32(repr(parts).encode()) ^ BASE_SEED) % (2**31)


def backend(num_splits: int | None = None) -> TritonAttentionBackend:
    be = TritonAttentionBackend()
    be.num_splits = num_splits
    return be


# Contexts that cross block (16), key-tile (32/64) and split boundaries, up to 4000+ tokens.
LONG_CONTEXTS = [0, 1, 15, 16, 17, 63, 64, 65, 100, 511, 512, 513, 1000, 2047, 2048, 4000, 4101]


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("num_splits", [None, 1, 7, 64])
def test_decode_mixed_long_contexts(dtype: torch.dtype, group: int, num_splits: int | None) -> None:
    rng = random.Random(seed_of("decode", dtype, group, num_splits))
    ctx = LONG_CONTEXTS[:]
    rng.shuffle(ctx)
    case = make_case(
        query_lens=[1] * len(ctx),
        context_lens=ctx,
        num_heads=8 * group // 2,
        num_kv_heads=4 if group < 8 else 2,
        head_dim=128,
        block_size=16,
        dtype=dtype,
        device="cuda",
        seed=rng.randrange(2**31),
    )
    run_and_check(case, backend(num_splits))


FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


@pytest.mark.parametrize("cache_dtype", FP8, ids=str)
@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("num_splits", [None, 1, 7])
def test_fp8_cache_long_contexts(
    cache_dtype: torch.dtype, dtype: torch.dtype, num_splits: int | None
) -> None:
    """Decode over an 8-bit float cache (store fused into the split launch or on its own) and a
    mixed batch with prefill chunks, at llama-3-8b's head shape."""
    rng = random.Random(seed_of("fp8", cache_dtype, dtype, num_splits))
    ctx = LONG_CONTEXTS[:]
    rng.shuffle(ctx)
    case = make_case(
        query_lens=[1] * len(ctx),
        context_lens=ctx,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        block_size=16,
        dtype=dtype,
        cache_dtype=cache_dtype,
        device="cuda",
        seed=rng.randrange(2**31),
    )
    run_and_check(case, backend(num_splits))
    case = make_case(
        query_lens=[1, 300, 1, 77],
        context_lens=[3000, 0, 511, 1000],
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        block_size=16,
        dtype=dtype,
        cache_dtype=cache_dtype,
        device="cuda",
        seed=rng.randrange(2**31),
    )
    run_and_check(case, backend(num_splits))


@pytest.mark.parametrize("cache_dtype", FP8, ids=str)
@pytest.mark.parametrize("num_splits", [None, 1, 7])
def test_fp8_cache_scores_that_keep_growing(
    cache_dtype: torch.dtype, num_splits: int | None
) -> None:
    """Decode over an 8-bit cache whose keys grow block after block (llama-3-8b's head shape,
    contexts up to 4101): the running maximum climbs past the lazy rescale's threshold at
    many tiles, and the widened values go through the inline-PTX conversion."""
    rng = random.Random(seed_of("fp8-grow", cache_dtype, num_splits))
    ctx = LONG_CONTEXTS[:]
    rng.shuffle(ctx)
    case = make_case(
        query_lens=[1] * len(ctx),
        context_lens=ctx,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        block_size=16,
        dtype=torch.bfloat16,
        cache_dtype=cache_dtype,
        device="cuda",
        seed=rng.randrange(2**31),
    )
    run_and_check(grow_keys(case), backend(num_splits))


@pytest.mark.parametrize("cache_dtype", FP8, ids=str)
@pytest.mark.parametrize("dtype", HALF + [torch.float32], ids=str)
def test_fp8_store_rounds_like_torch(cache_dtype: torch.dtype, dtype: torch.dtype) -> None:
    """Values off the 8-bit grid (ties included) and beyond its range, stored by the store
    kernel and by the decode launch with the store fused: the same bytes as torch's
    round-to-nearest-even cast after the clamp (tallow.kernels.kv_cache.to_cache_dtype)."""
    from tallow_attention_triton import ops

    g = torch.Generator(device="cuda").manual_seed(seed_of("fp8-round", cache_dtype, dtype))
    n, n_kv, d, block = 64, 8, 128, 16
    k = torch.randn(n, n_kv, d, generator=g, device="cuda") * 60
    v = torch.randn(n, n_kv, d, generator=g, device="cuda") * 60
    k[0, 0, :4] = torch.tensor([1e5, -1e5, 17.0, -25.0])  # clamp, and two e4m3 ties
    k, v = k.to(dtype), v.to(dtype)
    slots = torch.randperm(8 * block, generator=g, device="cuda")[:n]
    slots[5] = -1
    codec = cast_codec(cache_dtype)
    cache = allocate_layer(
        codec,
        num_kv_heads=n_kv,
        head_dim=d,
        block_size=block,
        num_blocks=8,
        model_dtype=dtype,
        device="cuda",
    )
    expected = cache.clone()
    codec.encode(expected, k, v, slots)
    ops.store_kv(cache, k, v, slots)
    assert_same_cache(cache, expected, "store kernel")
    # the fused store: one query per sequence, each sequence's new token at its slot
    seqs = 8
    fused = allocate_layer(
        codec,
        num_kv_heads=n_kv,
        head_dim=d,
        block_size=block,
        num_blocks=8,
        model_dtype=dtype,
        device="cuda",
    )
    want = fused.clone()
    tables = torch.arange(8, dtype=torch.int32, device="cuda").view(seqs, 1)
    new_slots = torch.arange(seqs, device="cuda") * block + 3  # position 3 of each block
    codec.encode(want, k[:seqs], v[:seqs], new_slots)
    q = torch.randn(seqs, 4 * n_kv, d, generator=g, device="cuda").to(dtype)
    out = torch.empty_like(q)
    ops.decode_attention(
        q,
        fused,
        out,
        query_start_loc=torch.arange(seqs + 1, dtype=torch.int32, device="cuda"),
        seq_lens=torch.full((seqs,), 4, dtype=torch.int32, device="cuda"),
        block_tables=tables,
        num_seqs=seqs,
        scale=d**-0.5,
        num_splits=2,
        k=k[:seqs],
        v=v[:seqs],
        slot_mapping=new_slots,
    )
    assert_same_cache(fused, want, "decode with the store fused")
    assert not torch.isnan(out.float()).any()


@pytest.mark.parametrize("cache_dtype", FP8, ids=str)
@pytest.mark.parametrize("num_splits", [None, 1, 7])
@pytest.mark.parametrize("centred", [False, True])
def test_fp8_cache_with_head_scales_long_contexts(
    cache_dtype: torch.dtype, num_splits: int | None, centred: bool
) -> None:
    """An 8-bit cache with a scale per KV head (checkpoint scales) and, centred, a large offset
    per head and channel subtracted from the keys, at llama-3-8b's head shape: the store
    subtracts and divides values off the grid (the bytes as torch's), and decode and a mixed
    batch read it with the queries and the output scaled outside the kernels and the centred
    keys read as stored."""
    from tallow.kernels import CastKVCodec

    rng = random.Random(seed_of("fp8-scaled", cache_dtype, num_splits, centred))
    scales = (
        [rng.uniform(0.005, 3.0) for _ in range(8)],
        [rng.uniform(0.005, 3.0) for _ in range(8)],
    )
    codec = CastKVCodec(storage=cache_dtype, per_head_scales=True, center_keys=centred)
    offset = None
    if centred:
        offset = (
            torch.randn(8, 128, generator=torch.Generator().manual_seed(rng.randrange(2**31))) * 50
        )
    ctx = LONG_CONTEXTS[:]
    rng.shuffle(ctx)
    for q_lens, c_lens in (([1] * len(ctx), ctx), ([1, 300, 1, 77], [3000, 0, 511, 1000])):
        case = make_case(
            query_lens=q_lens,
            context_lens=c_lens,
            num_heads=32,
            num_kv_heads=8,
            head_dim=128,
            block_size=16,
            dtype=torch.bfloat16,
            codec=codec,
            head_scales=scales,
            key_offset=offset,
            device="cuda",
            seed=rng.randrange(2**31),
        )
        g = torch.Generator(device="cuda").manual_seed(case.seed)
        # this step's K/V off the grid: the store's division and rounding against torch's
        case.k.copy_(
            torch.randn(case.k.shape, generator=g, device="cuda") * 2
            + (0.0 if offset is None else offset.cuda())
        )
        case.v.copy_(torch.randn(case.v.shape, generator=g, device="cuda") * 2)
        run_and_check(case, backend(num_splits))


@pytest.mark.parametrize("head_dim", [64, 80, 96, 128, 256, 512])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_every_head_dim_and_group(head_dim: int, group: int, dtype: torch.dtype) -> None:
    kv = 2
    for kind, q_lens, ctx in (
        ("decode", [1] * 6, [0, 5, 130, 700, 1500, 3000]),
        ("mixed", [1, 1, 150, 33, 1, 300], [2000, 7, 0, 900, 64, 250]),
    ):
        case = make_case(
            query_lens=q_lens,
            context_lens=ctx,
            num_heads=kv * group,
            num_kv_heads=kv,
            head_dim=head_dim,
            block_size=16,
            dtype=dtype,
            device="cuda",
            seed=seed_of("dims", head_dim, group, dtype, kind),
        )
        run_and_check(case, backend())


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_chunked_prefill_with_earlier_context(dtype: torch.dtype) -> None:
    """Chunks of 512/1000/77 queries after 0/1500/3000 cached tokens (llama-3-8b heads)."""
    case = make_case(
        query_lens=[512, 1000, 77],
        context_lens=[0, 1500, 3000],
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        block_size=16,
        dtype=dtype,
        device="cuda",
        seed=seed_of("chunked", dtype),
    )
    run_and_check(case, backend())


def test_long_prefill_4096() -> None:
    case = make_case(
        query_lens=[4096],
        context_lens=[0],
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        block_size=16,
        dtype=torch.bfloat16,
        device="cuda",
        seed=seed_of("prefill4096"),
    )
    run_and_check(case, backend())


@pytest.mark.parametrize("host_copies", [True, False])
def test_mixed_varlen_batch(host_copies: bool) -> None:
    """Many decodes (long and short contexts) next to several prefill chunks and empty rows."""
    rng = random.Random(seed_of("varlen", host_copies))
    q_lens, ctx = [], []
    for _ in range(40):
        if rng.random() < 0.75:
            q_lens.append(1)
            ctx.append(rng.randint(0, 4200))
        else:
            q_lens.append(rng.choice([0, 2, rng.randint(3, 700)]))
            ctx.append(rng.choice([0, rng.randint(1, 2500)]))
    case = make_case(
        query_lens=q_lens,
        context_lens=ctx,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        block_size=16,
        dtype=torch.bfloat16,
        device="cuda",
        padding_rows=5,
        host_copies=host_copies,
        seed=rng.randrange(2**31),
    )
    run_and_check(case, backend())


@pytest.mark.parametrize("window", [1, 64, 1000])
@pytest.mark.parametrize("softcap", [None, 30.0])
@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_sliding_window_and_softcap(window: int, softcap: float | None, dtype: torch.dtype) -> None:
    for kind, q_lens, ctx in (
        ("decode", [1] * 5, [0, 50, 999, 1001, 3500]),
        ("mixed", [300, 1, 1200, 1], [0, 2500, 800, 40]),
    ):
        case = make_case(
            query_lens=q_lens,
            context_lens=ctx,
            num_heads=16,
            num_kv_heads=4,
            head_dim=128,
            block_size=16,
            dtype=dtype,
            device="cuda",
            sliding_window=window,
            logit_softcap=softcap,
            seed=seed_of("window", window, softcap, dtype, kind),
        )
        run_and_check(case, backend())


@pytest.mark.parametrize("block_size", [16, 32, 64, 128])
def test_block_sizes(block_size: int) -> None:
    case = make_case(
        query_lens=[1, 1, 400, 1, 37],
        context_lens=[3000, 1, 700, 129, 0],
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        block_size=block_size,
        dtype=torch.bfloat16,
        device="cuda",
        seed=seed_of("block", block_size),
    )
    run_and_check(case, backend())


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_float32(head_dim: int) -> None:
    case = make_case(
        query_lens=[1, 1, 200, 1],
        context_lens=[1500, 0, 300, 77],
        num_heads=8,
        num_kv_heads=2,
        head_dim=head_dim,
        block_size=16,
        dtype=torch.float32,
        device="cuda",
        seed=seed_of("fp32", head_dim),
    )
    run_and_check(case, backend())


def test_any_split_count_gives_the_same_decode() -> None:
    outs = []
    for splits in (1, 2, 3, 8, 33, 64):
        case = make_case(
            query_lens=[1] * 6,
            context_lens=[1, 100, 555, 1024, 2900, 4100],
            num_heads=32,
            num_kv_heads=8,
            head_dim=128,
            dtype=torch.float16,
            device="cuda",
            seed=seed_of("splits"),
        )
        outs.append(run_and_check(case, backend(splits))[: case.valid_rows].float())
    for o in outs[1:]:
        torch.testing.assert_close(o, outs[0], atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("turbo_bits", [None, 4], ids=["cast", "turbo4"])
def test_cuda_graph_capture_and_replay(turbo_bits: int | None) -> None:
    """Capture decode once with the runner's conventions (persistent buffers, max_seq_len =
    max_model_len, padding sequences of length 1 with slot -1), then replay it on fresh batches
    of other sizes and lengths: the results match the reference each time. With a turbo cache
    the graph also holds the queries' rotation and the output's."""
    batch, width, n_blocks = 16, 260, 16 * 251 + 8
    hq, hkv, d, bs = 32, 8, 128, 16
    dev = torch.device("cuda")
    be = backend()

    def fresh(n: int, seed: int):
        rng = random.Random(seed)
        case = make_case(
            query_lens=[1] * n,
            context_lens=[rng.randint(0, 4000) for _ in range(n)],
            num_heads=hq,
            num_kv_heads=hkv,
            head_dim=d,
            block_size=bs,
            dtype=torch.bfloat16,
            device=dev,
            num_blocks=n_blocks,
            codec=turbo_codec(turbo_bits) if turbo_bits else None,
            host_copies=False,
            seed=seed,
        )
        return calibrate_randomly(case, seed)

    first = fresh(batch, seed_of("graph", 0))
    q = first.q.clone()
    k = first.k.clone()
    v = first.v.clone()
    cache = first.kv_cache.clone()
    qsl = torch.arange(batch + 1, dtype=torch.int32, device=dev)
    seq_lens = torch.ones(batch, dtype=torch.int32, device=dev)
    tables = torch.zeros(batch, width, dtype=torch.int32, device=dev)
    slots = torch.full((batch,), -1, dtype=torch.int64, device=dev)
    meta = AttentionMetadata(
        num_seqs=batch,
        num_tokens=batch,
        query_start_loc=qsl,
        seq_lens=seq_lens,
        block_tables=tables,
        slot_mapping=slots,
        max_query_len=1,
        max_seq_len=width * bs,
        block_size=bs,
    )

    def load(case) -> None:
        n = case.meta.num_seqs
        q[:n].copy_(case.q)
        k[:n].copy_(case.k)
        v[:n].copy_(case.v)
        for name, tensor in cache.tensors.items():
            tensor.copy_(case.kv_cache[name])
        seq_lens.fill_(1)
        seq_lens[:n].copy_(case.meta.seq_lens)
        tables.zero_()
        tables[:n, : case.meta.block_tables.shape[1]].copy_(case.meta.block_tables)
        slots.fill_(-1)
        slots[:n].copy_(case.meta.slot_mapping)

    load(first)
    for _ in range(2):  # compile, settle the allocator
        be.forward(first.layer, q, k, v, cache, meta)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = be.forward(first.layer, q, k, v, cache, meta)
    for i, n in enumerate((batch, 5, 1, 11)):
        case = fresh(n, seed_of("graph", i + 1))
        load(case)
        graph.replay()
        torch.cuda.synchronize()
        assert_same_cache(cache, case.expected_cache(), f"graph replay, batch {n}")
        # attention against the reference over the cache the graph wrote (run_and_check)
        scale = 2.0 if turbo_bits else 1.0
        torch.testing.assert_close(
            out[:n],
            case.reference_output(cache),
            **{key: value * scale for key, value in tolerance(torch.bfloat16).items()},
        )


def _compiled_variants(kernels: list) -> int:
    counts = []
    for kernel in kernels:
        caches = getattr(kernel, "device_caches", None)
        if caches is None:
            pytest.skip("this Triton does not expose its compile cache (JITFunction.device_caches)")
        counts.append(sum(len(entry[0]) for entry in caches.values()))
    return sum(counts)


def _packed(meta: AttentionMetadata, shift: int) -> AttentionMetadata:
    """The metadata as slices of packed buffers, laid out like the model runner's (offsets
    that depend on the batch), ``shift`` elements into each buffer."""
    n = meta.num_seqs
    width = meta.block_tables.shape[1]
    i32 = torch.zeros(shift + 2 * n + 1 + n * width, dtype=torch.int32, device="cuda")
    i64 = torch.zeros(shift + meta.slot_mapping.numel(), dtype=torch.int64, device="cuda")
    qsl = i32[shift : shift + n + 1]
    lens = i32[shift + n + 1 : shift + 2 * n + 1]
    tables = i32[shift + 2 * n + 1 :].view(n, width)
    slots = i64[shift:]
    qsl.copy_(meta.query_start_loc)
    lens.copy_(meta.seq_lens)
    tables.copy_(meta.block_tables)
    slots.copy_(meta.slot_mapping)
    return AttentionMetadata(
        num_seqs=n,
        num_tokens=meta.num_tokens,
        query_start_loc=qsl,
        seq_lens=lens,
        block_tables=tables,
        slot_mapping=slots,
        max_query_len=meta.max_query_len,
        max_seq_len=meta.max_seq_len,
        block_size=meta.block_size,
        query_start_loc_cpu=meta.query_start_loc_cpu,
        seq_lens_cpu=meta.seq_lens_cpu,
    )


def test_new_batch_shapes_compile_nothing_new() -> None:
    """Batches of other sizes, other block-table widths and metadata at other offsets (as the
    model runner packs them) reuse the kernels compiled for the first batch: compiling in the
    middle of serving would stall a step for seconds."""
    from tallow_attention_triton.kernels.decode import decode_reduce_kernel, decode_split_kernel
    from tallow_attention_triton.kernels.prefill import prefill_kernel
    from tallow_attention_triton.kernels.store import store_kv_kernel

    kernels = [decode_split_kernel, decode_reduce_kernel, prefill_kernel, store_kv_kernel]
    rng = random.Random(seed_of("recompile"))
    be = backend(num_splits=8)

    def run(num_seqs: int, shift: int) -> None:
        q_lens = [1] * (num_seqs - 1) + [rng.randrange(2, 40)]  # decodes beside a chunk
        ctx = [rng.randrange(1, 300) for _ in range(num_seqs)]
        case = make_case(
            query_lens=q_lens,
            context_lens=ctx,
            num_heads=8,
            num_kv_heads=2,
            head_dim=128,
            dtype=torch.bfloat16,
            device="cuda",
            seed=rng.randrange(2**31),
        )
        case.meta = _packed(case.meta, shift)
        run_and_check(case, be)

    run(3, 0)
    before = _compiled_variants(kernels)
    for num_seqs, shift in [(2, 1), (16, 3), (17, 2), (32, 5), (5, 7), (64, 1)]:
        run(num_seqs, shift)
    assert _compiled_variants(kernels) == before


@pytest.mark.parametrize("kv_codec", ["auto", "fp8", "turbo4"])
def test_an_engine_compiles_no_attention_kernel_while_serving(kv_codec: str) -> None:
    """After start-up (the backend's warm-up, graph capture, the engine's warm-up steps),
    long prompts beside decodes whose contexts split, then decode-only steps, launch only
    attention kernel variants compiled already: no serving step waits for Triton."""
    from tallow.config import config_from_mapping
    from tallow.engine.llm_engine import LLMEngine
    from tallow import SamplingParams
    from tallow_attention_triton.kernels.decode import decode_reduce_kernel, decode_split_kernel
    from tallow_attention_triton.kernels.prefill import prefill_kernel
    from tallow_attention_triton.kernels.store import store_kv_kernel
    from tallow_attention_triton.kernels.turbo import store_turbo_kernel

    kernels = [
        decode_split_kernel,
        decode_reduce_kernel,
        prefill_kernel,
        store_kv_kernel,
        store_turbo_kernel,
    ]
    eng = LLMEngine.from_config(
        config_from_mapping(
            {
                "model": {
                    "source": "random:llama-3.2-1b",
                    "dtype": "bfloat16",
                    "device": "cuda",
                    "max_model_len": 4096,
                },
                "cache": {"num_blocks": 2048, "kv_codec": kv_codec},
            }
        )
    )
    before = _compiled_variants(kernels)
    rng = random.Random(seed_of("serving-compiles", kv_codec))
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)

    def add(lengths: list[int]) -> None:
        for n in lengths:
            eng.add_request(
                eng.next_request_id(), [rng.randrange(10, 100000) for _ in range(n)], params
            )

    add([1500, 2000, 900])
    for _ in range(4):  # the prompts, then their first decode steps
        eng.step()
    add([1800, 600, 3])  # prompts beside sequences decoding ~2,000-token contexts
    while eng.has_unfinished():
        eng.step()
    assert _compiled_variants(kernels) == before


# -- the turbo KV format (tallow-kvcache-turboquant) ---------------------------------------------
TURBO = [8, 4, 3]


def turbo_codec(bits: int):  # noqa: ANN201
    turboquant = pytest.importorskip(
        "tallow_kvcache_turboquant.codec",
        reason="the turbo cases need tallow-kvcache-turboquant (its codecs are the oracle)",
    )
    return {8: turboquant.Turbo8KVCodec, 4: turboquant.Turbo4KVCodec, 3: turboquant.Turbo3KVCodec}[
        bits
    ]()


@pytest.mark.parametrize("bits", TURBO)
@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("num_splits", [None, 1, 7])
def test_turbo_cache_long_contexts(bits: int, dtype: torch.dtype, num_splits: int | None) -> None:
    """Decode over a turbo cache at llama-3-8b's head shape, contexts up to 4101 tokens
    (partial last blocks, split boundaries), and a mixed batch with prefill chunks after
    cached context: the fused store against the codec's encode, attention against the
    reference over its decode."""
    rng = random.Random(seed_of("turbo", bits, dtype, num_splits))
    ctx = LONG_CONTEXTS[:]
    rng.shuffle(ctx)
    for q_lens, contexts in (([1] * len(ctx), ctx), ([1, 300, 1, 77], [3000, 0, 511, 1000])):
        case = make_case(
            query_lens=q_lens,
            context_lens=contexts,
            num_heads=32,
            num_kv_heads=8,
            head_dim=128,
            block_size=16,
            dtype=dtype,
            codec=turbo_codec(bits),
            device="cuda",
            seed=rng.randrange(2**31),
        )
        run_and_check(calibrate_randomly(case, rng.randrange(2**31)), backend(num_splits))


@pytest.mark.parametrize("bits", TURBO)
@pytest.mark.parametrize("head_dim", [64, 80, 96, 128, 256])
@pytest.mark.parametrize("group", [1, 8])
def test_turbo_every_head_dim_and_group(bits: int, head_dim: int, group: int) -> None:
    for kind, q_lens, ctx in (
        ("decode", [1] * 6, [0, 5, 130, 700, 1500, 3000]),
        ("mixed", [1, 1, 150, 33, 1, 300], [2000, 7, 0, 900, 64, 250]),
    ):
        case = make_case(
            query_lens=q_lens,
            context_lens=ctx,
            num_heads=2 * group,
            num_kv_heads=2,
            head_dim=head_dim,
            block_size=16,
            dtype=torch.bfloat16,
            codec=turbo_codec(bits),
            device="cuda",
            seed=seed_of("turbo-dims", bits, head_dim, group, kind),
        )
        run_and_check(calibrate_randomly(case, head_dim + group), backend())


@pytest.mark.parametrize("bits", TURBO)
@pytest.mark.parametrize("softcap", [None, 30.0])
def test_turbo_sliding_window_and_softcap(bits: int, softcap: float | None) -> None:
    for kind, q_lens, ctx in (
        ("decode", [1] * 5, [0, 50, 999, 1001, 3500]),
        ("mixed", [300, 1, 1200, 1], [0, 2500, 800, 40]),
    ):
        case = make_case(
            query_lens=q_lens,
            context_lens=ctx,
            num_heads=16,
            num_kv_heads=4,
            head_dim=128,
            block_size=16,
            dtype=torch.bfloat16,
            codec=turbo_codec(bits),
            device="cuda",
            sliding_window=64,
            logit_softcap=softcap,
            seed=seed_of("turbo-window", bits, softcap),
        )
        run_and_check(calibrate_randomly(case, bits), backend())


@triton.jit
def _unpack_nibble_tile(codes_ptr, out_ptr, IN_PTX: tl.constexpr):
    """The 32 x 64 bytes at ``codes_ptr`` unpacked into 32 x 128 fp16 (low nibbles, then high)."""
    offs_n = tl.arange(0, 32)
    offs_h = tl.arange(0, 64)
    lo, hi = load_nibble_halves(
        codes_ptr, offs_n * 64, offs_n, offs_n < 32, offs_h, 64, IN_PTX, tl.float16
    )
    dst = out_ptr + offs_n[:, None] * 128 + offs_h[None, :]
    tl.store(dst, lo)
    tl.store(dst + 64, hi)


def test_nibbles_unpacked_in_ptx_are_the_centered_codes() -> None:
    """The 4-bit decode's PTX unpacking (kernels/turbo.py) against torch on every byte value
    in every position of a tile: low nibble - 7.5 and high nibble - 7.5, exactly, as the
    register path computes them."""
    g = torch.Generator(device="cuda").manual_seed(seed_of("nibbles"))
    codes = torch.cat(
        [
            torch.arange(256, device="cuda"),
            torch.randint(0, 256, (32 * 64 - 256,), generator=g, device="cuda"),
        ]
    )
    codes = codes[torch.randperm(codes.numel(), generator=g, device="cuda")].to(torch.uint8)
    b = codes.view(32, 64).int()
    want = (torch.cat([b & 15, b >> 4], dim=1).float() - 7.5).half()
    for in_ptx in (True, False):
        out = torch.full((32, 128), float("nan"), dtype=torch.float16, device="cuda")
        _unpack_nibble_tile[(1,)](codes, out, IN_PTX=in_ptx, num_warps=1)
        assert torch.equal(out, want), f"in_ptx={in_ptx}: {(out != want).sum()} values differ"


@pytest.mark.parametrize("bits", TURBO)
@pytest.mark.parametrize("dtype", HALF + [torch.float32], ids=str)
def test_turbo_store_codes_match_the_codec(bits: int, dtype: torch.dtype) -> None:
    """The fused store on 2,048 tokens of keys with a large shared offset: its codes are the
    codec's reference codes except for the rare coordinate on a rounding boundary (the
    rotation sums in another order), which lands on the neighbouring code; scales agree to a
    float16 step; slot -1 writes nothing."""
    from tallow_attention_triton import ops
    from tallow_kvcache_turboquant.quantize import unpack

    codec = turbo_codec(bits)
    g = torch.Generator(device="cuda").manual_seed(seed_of("turbo-store", bits, dtype))
    n, n_kv, d, block = 2048, 8, 128, 16
    k = (torch.randn(n, n_kv, d, generator=g, device="cuda") * 3 + 20).to(dtype)
    v = torch.randn(n, n_kv, d, generator=g, device="cuda").to(dtype)
    slots = torch.randperm(160 * block, generator=g, device="cuda")[:n]
    slots[::97] = -1
    cache = kv_cache_of(codec, n_kv, d, block, 160)
    cache["k_offset"].copy_(k.float().mean(0))
    cache["k_smooth"].uniform_(0.5, 2.0, generator=g)
    expected = cache.clone()
    codec.encode(expected, k, v, slots)
    ops.store_kv(cache, k, v, slots)
    for name in ("k", "v"):
        torch.testing.assert_close(
            cache[f"{name}_scales"].float(), expected[f"{name}_scales"].float(), rtol=1e-3, atol=0
        )
        got = unpack(cache[f"{name}_codes"], bits, d).int()
        want = unpack(expected[f"{name}_codes"], bits, d).int()
        diff = (got - want).abs()
        assert int(diff.max()) <= 1, f"{name}: a code off by {int(diff.max())}"
        assert float((diff > 0).float().mean()) < 1e-3, f"{name}: too many codes differ"
    untouched = torch.ones(160 * block, dtype=torch.bool, device="cuda")
    untouched[slots[slots >= 0]] = False
    assert int(cache["k_codes"].flatten(0, 1)[untouched].count_nonzero()) == 0


def kv_cache_of(codec, n_kv: int, d: int, block: int, blocks: int):  # noqa: ANN001, ANN201
    return allocate_layer(
        codec,
        num_kv_heads=n_kv,
        head_dim=d,
        block_size=block,
        num_blocks=blocks,
        model_dtype=torch.bfloat16,
        device="cuda",
    )
