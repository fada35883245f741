"""Sliding-window cache groups: blocks outside the window go back to the pool while a sequence
runs, and the tokens do not change.

The model side runs a Mistral-shaped ``random:`` model (every layer a 24-token window) through
the engine on CPU, once as built and once with the freeing turned off (the code path that
keeps every block): the greedy tokens must be identical, and the sliding group must hold no
more than the window and one block per sequence after each committed step. The bookkeeping
side runs a Gemma-3-shaped layout (a full group and a 512-token window group) through the
scheduler for one 32k-token sequence, without a model.
"""

from __future__ import annotations

import pytest

from tallow import LLM, SamplingParams
from tallow.engine.kv_manager import KVCacheManager, PagedGroupSize
from tallow import SamplingParams as EngineParams
from tallow.engine.scheduler import Scheduler
from tallow.engine.sequence import Sequence

WINDOW = 24  # tiny-mistral's sliding window
BLOCK = 4


def _mistral(**settings) -> LLM:
    return LLM(
        model="random:tiny-mistral",
        dtype="float32",
        device="cpu",
        num_blocks=128,
        block_size=BLOCK,
        max_model_len=512,
        **settings,
    )


def _watch_live_blocks(llm: LLM) -> list[int]:
    """Record, after every committed step, the blocks a sequence holds for its committed
    tokens in the first paged group (the only one of tiny-mistral: every layer slides). With
    async scheduling the table already holds the blocks of the step planned after it too."""
    manager = llm.engine.core.scheduler.block_manager
    assert isinstance(manager, KVCacheManager)
    null = manager.groups[0].null_block
    seen: list[int] = []
    mark = manager.mark_computed

    def mark_and_count(seq, upto=None):
        mark(seq, upto)
        committed = seq.block_ids[: -(-upto // BLOCK)]
        seen.append(sum(1 for b in committed if b != null))

    manager.mark_computed = mark_and_count  # type: ignore[method-assign]
    return seen


def _keep_every_block(llm: LLM) -> None:
    for group in llm.engine.core.scheduler.block_manager.groups:
        group.release_outside_window = lambda seq, committed: 0  # type: ignore[method-assign]


PROMPTS = [
    [(7 * i + 3) % 500 + 1 for i in range(70)],
    [(11 * i) % 400 + 2 for i in range(45)],
    [5, 9, 13],
]


@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
def test_mistral_window_frees_blocks_and_keeps_tokens(async_scheduling):
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    freeing = _mistral(
        async_scheduling=async_scheduling, prefill_chunk_size=16, max_num_batched_tokens=32
    )
    manager = freeing.engine.core.scheduler.block_manager
    group = manager.groups[0]
    assert group.window == WINDOW and group.null_block == group.num_total_blocks
    live = _watch_live_blocks(freeing)
    got = [o.outputs[0].token_ids for o in freeing.generate(PROMPTS, params)]

    keeping = _mistral(
        async_scheduling=async_scheduling, prefill_chunk_size=16, max_num_batched_tokens=32
    )
    _keep_every_block(keeping)
    kept = _watch_live_blocks(keeping)
    expected = [o.outputs[0].token_ids for o in keeping.generate(PROMPTS, params)]

    assert got == expected
    assert max(live) <= WINDOW // BLOCK + 1  # the window and one block
    assert max(kept) == -(-(len(PROMPTS[0]) + 40) // BLOCK)  # every block, without freeing
    assert manager.num_free_blocks == manager.num_total_blocks
    manager.check_invariants()


def test_mistral_prefix_hit_keeps_the_window_before_it():
    """A second run of a long prompt starts from the prefix cache: its hit holds the blocks
    inside the window before the hit point (earlier entries name the null block) and the
    tokens equal the first run's."""
    llm = _mistral(enable_prefix_caching=True)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    prompt = PROMPTS[0]
    first = llm.generate(prompt, params)[0]
    second = llm.generate(prompt, params)[0]
    assert second.outputs[0].token_ids == first.outputs[0].token_ids
    manager = llm.engine.core.scheduler.block_manager
    assert second.num_cached_tokens > WINDOW  # the hit reaches past the first window
    assert manager.hit_rate > 0
    manager.check_invariants()


def test_gemma3_shaped_32k_sequence_holds_the_window_and_one_block():
    """A 32k-token sequence of a Gemma 3 layout (5 local layers of a 512-token window per
    global one) through the scheduler: its local group never holds more than the window and
    one block after a committed step, while the global group holds the whole sequence."""
    block, window, chunk, length = 16, 512, 2048, 32768
    manager = KVCacheManager(
        [PagedGroupSize(2200), PagedGroupSize(200, window)],
        block_size=block,
        enable_prefix_caching=True,
        max_step_tokens=chunk,
    )
    scheduler = Scheduler(
        manager,
        max_num_seqs=4,
        max_num_batched_tokens=chunk,
        prefill_chunk_size=chunk,
        max_model_len=length + 64,
    )
    params = EngineParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    scheduler.add_request("long", [(i * 31) % 1000 for i in range(length)], params)
    seq = scheduler.requests["long"].seqs[0]
    local_after_commit, local_in_step = [], []
    steps = 0
    while scheduler.has_unfinished():
        out = scheduler.schedule()
        local_in_step.append(manager.live_blocks(seq, 1))
        sampled = {s.seq_id: 7 for item in out.scheduled for s in item.sample_seqs}
        for s in scheduler.update(out, sampled):
            if s.num_output_tokens >= params.max_tokens:
                scheduler.finish(s, s.status.FINISHED_LENGTH)
        if not seq.status.is_finished:
            local_after_commit.append(manager.live_blocks(seq, 1))
            assert manager.live_blocks(seq, 0) == -(-seq.num_computed_tokens // block)
        manager.check_invariants()
        steps += 1
    assert max(local_after_commit) <= window // block + 1
    # a decode step adds at most the block its token lands in; a prefill chunk its own
    assert max(local_in_step[length // chunk :]) <= window // block + 1
    assert max(local_in_step) <= (window + chunk) // block + 1
    assert manager.num_free_blocks == manager.num_total_blocks
    assert manager.groups[1].num_free_blocks == manager.groups[1].num_total_blocks


def test_uncomputed_prefix_registers_only_the_window_in_a_sliding_group():
    """The benchmarks' synthetic context: a sliding group registers the blocks inside the
    window before the prefix's end only, so a long context fits its small pool, and a
    sequence with that prompt then hits the whole prefix."""
    manager = KVCacheManager(
        [PagedGroupSize(300), PagedGroupSize(12, 16)],
        block_size=4,
        enable_prefix_caching=True,
        max_step_tokens=8,
    )
    prompt = [(i * 7) % 50 for i in range(1001)]
    assert manager.register_uncomputed_prefix(prompt) == 250
    assert manager.groups[1].num_cached_blocks == 4  # window 16 = the last 4 blocks
    seq = Sequence("r", 0, prompt, EngineParams(max_tokens=1))
    hits = manager.get_prefix_hits(seq)
    assert len(hits) == 250
    assert manager.allocate_prefix(seq, hits) == 1000
    assert manager.live_blocks(seq, 1) == 4
    manager.check_invariants()


@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
def test_mistral_window_under_preemption(async_scheduling):
    """A sliding pool of 14 blocks for three long sequences: they preempt one another (and are
    recomputed), and the tokens equal those of a roomy engine that keeps every block."""
    params = SamplingParams(temperature=0.0, max_tokens=30)
    tight = LLM(
        model="random:tiny-mistral",
        dtype="float32",
        device="cpu",
        num_blocks=14,
        block_size=BLOCK,
        max_model_len=512,
        prefill_chunk_size=8,
        max_num_batched_tokens=16,
        async_scheduling=async_scheduling,
    )
    got = [o.outputs[0].token_ids for o in tight.generate(PROMPTS, params)]
    roomy = _mistral(async_scheduling=async_scheduling)
    _keep_every_block(roomy)
    expected = [o.outputs[0].token_ids for o in roomy.generate(PROMPTS, params)]
    assert got == expected
    scheduler = tight.engine.core.scheduler
    assert scheduler.num_preemptions > 0
    manager = scheduler.block_manager
    assert manager.groups[0].num_total_blocks == 14
    assert manager.num_free_blocks == manager.num_total_blocks
    manager.check_invariants()


def test_tiny_mistral_starts_at_the_gpu_tests_max_model_len() -> None:
    """tests/gpu/test_sliding_window_gpu.py builds tiny-mistral with max_model_len 2048, the
    positions its rotary embedding covers (max_position_embeddings 2048): that starts, the
    4096 it once asked for is refused at start-up."""
    settings = dict(model="random:tiny-mistral", dtype="float32", device="cpu", num_blocks=1024)
    with pytest.raises(ValueError, match=r"max_model_len 4096 is longer than the 2048 positions"):
        LLM(**settings, max_model_len=4096)
    assert LLM(**settings, max_model_len=2048).engine.core.scheduler is not None
