"""``EngineCore.warm_up``: the step kinds of serving run on throw-away requests (a GPU engine
does it at start-up, so Triton compiles before the first request) and leave no trace."""

from __future__ import annotations

import pytest

from tallow import LLM, SamplingParams

BASE = dict(dtype="float32", device="cpu", num_blocks=256, block_size=4)
PROMPTS = ["The quick brown fox", "def add(a, b):", "Paged attention stores keys"]


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_warm_up_leaves_a_fresh_engine(tiny_llama, async_scheduling):
    params = SamplingParams(max_tokens=6, temperature=0.0)
    fresh = LLM(model=str(tiny_llama), **BASE, async_scheduling=async_scheduling)
    expected = [o.outputs[0].token_ids for o in fresh.generate(PROMPTS, params)]

    llm = LLM(model=str(tiny_llama), **BASE, async_scheduling=async_scheduling)
    core = llm.engine.core
    calls = []
    launch = core.runner.launch

    def spy(plan, **kw):
        calls.append(sorted(item.num_tokens > 1 for item in plan.scheduled))
        return launch(plan, **kw)

    core.runner.launch = spy
    core.warm_up(prompt_len=13)
    core.runner.launch = launch
    # a prompt-only step, a step with a prompt beside a decoding sequence, decode-only steps
    assert [True] in calls and [False, True] in calls and [False, False] in calls
    stats = core.stats()
    bm = core.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_total_blocks and bm.num_cached_blocks == 0
    assert stats["steps"] == 0 and stats["num_preemptions"] == 0
    assert stats["prefix_cache_hit_rate"] == 0.0 and not core.has_unfinished()
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)] == expected


def test_warm_up_refuses_a_busy_engine(tiny_llama):
    llm = LLM(model=str(tiny_llama), **BASE)
    llm.engine.add_request("busy", "hello", SamplingParams(max_tokens=3))
    with pytest.raises(RuntimeError, match="idle engine"):
        llm.engine.core.warm_up()


def test_freeze_startup_heap_freezes_and_raises_the_young_threshold() -> None:
    """Run in a child process: freezing is process-wide and permanent."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import gc
        from tallow.engine.builder import SERVING_GC_THRESHOLD, freeze_startup_heap
        gc.set_threshold(700, 10, 10)
        before = gc.get_freeze_count()
        freeze_startup_heap()
        print(before, gc.get_freeze_count(), *gc.get_threshold(), SERVING_GC_THRESHOLD)
    """)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    before, after, gen0, gen1, gen2, wanted = map(int, out)
    assert before == 0 and after > 1000  # the start-up heap is out of the collector's reach
    assert gen0 == wanted >= 10_000  # young collections are rarer than the default's
    assert (gen1, gen2) == (10, 10)  # older generations keep their thresholds
