"""Warming an engine core up: the kinds of step serving runs, on throw-away requests.

Triton compiles a kernel the first time it meets a new shape or specialization; warming up runs
a prompt-only step, a prompt beside decoding sequences and decode-only steps (for an embedding
engine, pooling steps of a few lengths) before the first real request, so that the compiling
happens at start-up rather than inside a request. Nothing is left behind: the requests finish,
their blocks are freed, and the prefix cache and the counters are reset.

The engine is read through :class:`WarmableCore` (the core satisfies it), so this module does
not import the core's (which imports it).
"""

from __future__ import annotations

from typing import Protocol

from .embedding import PoolingParams
from .model_runner import ModelRunner
from .sampling.params import SamplingParams
from .scheduler import Scheduler
from .speculation import SpecDecoding


class WarmableCore(Protocol):
    """What warming up uses of an engine core (:class:`tallow.engine.core.EngineCore`)."""

    task: str
    scheduler: Scheduler
    runner: ModelRunner
    spec: SpecDecoding | None
    max_model_len: int
    steps: int
    overlapped_steps: int

    def has_unfinished(self) -> bool: ...

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams | PoolingParams,
    ) -> None: ...

    def step(self) -> object: ...


def warm_up_engine(core: WarmableCore, prompt_len: int = 40) -> None:
    """Run prompt-only, mixed and decode-only steps (pooling steps for an embedding engine) on
    ``core``, an idle engine, then reset what they left: the prefix cache and the counters."""
    if core.has_unfinished():
        raise RuntimeError("warm_up() needs an idle engine")
    if core.task == "embed":
        _warm_up_embedding(core, prompt_len)
        return
    vocab = max(2, core.runner.vocab_size)
    params = SamplingParams(max_tokens=4, ignore_eos=True, temperature=0.0)
    lengths = [
        min(prompt_len, core.max_model_len - 4),
        min(prompt_len // 2 + 3, core.max_model_len - 4),
    ]
    for i, n in enumerate(lengths):
        prompt = [(7 * j + i) % vocab for j in range(max(1, n))]
        core.add_request(f"tallow-warm-up-{i}", prompt, params)
        core.step()  # the first: a prompt-only step; the second: beside a decode
    while core.has_unfinished():
        core.step()
    bm = core.scheduler.block_manager
    bm.reset_prefix_cache()
    bm.reset_stats()
    if core.spec is not None:
        core.spec.reset_stats()
    core.scheduler.num_preemptions = 0
    core.steps = core.overlapped_steps = 0


def _warm_up_embedding(core: WarmableCore, prompt_len: int) -> None:
    """Embedding steps of a few lengths (one-token inputs take the decode kernels)."""
    vocab = max(2, core.runner.vocab_size)
    longest = min(prompt_len, core.max_model_len, core.scheduler.max_num_batched_tokens)
    for i, n in enumerate(sorted({longest, max(1, longest // 2 + 3), 1})):
        prompt = [(7 * j + i) % vocab for j in range(n)]
        core.add_request(f"tallow-warm-up-{i}", prompt, PoolingParams())
    while core.has_unfinished():
        core.step()
    core.scheduler.block_manager.reset_stats()
    core.scheduler.num_preemptions = 0
    core.steps = core.overlapped_steps = 0
