"""Small paged-attention cases that check the kernels' logic against the torch reference.

Not collected on its own (no ``test_`` prefix): ``test_interpret.py`` runs it in a subprocess
with ``TRITON_INTERPRET=1`` so the Triton kernels execute on the CPU, and on a CUDA machine
``python -m pytest plugins/attention/triton/tests/kernel_cases.py`` runs it on the GPU. Shapes
are tiny (the interpreter runs each program in numpy) but cross every boundary the kernels
have: cache blocks, key tiles, query tiles, decode splits, sliding windows.
"""

from __future__ import annotations

import random
import zlib

import pytest
import torch

from tallow.plugin.testing.seeds import base_seed
from tallow.kernels import CastKVCodec
from tallow_attention_triton import ops
from tallow_attention_triton.backend import TritonAttentionBackend
from tallow_attention_triton.heuristics import decode_tiles, prefill_tiles
from tallow_attention_triton.testing import (
    calibrate_randomly,
    grow_keys,
    make_case,
    run_and_check,
)

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

DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def backend(num_splits: int | None = None) -> TritonAttentionBackend:
    be = TritonAttentionBackend()
    be.num_splits = num_splits
    return be


#: the run's seed (tallow.plugin.testing.seeds); failures print each case's seed
BASE_SEED = base_seed()


def seed_of(*parts: object) -> int:
    return (zlib.crc32(repr(parts).encode()) ^ BASE_SEED) % (2**31)


