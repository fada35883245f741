"""What a step of the engine core returns: each completion's new token, the step's prompt-side
results, finished requests, and where the step's wall time went.

:class:`CoreOutput` is what :meth:`tallow.engine.core.EngineCore.step` returns and what the
output processor, the engines and the benchmarks read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .outputs import Logprob
from .step_result import SampledToken

#: the phases of CoreOutput.timings that are host work the device may wait for
_HOST_PHASES = ("schedule", "launch", "mask", "post")


@dataclass
class TokenUpdate:
    """One new token of one completion."""

    request_id: str
    index: int
    token: SampledToken
    finish_reason: str | None = None  # "stop" | "length"
    stop_reason: int | None = None  # the stop token id, when one ended it


@dataclass
class CoreOutput:
    updates: list[TokenUpdate] = field(default_factory=list)
    prompt_logprobs: dict[str, list[dict[int, Logprob] | None]] = field(default_factory=dict)
    num_cached_tokens: dict[str, int] = field(default_factory=dict)
    #: request ids whose every completion has finished this step
    finished: list[str] = field(default_factory=list)
    #: embedding requests finished this step: request id → pooled vector (float32, host)
    pooled: dict[str, torch.Tensor] = field(default_factory=dict)
    # step_time, timings and hidden are recorded while the engine's tracer is on
    # (EngineCore.trace_steps); off, the default, they stay empty.
    step_time: float = 0.0  # wall time of the step call
    #: where the step's wall time went: scheduling, building and queueing the batch on the
    #: device, the caller's overlapped work, waiting for the device, bookkeeping afterwards,
    #: and (structured outputs) starting the grammars' token masks on the grammar thread, or
    #: sampling a step whose masks no later launch waited for (a launch that samples the step
    #: before it counts its wait for the masks in "launch").
    #: In async mode schedule/launch are those of the step launched by this call and
    #: wait/post those of the step whose tokens it returns.
    timings: dict[str, float] = field(default_factory=dict)
    #: the host phases (schedule, launch, mask, post) that ran while the device was still busy with
    #: an earlier step from start to end, so the device did not wait for them (async mode)
    hidden: set[str] = field(default_factory=set)
    #: every step this call ran on the device (the one whose tokens it returns and, in async
    #: mode, the one it launched) computed decode rows only, no prompt: its wall time is a
    #: decode step's (benchmarks count decode throughput over such steps)
    decode_only: bool = False

    @property
    def host_time(self) -> float:
        """Host time the device may have waited for: schedule, launch, mask and post, except
        the phases hidden behind device work (the wait itself and the overlapped work never
        count)."""
        t = self.timings
        return sum(t.get(phase, 0.0) for phase in _HOST_PHASES if phase not in self.hidden)
