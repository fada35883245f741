"""A finished sequence is not kept by the KV-cache manager: with one paged group (most models)
the manager hands its per-sequence calls straight to the block manager, and the sequences it
had recorded at prefix allocation were never dropped, so every request's token lists stayed
in memory for the life of the engine (the soak test's resident memory grew about 15 KB a
request)."""

from __future__ import annotations

import gc

from tallow import LLM, SamplingParams
from tallow.engine.sequence import Sequence


def test_finished_sequences_are_not_kept() -> None:
    llm = LLM(model="random:tiny-llama", device="cpu", dtype="float32", max_model_len=128)
    manager = llm.engine.core.scheduler.block_manager
    llm.generate(
        [f"<{i}> <{i + 1}>" for i in range(12)], SamplingParams(max_tokens=4, ignore_eos=True)
    )
    assert not getattr(manager, "_owners", {})
    assert not manager.primary._owners
    gc.collect()
    assert not [o for o in gc.get_objects() if isinstance(o, Sequence)]