@pytest.mark.parametrize(
    ("dtype", "num_splits"),
    [
        (torch.bfloat16, 3),
        (torch.float16, 1),
        (torch.float32, None),
        (torch.bfloat16, 8),
    ],
    ids=str,
)
def test_decode_mixed_lengths(dtype: torch.dtype, num_splits: int | None) -> None:
    """Context lengths from 1 token up past several key tiles; any split count gives the same
    attention (splits beyond a short context's tiles stay empty)."""
    tile = decode_tiles(64, 2, torch.finfo(dtype).bits // 8).tile_n
    ctx = [0, 3, 7, 8, tile - 1, tile, 2 * tile + 5, 4 * tile + 1]
    case = make_case(
        query_lens=[1] * len(ctx),
        context_lens=ctx,
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        block_size=8,
        dtype=dtype,
        device=DEVICE,
        seed=seed_of("decode", dtype, num_splits),
    )
    run_and_check(case, backend(num_splits))


# every head size and GQA ratio 1/4/8 at least once (the GPU tests take the full product)
@pytest.mark.parametrize(
    ("head_dim", "group"),
    [
        (64, 1),
        (80, 4),
        (96, 8),
        (128, 1),
        (128, 8),
        (256, 4),
        (512, 8),  # Gemma 4's full-attention layers (E2B: 8 query heads on 1 KV head)
        (320, 2),  # padded to a 512-wide tile
    ],
)
def test_gqa_and_head_dims(head_dim: int, group: int) -> None:
    """A decode batch and a mixed batch (decodes next to prefill chunks) per shape."""
    kv = 2 if group < 8 else 1
    for kind, q_lens, ctx in (
        ("decode", [1, 1, 1], [0, 37, 90]),
        ("mixed", [1, 9, 20], [40, 0, 13]),
    ):
        case = make_case(
            query_lens=q_lens,
            context_lens=ctx,
            num_heads=kv * group,
            num_kv_heads=kv,
            head_dim=head_dim,
            block_size=16,
            dtype=torch.bfloat16 if kind == "mixed" else torch.float16,
            device=DEVICE,
            seed=seed_of("gqa", group, head_dim, kind),
        )
        run_and_check(case, backend(4))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_chunked_prefill_crosses_query_tiles(dtype: torch.dtype) -> None:
    """Chunks longer than one query tile, with earlier context ending mid-block and
    mid-key-tile, so tile-local positions, the unmasked/masked split and the causal diagonal are
    all exercised."""
    tiles = prefill_tiles(64, 2, torch.finfo(dtype).bits // 8)
    q_lens = [tiles.block_q + 3, 2 * tiles.block_q + 1, 5]
    ctx = [tiles.tile_n + 3, 0, 2 * tiles.tile_n - 1]
    case = make_case(
        query_lens=q_lens,
        context_lens=ctx,
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        block_size=8,
        dtype=dtype,
        device=DEVICE,
        seed=seed_of("chunked", dtype),
    )
    run_and_check(case, backend())


@pytest.mark.parametrize("host_copies", [True, False])
def test_mixed_batch_decodes_and_chunks(host_copies: bool) -> None:
    """Decode rows (served by split-K) next to prefill chunks (served by the varlen kernel),
    with and without the host copies of query_start_loc; an empty sequence in the middle."""
    case = make_case(
        query_lens=[1, 1, 17, 0, 1, 6],
        context_lens=[150, 4, 30, 12, 0, 0],
        num_heads=8,
        num_kv_heads=2,
        head_dim=64,
        block_size=16,
        dtype=torch.bfloat16,
        device=DEVICE,
        host_copies=host_copies,
        seed=seed_of("mixed", host_copies),
    )
    run_and_check(case, backend(4))


@pytest.mark.parametrize(("window", "softcap"), [(1, None), (5, 4.0), (16, None), (40, 4.0)])
def test_sliding_window_and_softcap(window: int, softcap: float | None) -> None:
    for kind, q_lens, ctx in (
        ("decode", [1, 1, 1], [0, 20, 100]),
        ("prefill", [30, 1, 12], [0, 45, 60]),
    ):
        case = make_case(
            query_lens=q_lens,
            context_lens=ctx,
            num_heads=4,
            num_kv_heads=2,
            head_dim=64,
            block_size=8,
            dtype=torch.float16,
            device=DEVICE,
            sliding_window=window,
            logit_softcap=softcap,
            scale=0.3,
            seed=seed_of("window", window, softcap, kind),
        )
        run_and_check(case, backend(4))


@pytest.mark.parametrize(("chunk", "num_splits"), [(1, 1), (8, 3), (13, None), (40, 8)])
def test_chunked_local_attention(chunk: int, num_splits: int | None) -> None:
    """Llama 4's chunked local attention: each query over the keys of its own chunk. Decodes
    at a chunk's first, middle and last position and past several chunks (split over more
    tiles than the chunk has), whole prompts and chunked prefills across chunk boundaries,
    and both beside each other; chunks of 13 and 40 are not multiples of the tiles."""
    for kind, q_lens, ctx in (
        ("decode", [1, 1, 1, 1], [0, chunk - 1, chunk, 3 * chunk + chunk // 2]),
        ("prefill", [2 * chunk + 3, chunk + 5, 7], [0, chunk // 2, max(2 * chunk - 3, 0)]),
        ("mixed", [1, 3 * chunk, 1, 4], [5 * chunk + 1, 0, chunk - 1, max(chunk - 2, 0)]),
    ):
        case = make_case(
            query_lens=q_lens,
            context_lens=ctx,
            num_heads=4,
            num_kv_heads=2,
            head_dim=64,
            block_size=8,
            dtype=torch.float16,
            device=DEVICE,
            attention_chunk_size=chunk,
            scale=0.3,
            seed=seed_of("chunked", chunk, num_splits, kind),
        )
        run_and_check(case, backend(num_splits))


@pytest.mark.parametrize("bits", [4, 8])
def test_chunked_local_attention_over_a_turbo_cache(bits: int) -> None:
    chunk = 13
    for kind, q_lens, ctx in (
        ("decode", [1, 1], [chunk, 4 * chunk + 2]),
        ("prefill", [30, 1], [0, 45]),
    ):
        case = make_case(
            query_lens=q_lens,
            context_lens=ctx,
            num_heads=4,
            num_kv_heads=2,
            head_dim=64,
            block_size=8,
            dtype=torch.float16,
            codec=turbo_codec(bits),
            device=DEVICE,
            attention_chunk_size=chunk,
            scale=0.3,
            seed=seed_of("turbo-chunked", bits, kind),
        )
        run_and_check(calibrate_randomly(case, bits), backend(2))


def test_a_chunk_with_a_sliding_window_is_refused() -> None:
    case = make_case(
        query_lens=[1],
        context_lens=[4],
        num_heads=2,
        num_kv_heads=1,
        head_dim=64,
        device=DEVICE,
        sliding_window=4,
        attention_chunk_size=8,
    )
    assert backend().supports_layer(case.layer) == [
        "chunked local attention (attention_chunk_size 8) together with a sliding window (4)"
    ]
    with pytest.raises(ValueError, match="either a sliding window or chunked local attention"):
        ops.decode_attention(
            case.q,
            case.kv_cache,
            torch.empty_like(case.q),
            query_start_loc=case.meta.query_start_loc,
            seq_lens=case.meta.seq_lens,
            block_tables=case.meta.block_tables,
            num_seqs=1,
            scale=0.1,
            sliding_window=4,
            attention_chunk_size=8,
        )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_bidirectional_whole_sequences(dtype: torch.dtype) -> None:
    """An encoder step (causal=False): whole sequences, each query sees every key of its
    sequence. Lengths cross query tiles and key tiles and end mid-tile; one-token sequences go
    to the decode kernel beside them."""
    tiles = prefill_tiles(32, 2, torch.finfo(dtype).bits // 8)
    q_lens = [2 * tiles.block_q + 3, 1, tiles.tile_n + 5, 7, 1]
    case = make_case(
        query_lens=q_lens,
        context_lens=[0] * len(q_lens),
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        block_size=8,
        dtype=dtype,
        device=DEVICE,
        causal=False,
        seed=seed_of("bidirectional", dtype),
    )
    run_and_check(case, backend())


@pytest.mark.parametrize("block_size", [1, 32, 128])
def test_block_sizes(block_size: int) -> None:
    case = make_case(
        query_lens=[1, 7, 1],
        context_lens=[70, 33, 1],
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        block_size=block_size,
        dtype=torch.float16,
        device=DEVICE,
        seed=seed_of("block", block_size),
    )
    run_and_check(case, backend(2))


def test_padding_rows_and_graph_style_padding() -> None:
    """Trailing rows with slot -1 belong to no sequence and store nothing; CUDA-graph padding
    sequences (one query, length 1, slot -1) read a finite slot and write nothing to the cache."""
    case = make_case(
        query_lens=[1, 1, 1],
        context_lens=[40, 0, 9],
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        block_size=16,
        dtype=torch.bfloat16,
        device=DEVICE,
        padding_rows=3,
        seed=seed_of("pad"),
    )
    run_and_check(case, backend())
    # A graph-padding sequence: its slot is -1, so its length-1 context is a cached token.
    case = make_case(
        query_lens=[1, 1],
        context_lens=[25, 1],
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        block_size=16,
        dtype=torch.bfloat16,
        device=DEVICE,
        host_copies=False,
        seed=seed_of("graphpad"),
    )
    case.meta.slot_mapping[1] = -1
    case.meta.seq_lens[1] = 1
    case.meta.max_seq_len = 4096
    run_and_check(case, backend())


def test_cache_dtype_differs_from_inputs() -> None:
    """fp32 activations stored into a bf16 cache are converted by the store kernel."""
    case = make_case(
        query_lens=[3, 1],
        context_lens=[10, 20],
        num_heads=2,
        num_kv_heads=1,
        head_dim=64,
        block_size=16,
        dtype=torch.float32,
        cache_dtype=torch.bfloat16,
        device=DEVICE,
        seed=seed_of("cachedtype"),
    )
    expected_out, expected_cache = case.expected()
    out = backend().forward(case.layer, case.q, case.k, case.v, case.kv_cache, case.meta)
    # The GPU rounds fp32 -> bf16 to nearest like torch; the interpreter's numpy conversion
    # may land one bf16 ulp away.
    ulp = 2.0**-7 if ops.interpreting() else 0.0
    for name in ("k", "v"):
        torch.testing.assert_close(
            case.kv_cache[name], expected_cache[name], rtol=ulp, atol=0, equal_nan=True
        )
    # Attention is checked over the cache the kernel stored, so that a one-ulp difference in a
    # stored key (which softmax may amplify) is judged by the cache check above alone: the
    # kernel reads the bf16 cache in fp32, as the reference does, within fp32 tolerance.
    stored_out = case.reference_output(case.kv_cache)
    torch.testing.assert_close(out[: case.valid_rows], stored_out, atol=2e-4, rtol=2e-4)
    if not ulp:
        torch.testing.assert_close(out[: case.valid_rows], expected_out, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("cache_dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
@pytest.mark.parametrize(
    ("kind", "num_splits"), [("decode", 4), ("decode", 1), ("mixed", 3), ("prefill", None)]
)
def test_fp8_cache(cache_dtype: torch.dtype, kind: str, num_splits: int | None) -> None:
    """An 8-bit float cache under bf16 activations: every path stores into it (the decode
    split launch with the store fused, the store kernel) and reads it widened. NaN marks the
    unowned cache entries as in every case (both formats have a NaN)."""
    q_lens, ctx = {
        "decode": ([1, 1, 1, 1, 1], [0, 5, 37, 90, 300]),
        "mixed": ([1, 9, 1, 20], [40, 0, 3, 13]),
        "prefill": ([12, 30], [0, 21]),
    }[kind]
    case = make_case(
        query_lens=q_lens,
        context_lens=ctx,
        num_heads=8,
        num_kv_heads=2,
        head_dim=64,
        block_size=16,
        dtype=torch.bfloat16,
        cache_dtype=cache_dtype,
        device=DEVICE,
        seed=seed_of("fp8", cache_dtype, kind, num_splits),
    )
    run_and_check(case, backend(num_splits))


@pytest.mark.parametrize("cache_dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
@pytest.mark.parametrize(
    ("kind", "num_splits"), [("decode", 3), ("decode", 1), ("mixed", 2), ("prefill", None)]
)
def test_fp8_cache_with_head_scales(
    cache_dtype: torch.dtype, kind: str, num_splits: int | None
) -> None:
    """An 8-bit float cache whose keys and values are stored divided by a scale per KV head
    (checkpoint scales): the store divides, the queries carry the key scales and the output
    the value scales, against the codec's reference; the scales are far from 1, so ignoring
    one would show. They have at most 3 significant bits, so that this step's K/V (on the
    8-bit grid times the scale) divide back exactly: the interpreter's float8 conversion
    rounds a value just below a power of two down to the power below it."""
    q_lens, ctx = {
        "decode": ([1, 1, 1], [0, 37, 90]),
        "mixed": ([1, 9, 1, 20], [40, 0, 3, 13]),
        "prefill": ([12, 30], [0, 21]),
    }[kind]
    case = make_case(
        query_lens=q_lens,
        context_lens=ctx,
        num_heads=8,
        num_kv_heads=2,
        head_dim=64,
        block_size=16,
        dtype=torch.bfloat16,
        codec=CastKVCodec(storage=cache_dtype, per_head_scales=True),
        head_scales=([3 / 64, 3.5], [5.0, 3 / 128]),
        device=DEVICE,
        seed=seed_of("fp8-scaled", cache_dtype, kind, num_splits),
    )
    run_and_check(case, backend(num_splits))


@pytest.mark.parametrize("scaled", [False, True])
@pytest.mark.parametrize(("kind", "num_splits"), [("decode", 3), ("mixed", 2), ("prefill", None)])
def test_fp8_cache_with_centred_keys(scaled: bool, kind: str, num_splits: int | None) -> None:
    """Keys stored less their head's offset (and divided by a scale): the store subtracts
    it, attention reads the centred keys as they are (every score of a query moves by the
    same q . offset), against the reference that adds it back. Large offsets, as Qwen2's key
    biases give; multiples of 1/8 in float32, so that this step's keys (on the 8-bit grid
    plus the offset) come back exactly."""
    q_lens, ctx = {
        "decode": ([1, 1, 1], [0, 37, 90]),
        "mixed": ([1, 9, 1, 20], [40, 0, 3, 13]),
        "prefill": ([12, 30], [0, 21]),
    }[kind]
    gen = torch.Generator().manual_seed(seed_of("fp8-centred", scaled, kind))
    offset = torch.randint(-160, 160, (2, 64), generator=gen).float() / 8
    case = make_case(
        query_lens=q_lens,
        context_lens=ctx,
        num_heads=8,
        num_kv_heads=2,
        head_dim=64,
        block_size=16,
        dtype=torch.float32,
        codec=CastKVCodec(storage=torch.float8_e4m3fn, per_head_scales=scaled, center_keys=True),
        head_scales=([0.5, 4.0], [2.0, 0.25]) if scaled else None,
        key_offset=offset,
        device=DEVICE,
        seed=seed_of("fp8-centred", scaled, kind, num_splits),
    )
    run_and_check(case, backend(num_splits))


@pytest.mark.parametrize(
    "cache_dtype", [torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16], ids=str
)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_scores_that_keep_growing(cache_dtype: torch.dtype, num_splits: int) -> None:
    """Keys scaled up block after block: the decode kernel's running maximum grows by more
    than the lazy rescale's threshold (8-bit caches) at many tiles, and the output must not
    depend on when the accumulator was rescaled."""
    case = make_case(
        query_lens=[1] * 4,
        context_lens=[100, 300, 31, 250],
        num_heads=8,
        num_kv_heads=2,
        head_dim=64,
        block_size=16,
        dtype=torch.bfloat16,
        cache_dtype=cache_dtype,
        device=DEVICE,
        seed=seed_of("grow", cache_dtype, num_splits),
    )
    run_and_check(grow_keys(case), backend(num_splits))


def turbo_codec(bits: int):  # noqa: ANN201
    turboquant = pytest.importorskip(
        "tallow_kvcache_turboquant.codec",
        reason="the turbo cases need tallow-kvcache-turboquant (its codecs are the oracle)",
    )
    return {8: turboquant.Turbo8KVCodec, 4: turboquant.Turbo4KVCodec, 3: turboquant.Turbo3KVCodec}[
        bits
    ]()


@pytest.mark.parametrize("bits", [8, 4, 3])
@pytest.mark.parametrize(
    ("kind", "num_splits", "head_dim"),
    [("decode", 1, 64), ("decode", 3, 128), ("mixed", 2, 80), ("prefill", None, 96)],
)
def test_turbo_cache(bits: int, kind: str, num_splits: int | None, head_dim: int) -> None:
    """A turbo cache (tallow-kvcache-turboquant): the fused store (rotation, quantization,
    packing) against the codec's encode, and attention over the codes (queries rotated, the
    output rotated back) against the reference over its decode; head sizes that are and are
    not powers of two."""
    q_lens, ctx = {
        "decode": ([1, 1, 1, 1], [0, 5, 37, 90]),
        "mixed": ([1, 9, 1, 20], [40, 0, 3, 13]),
        "prefill": ([12, 30], [0, 21]),
    }[kind]
    codec = turbo_codec(bits)
    case = make_case(
        query_lens=q_lens,
        context_lens=ctx,
        num_heads=8,
        num_kv_heads=2,
        head_dim=head_dim,
        block_size=16,
        dtype=torch.bfloat16,
        codec=codec,
        device=DEVICE,
        seed=seed_of("turbo", bits, kind, num_splits, head_dim),
    )
    run_and_check(calibrate_randomly(case, bits), backend(num_splits))


@pytest.mark.parametrize(("window", "softcap"), [(5, 4.0), (40, None)])
def test_turbo_cache_with_window_and_softcap(window: int, softcap: float | None) -> None:
    for kind, q_lens, ctx in (("decode", [1, 1], [20, 100]), ("prefill", [30, 1], [0, 45])):
        case = make_case(
            query_lens=q_lens,
            context_lens=ctx,
            num_heads=4,
            num_kv_heads=2,
            head_dim=64,
            block_size=8,
            dtype=torch.float16,
            codec=turbo_codec(4),
            device=DEVICE,
            sliding_window=window,
            logit_softcap=softcap,
            scale=0.3,
            seed=seed_of("turbo-window", window, softcap, kind),
        )
        run_and_check(calibrate_randomly(case, window), backend(2))


def test_turbo_cache_bidirectional_whole_sequences() -> None:
    """An encoder step (causal=False) over a turbo cache: every query of a sequence sees all
    of its keys' codes; one-token sequences beside them go to the decode kernel."""
    q_lens = [40, 1, 21, 1]
    case = make_case(
        query_lens=q_lens,
        context_lens=[0] * len(q_lens),
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        block_size=8,
        dtype=torch.bfloat16,
        codec=turbo_codec(4),
        device=DEVICE,
        causal=False,
        seed=seed_of("turbo-bidirectional"),
    )
    run_and_check(calibrate_randomly(case, 3), backend())


def test_turbo_cache_padding_rows_and_graph_style_padding() -> None:
    """Rows with slot -1 store nothing in a turbo cache either; a CUDA-graph padding
    sequence reads a finite slot."""
    case = make_case(
        query_lens=[1, 1, 1],
        context_lens=[40, 0, 9],
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        block_size=16,
        dtype=torch.bfloat16,
        codec=turbo_codec(3),
        device=DEVICE,
        padding_rows=3,
        seed=seed_of("turbo-pad"),
    )
    run_and_check(calibrate_randomly(case, 1), backend())
    case = make_case(
        query_lens=[1, 1],
        context_lens=[25, 1],
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        block_size=16,
        dtype=torch.bfloat16,
        codec=turbo_codec(4),
        device=DEVICE,
        host_copies=False,
        seed=seed_of("turbo-graphpad"),
    )
    case.meta.slot_mapping[1] = -1
    case.meta.seq_lens[1] = 1
    case.meta.max_seq_len = 4096
    run_and_check(calibrate_randomly(case, 2), backend())


def test_random_batches() -> None:
    """A few random batches: lengths, groups, dtypes, windows drawn afresh."""
    rng = random.Random(seed_of("random"))
    for i in range(4):
        n = rng.randint(1, 5)
        decode = rng.random() < 0.5
        q_lens = [1] * n if decode else [rng.choice([1, rng.randint(1, 40)]) for _ in range(n)]
        ctx = [rng.randint(0, 120) for _ in range(n)]
        group = rng.choice([1, 2, 4])
        case = make_case(
            query_lens=q_lens,
            context_lens=ctx,
            num_heads=2 * group,
            num_kv_heads=2,
            head_dim=rng.choice([64, 80]),
            block_size=rng.choice([4, 16]),
            dtype=rng.choice([torch.bfloat16, torch.float16]),
            device=DEVICE,
            sliding_window=rng.choice([None, rng.randint(1, 50)]),
            padding_rows=rng.randint(0, 2),
            seed=rng.randrange(2**31),
        )
        run_and_check(case, backend(rng.choice([None, 1, 2, 5])))


def _sinks(num_heads: int, seed: int) -> torch.Tensor:
    """Attention sinks around the scores' scale: some heads keep most of their weight, some
    give most of it to the sink."""
    return torch.randn(num_heads, generator=torch.Generator().manual_seed(seed)) * 2.0


@pytest.mark.parametrize(("window", "num_splits"), [(None, 1), (None, 3), (6, 1), (6, 4)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_attention_sinks(window: int | None, num_splits: int, dtype: torch.dtype) -> None:
    """gpt-oss's attention sinks (a logit per query head in every denominator): prefills,
    chunks beside decodes, and decode-only steps with one split (the split kernel adds the
    sink) and several (the reduce kernel does), with and without a sliding window."""
    seed = seed_of("sinks", window, num_splits, dtype)
    for kind, q_lens, ctx in (
        ("prefill", [19, 1, 7], [0, 30, 12]),
        ("decode", [1, 1, 1, 1], [0, 5, 33, 70]),
    ):
        case = make_case(
            query_lens=q_lens,
            context_lens=ctx,
            num_heads=8,
            num_kv_heads=2,
            head_dim=64,
            block_size=8,
            dtype=dtype,
            device=DEVICE,
            sliding_window=window,
            sinks=_sinks(8, seed),
            seed=seed,
        )
        run_and_check(case, backend(num_splits))


@pytest.mark.parametrize("num_splits", [1, 3])
def test_attention_sinks_over_a_turbo_cache(num_splits: int) -> None:
    """The sinks over a 4-bit turbo cache: its own decode kernel, and the prefill kernel's
    code path."""
    seed = seed_of("sinks-turbo", num_splits)
    for q_lens, ctx in (([1, 1, 1], [0, 9, 40]), ([12, 1], [5, 20])):
        case = make_case(
            query_lens=q_lens,
            context_lens=ctx,
            num_heads=4,
            num_kv_heads=2,
            head_dim=64,
            block_size=8,
            dtype=torch.float16,
            codec=turbo_codec(4),
            device=DEVICE,
            sinks=_sinks(4, seed),
            seed=seed,
        )
        run_and_check(case, backend(num_splits))
