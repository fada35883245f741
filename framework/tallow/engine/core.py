"""The engine core: scheduler + model runner, one step at a time, token-level stops.

It is single-threaded by design: the thread that calls :meth:`EngineCore.step` owns the model
and the KV cache. Everything that touches text (detokenization, stop strings) happens outside,
in :mod:`tallow.engine.output_processor`, so the device never waits for Python string work.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .model_runner import ModelRunner, SampledToken
from .outputs import Logprob
from .sampling_params import SamplingParams
from .scheduler import Scheduler
from .sequence import SequenceStatus

log = logging.getLogger("tallow.engine")


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
    step_time: float = 0.0  # wall time of the step
    #: where the step's wall time went: scheduling, building and queueing the batch on the
    #: device, the caller's overlapped work, waiting for the device, bookkeeping afterwards
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def host_time(self) -> float:
        """Host time the device may have waited for (everything but the wait itself and the
        overlapped work, which runs while the device computes)."""
        t = self.timings
        return t.get("schedule", 0.0) + t.get("launch", 0.0) + t.get("post", 0.0)


class EngineCore:
    def __init__(self, scheduler: Scheduler, runner: ModelRunner, *, eos_token_ids: set[int],
                 max_model_len: int) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self.eos_token_ids = set(eos_token_ids)
        self.max_model_len = max_model_len
        self.steps = 0

    # -- requests -----------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    *, arrival_time: float | None = None, priority: int = 0) -> None:
        """Admit a request (raises AdmissionError / QueueFullError when it cannot be)."""
        # A private copy: the caller may reuse or change its object, while the engine relies
        # on a request's params never changing (the sampler caches what it derives from them).
        params = params.clone()
        if params.max_tokens is None:
            params.max_tokens = max(1, self.max_model_len - len(prompt_token_ids))
        self.scheduler.add_request(request_id, prompt_token_ids, params,
                                   arrival_time=arrival_time, priority=priority)

    def abort(self, request_id: str) -> None:
        self.scheduler.abort(request_id)

    def finish_sequence(self, request_id: str, index: int, status: SequenceStatus) -> bool:
        """End one completion early (a stop string was seen). True if the request is done."""
        request = self.scheduler.get_request(request_id)
        if request is None:
            return True
        for seq in request.seqs:
            if seq.index == index and not seq.status.is_finished:
                self.scheduler.finish(seq, status)
        return all(s.status.is_finished for s in request.seqs)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- the step -----------------------------------------------------------------------
    def step(self, between: Callable[[], None] | None = None) -> CoreOutput:
        """Schedule and run one step.

        ``between`` is called after the step is queued on the device and before waiting for
        it: host work done there (turning the previous step's tokens into text, say) hides
        behind the device's work.
        """
        started = time.perf_counter()
        out = CoreOutput()
        plan = self.scheduler.schedule()
        if not plan.scheduled:
            self.scheduler.update(plan, {})
            if between is not None:
                between()
            return out
        t0 = time.perf_counter()
        pending = self.runner.launch(plan)
        t1 = time.perf_counter()
        if between is not None:
            between()
        t2 = time.perf_counter()
        result = self.runner.collect(pending)
        t3 = time.perf_counter()
        for seq_id, lps in result.prompt_logprobs.items():
            for item in plan.scheduled:
                if item.seq.seq_id == seq_id:
                    out.prompt_logprobs.setdefault(item.seq.request_id, []).extend(lps)
        for item in plan.scheduled:
            if item.start == item.seq.num_cached_tokens:  # its first chunk after admission
                out.num_cached_tokens[item.seq.request_id] = item.seq.num_cached_tokens
        sampled_ids = {sid: tok.token_id for sid, tok in result.sampled.items()}
        touched_requests: set[str] = set()
        for seq in self.scheduler.update(plan, sampled_ids):
            token = result.sampled[seq.seq_id]
            update = TokenUpdate(seq.request_id, seq.index, token)
            status = self._check_stop(seq, token.token_id, update)
            if status is not None:
                self.scheduler.finish(seq, status)
                touched_requests.add(seq.request_id)
            out.updates.append(update)
        for request_id in touched_requests:
            request = self.scheduler.get_request(request_id)
            if request is None or all(s.status.is_finished for s in request.seqs):
                out.finished.append(request_id)
        self.steps += 1
        end = time.perf_counter()
        out.step_time = end - started
        out.timings = {"schedule": t0 - started, "launch": t1 - t0, "overlapped": t2 - t1,
                       "wait": t3 - t2, "post": end - t3}
        return out

    def _check_stop(self, seq: Any, token: int, update: TokenUpdate) -> SequenceStatus | None:
        params = seq.params
        n_out = seq.num_output_tokens
        if n_out >= params.min_tokens:
            if not params.ignore_eos and token in self.eos_token_ids:
                update.finish_reason = "stop"
                return SequenceStatus.FINISHED_STOPPED
            if token in params.stop_token_ids:
                update.finish_reason, update.stop_reason = "stop", token
                return SequenceStatus.FINISHED_STOPPED
        if n_out >= params.max_tokens or seq.num_tokens >= self.max_model_len:
            update.finish_reason = "length"
            return SequenceStatus.FINISHED_LENGTH
        return None

    def stats(self) -> dict[str, Any]:
        s = self.scheduler
        bm = s.block_manager
        return {
            "num_waiting": s.num_waiting, "num_running": s.num_running,
            "kv_usage": bm.usage, "num_free_blocks": bm.num_free_blocks,
            "num_total_blocks": bm.num_total_blocks,
            "prefix_cache_hit_rate": bm.hit_rate, "steps": self.steps,
        }
