"""A model with a recurrent-state layer through the real engine core on CPU (the runner, the
cache manager's state slots, the scheduler): greedy tokens equal a full recompute of the same
model without any cache, whatever the chunking, batching, preemptions and aborts; state slots
are balanced at the end; prefix caching is refused with a logged reason."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from tallow import SamplingParams
from tallow.layers import RecurrentStateSpec

sys.path.insert(0, str(Path(__file__).parent))
from state_model import StateModel, build_core, run_to_end  # noqa: E402

PROMPTS = {
    "a": [3, 17, 5, 9, 33, 2, 8, 41, 7, 7, 12],
    "b": [60, 1],
    "c": [25],
    "d": [(5 * i + 1) % 64 for i in range(23)],
}
STEPS = 12


@pytest.fixture(scope="module")
def model() -> StateModel:
    return StateModel(seed=1)


@pytest.fixture(scope="module")
def expected(model) -> dict[str, list[int]]:
    return {rid: model.reference_greedy(prompt, STEPS) for rid, prompt in PROMPTS.items()}


def greedy(n: int = 1) -> SamplingParams:
    # the engine core here has no EOS token; without ignore_eos no blocks are reserved, so
    # sequences do preempt one another when blocks run out
    return SamplingParams(temperature=0.0, max_tokens=STEPS, n=n)


def assert_all_free(core) -> None:
    manager = core.scheduler.block_manager
    manager.check_invariants()
    assert manager.num_free_blocks == manager.num_total_blocks
    assert manager.num_free_state_slots() == manager.states[0].num_slots


def test_the_model_declares_one_state_group(model):
    core = build_core(StateModel(seed=1))
    runner = core.runner
    assert len(runner.state_groups) == 1 and len(runner.paged_groups) == 1
    assert isinstance(runner.state_groups[0].spec, RecurrentStateSpec)
    cache = runner.caches.states[0][0]
    assert cache["h"].shape == (runner.max_num_seqs + 1, 32)  # the slots and the dummy


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("chunk", [None, 4], ids=["whole-prompts", "chunks-of-4"])
def test_greedy_equals_full_recompute(model, expected, async_scheduling, chunk):
    core = build_core(
        model,
        prefill_chunk_size=chunk,
        async_scheduling=async_scheduling,
        max_num_batched_tokens=16,
    )
    got = run_to_end(core, {rid: (p, greedy()) for rid, p in PROMPTS.items()})
    assert {rid: out[0] for rid, out in got.items()} == expected
    assert_all_free(core)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_preemption_recomputes_the_state(model, expected, async_scheduling):
    """Few KV blocks: sequences are preempted and recomputed from their first token (their
    slot zeroed when it is taken again); the tokens do not change."""
    core = build_core(
        model,
        num_blocks=12,
        async_scheduling=async_scheduling,
        prefill_chunk_size=4,
        max_num_batched_tokens=8,
        max_model_len=40,
    )
    got = run_to_end(core, {rid: (p, greedy()) for rid, p in PROMPTS.items()})
    assert core.scheduler.num_preemptions > 0
    assert {rid: out[0] for rid, out in got.items()} == expected
    assert_all_free(core)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_abort_gives_the_slot_back(model, expected, async_scheduling):
    core = build_core(model, async_scheduling=async_scheduling, max_num_seqs=2)
    got = run_to_end(
        core, {rid: (p, greedy()) for rid, p in PROMPTS.items()}, abort_after={"a": 3, "d": 1}
    )
    for rid in ("b", "c"):
        assert got[rid][0] == expected[rid]
    assert got["a"][0] == expected["a"][: len(got["a"][0])]
    assert len(got["a"][0]) < STEPS
    assert_all_free(core)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_forked_completions_copy_the_parent_state(model, expected, async_scheduling):
    """n = 2: the second completion is forked at the end of the prompt and takes a slot
    holding a copy of the first one's state (greedy: both equal the reference)."""
    core = build_core(model, async_scheduling=async_scheduling, prefill_chunk_size=4)
    got = run_to_end(core, {"a": (PROMPTS["a"], greedy(n=2))})
    assert got["a"] == [expected["a"], expected["a"]]
    assert_all_free(core)


def test_prefix_caching_is_refused_with_a_reason(model, caplog):
    with caplog.at_level(logging.WARNING, logger="tallow.engine"):
        core = build_core(model, enable_prefix_caching=True)
    assert not core.scheduler.block_manager.enable_prefix_caching
    assert "prefix caching is off" in caplog.text and "recurrent state" in caplog.text
    got = run_to_end(core, {"a": (PROMPTS["a"], greedy()), "a2": (PROMPTS["a"], greedy())})
    assert got["a"][0] == got["a2"][0]
    assert_all_free(core)
