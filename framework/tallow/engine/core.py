"""The engine core: scheduler + model runner, one step at a time, token-level stops.

It is single-threaded by design: the thread that calls :meth:`EngineCore.step` owns the model
and the KV cache. Everything that touches text (detokenization, stop strings) happens outside,
in :mod:`tallow.engine.output_processor`, so the device never waits for Python string work.

The step's verbs
----------------
A step reads as five verbs, each a method: **schedule** (the scheduler picks the tokens each
sequence computes), **launch** (the runner builds the batch on the host, copies it to the device
and queues the forward and the sampling), **overlap** (the caller's ``between`` work, e.g.
detokenizing earlier tokens, while the device computes), **collect** (wait for the device and
read the sampled token ids back) and **commit** (tokens appended, grammars advanced, stop
conditions checked, finished sequences freed). Steps with grammar-constrained rows add the
grammar masks: filling them on the grammar thread and sampling under them.

*Sync mode* runs them in that order for one step per call (:meth:`EngineCore._step_sync`); the
device is idle while the host schedules, launches and commits.

*Async mode* (``scheduler.async_scheduling``) plans step N+1 while the device runs step N, the
same verbs in another order; one method, :meth:`EngineCore._step_overlapped`, holds every
decision about running two steps at once::

    one call:   schedule N+1 | launch N+1 | overlap | collect N | commit N  → N's tokens
    the device: ....... step N ..........| step N+1 .........................

(When N+1's sampling waits for grammar masks, N is collected and committed before the
overlap, so that the masks of N+1 are filled on the grammar thread while ``between`` runs; see
:mod:`tallow.engine.sampling.grammar`.)

When N+1 is planned, N's tokens are still on the device. The scheduler has applied N already
(``Scheduler.advance``): computed counts moved on and every sampled sequence got a placeholder
token, so N+1 is planned as if the token were known. The runner builds N+1 with placeholder ids
and, on the device, copies the real ids into those rows from N's tensor of sampled tokens before
the forward. When N is read back, the placeholders are filled (``Scheduler.commit``) and stops
are checked. A sequence that stops at N may already be part of N+1: finishing it frees its
blocks (the slot taken for N+1 included) and drops its placeholder, and its N+1 token is
discarded when N+1 is committed. A call therefore returns the tokens of the step *before* the
one it launched, and :meth:`EngineCore.has_unfinished` stays true while a step is in flight.

Some steps are not overlapped: when a step samples a row whose next sampling needs the host to
know its tokens' values (repetition/frequency/presence penalties), asks for logprobs or prompt
logprobs, or forks ``n > 1`` completions, the next call collects it *before* planning the next
step (see :func:`_must_collect_first`). Plain greedy and seeded temperature/top-k/top-p/min-p
rows (with logit bias or min_tokens too: those depend on token counts, not values) overlap.

Timing
------
Each verb runs inside a phase of the engine's tracer (:mod:`tallow.engine.step_tracer`):
``schedule``, ``launch``, ``overlapped``, ``wait`` (collect), ``post`` (commit) and ``mask``.
The tracer is off by default and then records nothing; :meth:`EngineCore.trace_steps` turns it
on for those who read :attr:`CoreOutput.timings` (``tallow bench``, the server's metrics).

Embeddings
----------
An engine built for ``task == "embed"`` takes :class:`~tallow.engine.embedding.PoolingParams`
requests only (and one built to generate, SamplingParams only). Each is computed whole in one
step, many in a step; the step pools their hidden states on the device (the runner's
``pooler``), and when the step is read back each request finishes with its vector in
:attr:`CoreOutput.pooled` and its KV blocks are freed. Nothing is sampled; steps overlap in
async mode as plain greedy ones do.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable


from tallow.plugin import GrammarError, GrammarSpec

from .embedding import PoolingParams
from .errors import AdmissionError, InvalidParameter
from .model_runner import ModelRunner
from .step_result import PendingStep, StepResult
from .multimodal import MultimodalPrompt
from .core_output import CoreOutput, TokenUpdate
from .sampling.grammar import GrammarState, StructuredOutputs
from .sampling.params import SamplingParams
from .scheduler import AppliedStep, Scheduler, SchedulerOutput
from .sequence import Sequence, SequenceStatus
from .speculation import SpecDecoding
from .step_tracer import NO_TRACER, StepTracer
from .warm_up import warm_up_engine

log = logging.getLogger("tallow.engine")

#: what the scheduler reads of an embedding request's params: one sequence, nothing sampled
_POOLING_SEQUENCE = SamplingParams(max_tokens=1)
TASKS = ("generate", "embed")


@dataclass
class _InFlight:
    """A step queued on the device whose tokens have not been read back yet."""

    plan: SchedulerOutput
    pending: PendingStep
    applied: AppliedStep
    #: collect it before planning the next step (see _must_collect_first)
    collect_first: bool


def _nothing() -> None:
    pass


def _decode_only(step: "_InFlight | None") -> bool:
    """Whether ``step`` (None: nothing was launched) computes decode rows only."""
    return step is None or all(item.is_decode for item in step.plan.scheduled)


def _waits_for_grammars(step: "_InFlight | None") -> bool:
    """Whether ``step`` was launched with its logits kept for grammar masks (its sampling
    waits for them)."""
    return step is not None and step.pending.logits is not None


def _must_collect_first(plan: SchedulerOutput) -> bool:
    """Whether the step after ``plan`` must wait until ``plan``'s tokens are read back."""
    for item in plan.scheduled:
        sample = item.sample_seqs
        if item.prompt_logprobs or len(sample) > 1:  # len > 1: n > 1 forks here
            return True
        # penalties read earlier tokens' values; logprobs come back with the tokens
        if sample and sample[0].params.reads_token_values:
            return True
    return False


class EngineCore:
    def __init__(
        self,
        scheduler: Scheduler,
        runner: ModelRunner,
        *,
        eos_token_ids: set[int],
        max_model_len: int,
        async_scheduling: bool = False,
        task: str = "generate",
        structured: StructuredOutputs | None = None,
        spec: SpecDecoding | None = None,
    ) -> None:
        if task not in TASKS:
            raise ValueError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
        self.task = task
        self.scheduler = scheduler
        self.runner = runner
        self.eos_token_ids = set(eos_token_ids)
        self.max_model_len = max_model_len
        self.async_scheduling = bool(async_scheduling)
        self.steps = 0
        #: steps planned and launched while the previous one was still in flight (async mode)
        self.overlapped_steps = 0
        self._in_flight: _InFlight | None = None  # async mode: the step the device runs
        #: grammars of structured outputs, None for an engine that cannot constrain outputs
        self.structured = structured
        #: times the phases of each step; records nothing unless trace_steps() turned it on
        self.tracer: StepTracer = NO_TRACER
        #: speculative decoding (None: off). A proposal needs the tokens of the step before on
        #: the host, so steps are not overlapped while it is on.
        self.spec: SpecDecoding | None = None
        if spec is not None:
            self.enable_speculation(spec)

    def enable_speculation(self, spec: SpecDecoding | None) -> None:
        """Decode with speculative decoding from now on (call it on an idle engine): the
        scheduler asks ``spec`` for proposals, the runner verifies them, and steps are no
        longer overlapped. None turns it off (steps stay synchronous)."""
        if self.task != "generate" and spec is not None:
            raise ValueError("speculative decoding needs an engine built to generate")
        if self.has_unfinished():
            raise RuntimeError("enable_speculation() needs an idle engine")
        self.spec = spec
        self.scheduler.proposer = spec
        self.runner.keep_hidden = spec is not None and spec.needs_hidden
        if spec is not None:
            self.async_scheduling = False

    # -- requests -----------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams | PoolingParams,
        *,
        arrival_time: float | None = None,
        priority: int = 0,
        mm: MultimodalPrompt | None = None,
    ) -> None:
        """Admit a request (raises AdmissionError / QueueFullError when it cannot be): a
        completion (SamplingParams) on a generating engine, an embedding (PoolingParams) on
        an embedding one. ``mm``: the images of an expanded prompt
        (:meth:`tallow.engine.multimodal.PromptImages.expand`)."""
        if mm is not None and self.runner.multimodal is None:
            raise AdmissionError(
                "the request has images, but the served model takes text only", field="images"
            )
        pooling = isinstance(params, PoolingParams)
        if pooling != (self.task == "embed"):
            asked = "an embedding" if pooling else "a generation"
            raise AdmissionError(
                f"{asked} request, but this engine was built for the "
                f"{self.task!r} task (model.task)",
                field="model",
            )
        if isinstance(params, PoolingParams):
            self.scheduler.add_request(
                request_id,
                prompt_token_ids,
                _POOLING_SEQUENCE,
                arrival_time=arrival_time,
                priority=priority,
                pooling=True,
            )
            return
        # A private copy: the caller may reuse or change its object, while the engine relies
        # on a request's params never changing (what is derived from them is cached on them).
        params = params.clone()
        params.validate_vocab(self.runner.vocab_size)
        if params.max_tokens is None:
            params.max_tokens = max(1, self.max_model_len - len(prompt_token_ids))
        spec = params.structured_outputs
        grammars = [self._grammar_state(spec) for _ in range(params.n)] if spec else []
        request = self.scheduler.add_request(
            request_id,
            prompt_token_ids,
            params,
            arrival_time=arrival_time,
            priority=priority,
            mm=mm,
        )
        for seq, state in zip(request.seqs, grammars):
            seq.grammar = state

    def _grammar_state(self, spec: GrammarSpec) -> GrammarState:
        """A fresh grammar state for one completion; InvalidParameter when the engine cannot
        constrain outputs or the spec cannot be compiled."""
        if self.structured is None:
            raise InvalidParameter(
                "structured_outputs",
                "this engine cannot constrain "
                "outputs (structured outputs need an engine built to "
                "generate, with a grammar backend)",
            )
        try:
            return self.structured.new_state(spec)
        except GrammarError as exc:
            raise InvalidParameter("structured_outputs", f"structured_outputs: {exc}") from None

    def abort(self, request_id: str) -> None:
        """Abort a request; safe while its step is in flight (the step's tokens for it are
        dropped when they arrive)."""
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

    def warm_up(self, prompt_len: int = 40) -> None:
        """Run the kinds of step serving runs — prompt only, prompt beside decoding sequences,
        decode only — on throw-away requests, so that kernels compile before the first real
        request rather than inside it. Leaves no trace: blocks freed, the prefix cache and the
        counters reset. Call it on an idle engine."""
        warm_up_engine(self, prompt_len)

    def has_unfinished(self) -> bool:
        """Requests remain, or a step's tokens are still to be read back."""
        return self.scheduler.has_unfinished() or self._in_flight is not None

    # -- the step -----------------------------------------------------------------------
    def trace_steps(self, on: bool = True) -> None:
        """Time every step from now on (``on=False``: stop): where each call's wall time went
        lands in :attr:`CoreOutput.timings`, ``hidden`` and ``step_time`` (see
        :mod:`tallow.engine.step_tracer`). Off by default; benchmarks and the server's metrics
        turn it on."""
        self.tracer = StepTracer() if on else NO_TRACER

    def step(self, between: Callable[[], None] | None = None) -> CoreOutput:
        """Run one step: schedule → launch → (overlap) → collect → commit (see the module
        docstring for sync and async mode).

        ``between`` is called once, while the device computes: host work done there (turning
        the previous step's tokens into text, say) hides behind the device's work.
        """
        self.tracer.start()
        between = between or _nothing
        if self.async_scheduling:
            out = self._step_overlapped(between)
        else:
            out = self._step_sync(between)
        if out is None:  # nothing ran on the device
            return CoreOutput()
        self.tracer.stamp(out)
        return out

    def _step_sync(self, between: Callable[[], None]) -> CoreOutput | None:
        """One step start to end, its tokens returned (None if there was nothing to run): the
        device idles while the host schedules and commits."""
        launched = self._schedule_and_launch(feed=None)
        self._overlap(between)
        if launched is None:
            return None
        return self._commit(launched, self._collect(launched))

    def _step_overlapped(self, between: Callable[[], None]) -> CoreOutput | None:
        """Async mode: plan and launch the next step while the one in flight runs on the
        device, then collect and commit the one in flight and return its tokens (an empty
        output when nothing was in flight, so the call only launched; None when nothing was
        launched either). Everything about running two steps at once is decided here.

        - The fallback: a step in flight that the next step needs on the host (see
          :func:`_must_collect_first`) is collected and committed first, then the next step
          is planned; only the caller's work overlaps the device.
        - The grammar masks: when the launched step's sampling waits for its grammars, the
          step in flight is collected first (it was sampled just before the launched step's
          forward, so it is back almost at once) and the masks start filling on the grammar
          thread, so that they fill while this thread does the caller's work, returns, plans
          the next step and builds its batch (that launch samples this one first). Otherwise
          the caller's work hides the device's time before the wait for the step in flight.
        - A launch with nothing to plan on top of the step in flight (say, its sequences end by
          length and hold the blocks waiting ones need) is retried once that step is
          committed, rather than leave the device idle until the next call.
        """
        previous, self._in_flight = self._in_flight, None
        if previous is not None and previous.collect_first:
            self._overlap(between)  # the device still runs `previous`
            out = self._commit(previous, self._collect(previous))
            launched = self._schedule_and_launch(feed=None)
        else:
            launched = self._schedule_and_launch(feed=previous)
            if previous is None:  # the first step, or the one after a collected step
                self._overlap(between)
                self._in_flight = launched
                return None if launched is None else CoreOutput()
            self.overlapped_steps += launched is not None
            # still running after the launch: the device was busy while we planned
            self.tracer.hide_while_busy(previous.pending, "schedule", "launch")
            masks_first = _waits_for_grammars(launched)
            if not masks_first:
                self._overlap(between)
            out = self._commit(previous, self._collect(previous))
            if masks_first:
                assert launched is not None
                self._start_masks(launched)
                self._overlap(between)
            if launched is None and self.scheduler.has_unfinished():
                launched = self._schedule_and_launch(feed=None)
                self.tracer.unhide()
            elif launched is not None:
                self.tracer.hide_while_busy(launched.pending, "post", "mask")
        self._in_flight = launched
        out.decode_only = out.decode_only and _decode_only(launched)
        return out

    # -- the verbs of a step ------------------------------------------------------------
    def _schedule_and_launch(self, feed: _InFlight | None) -> _InFlight | None:
        """Schedule a step and launch it; None if there was nothing to run.

        ``feed`` is the step still in flight (async mode), whose sampled tokens are inputs of
        this one. A step with grammar-constrained rows is sampled here too when there is no
        ``feed``; with one, a later verb samples it (:meth:`_sample_constrained`) once
        ``feed``'s tokens are committed, since its grammars must see them first.
        """
        plan = self._schedule()
        if plan is None:
            return None
        launched = self._launch(plan, feed)
        if feed is None and _waits_for_grammars(launched):
            self._sample_constrained(launched)
        return launched

    def _schedule(self) -> SchedulerOutput | None:
        """Plan the next step (phase ``schedule``); None when it computes nothing (the empty
        plan is applied all the same: the scheduler's bookkeeping moves on)."""
        with self.tracer.phase("schedule"):
            if self.spec is not None:
                self.spec.prefetch(self.scheduler.running, self.max_model_len)
            plan = self.scheduler.schedule()
            if not plan.scheduled:
                self.scheduler.advance(plan)
                return None
            return plan

    def _launch(self, plan: SchedulerOutput, feed: _InFlight | None) -> _InFlight:
        """Build ``plan``'s batch on the host and queue its forward and sampling on the
        device (phase ``launch``). The scheduler applies the step (placeholder tokens) right
        after the launch: the runner reads each sequence's token count as the sampler's step
        counter."""
        with self.tracer.phase("launch"):
            pending = self.runner.launch(
                plan,
                feed=feed.pending if feed is not None else None,
                constrained=self.scheduler.num_constrained > 0,
            )
            applied = self.scheduler.advance(plan)
            return _InFlight(plan, pending, applied, collect_first=_must_collect_first(plan))

    def _overlap(self, between: Callable[[], None]) -> None:
        """The caller's work, run while the device computes (phase ``overlapped``)."""
        with self.tracer.phase("overlapped"):
            between()

    def _sample_constrained(self, launched: _InFlight) -> None:
        """Mask and sample a launched step whose sampling waits for its grammars (phase
        ``mask``)."""
        with self.tracer.phase("mask"):
            self.runner.sample_constrained(launched.pending)

    def _start_masks(self, launched: _InFlight) -> None:
        """Start filling the masks of a launched step whose sampling waits for its grammars,
        on the grammar thread (phase ``mask``); the next launch, or the collect of the step,
        samples it."""
        with self.tracer.phase("mask"):
            self.runner.start_masks(launched.pending)

    def _collect(self, step: _InFlight) -> StepResult:
        """Wait for a launched step and read its tokens back (phase ``wait``). A step still
        waiting for its masks (no later step was launched to sample it) is sampled first: the
        grammars accept nothing while its masks are being filled."""
        if _waits_for_grammars(step):
            self._sample_constrained(step)
        with self.tracer.phase("wait"):
            return self.runner.collect(step.pending)

    def _commit(self, step: _InFlight, result: StepResult) -> CoreOutput:
        """Commit a collected step (phase ``post``): fill its sequences' placeholders with
        the tokens, let their grammars accept them, check stops, free what finished, and
        report the step's tokens, prompt logprobs and pooled vectors."""
        with self.tracer.phase("post"):
            out = CoreOutput(decode_only=_decode_only(step))
            self._report_prompt_side(step.plan, result, out)
            sampled_ids = {sid: tok.token_id for sid, tok in result.sampled.items()}
            accepted_ids = {
                sid: [tok.token_id for tok in toks] for sid, toks in result.accepted.items()
            }
            touched_requests: set[str] = set()
            committed = self.scheduler.commit(step.applied, sampled_ids, accepted_ids)
            if self.spec is not None:
                self._record_proposals(step.plan, result)
                if result.hidden:
                    self._keep_hidden(step.plan, result)
            if self.structured is not None and self.scheduler.num_constrained:
                # the step's tokens into their grammars at once; the stop checks below find
                # them accepted (their own sync is then a no-op). A sequence that emits
                # several tokens (a verify step) syncs token by token in its stop checks.
                self.structured.advance(
                    [
                        (new.seq.grammar, new.seq.output_token_ids, new.index + 1)
                        for new in committed
                        if new.seq.grammar is not None and new.seq.seq_id not in result.accepted
                    ]
                )
            first_index: dict[int, int] = {}
            for new in committed:
                seq = new.seq
                if seq.status.is_finished:  # stopped at an earlier token of this step
                    continue
                first = first_index.setdefault(seq.seq_id, new.index)
                token = (
                    result.sampled[seq.seq_id]
                    if new.index == first
                    else result.accepted[seq.seq_id][new.index - first - 1]
                )
                update = TokenUpdate(seq.request_id, seq.index, token)
                status = self._check_stop(seq, new.index, token.token_id, update)
                if status is not None:
                    self.scheduler.finish(seq, status)
                    seq.truncate_outputs(new.index + 1)
                    touched_requests.add(seq.request_id)
                out.updates.append(update)
            for request_id in touched_requests:
                request = self.scheduler.get_request(request_id)
                if request is None or all(s.status.is_finished for s in request.seqs):
                    out.finished.append(request_id)
            self._finish_pooled(step.pending, result, out)
            self.steps += 1
            return out

    def _record_proposals(self, plan: SchedulerOutput, result: StepResult) -> None:
        """Count each verified proposal's kept tokens: a sequence emits the kept ones and one
        of the target's own, so every emitted token after its first is a kept one."""
        assert self.spec is not None  # checked by the caller
        for item in plan.scheduled:
            proposed = len(item.draft_token_ids)
            if proposed and item.seq.seq_id in result.sampled:
                kept = len(result.accepted.get(item.seq.seq_id, ()))
                self.spec.record(item.seq, proposed, kept)

    def _keep_hidden(self, plan: SchedulerOutput, result: StepResult) -> None:
        """Hand the step's kept hidden states of its running sequences to the speculator
        (sequences that finished or were aborted meanwhile have been forgotten); the
        completions an ``n > 1`` request forks at the end of its prompt share its rows."""
        spec = self.spec
        assert spec is not None  # checked by the caller
        for item in plan.scheduled:
            seq = item.seq
            kept = result.hidden.get(seq.seq_id)
            if kept is None or seq.status.is_finished:
                continue
            spec.keep_hidden(seq, *kept)
            for other in item.sample_seqs:
                if other is not seq and not other.status.is_finished:
                    spec.share_hidden(seq, other)

    def _finish_pooled(self, pending: PendingStep, result: StepResult, out: CoreOutput) -> None:
        """End the embedding requests the step pooled (an aborted one is dropped)."""
        for seq in pending.pool_targets:
            if seq.status.is_finished:
                continue
            self.scheduler.finish(seq, SequenceStatus.FINISHED_STOPPED)
            out.pooled[seq.request_id] = result.pooled[seq.seq_id]
            out.finished.append(seq.request_id)

    @staticmethod
    def _report_prompt_side(plan: SchedulerOutput, result: StepResult, out: CoreOutput) -> None:
        """Prompt logprobs computed by the step, and prefix-cache hits of first chunks."""
        for seq_id, lps in result.prompt_logprobs.items():
            for item in plan.scheduled:
                if item.seq.seq_id == seq_id:
                    out.prompt_logprobs.setdefault(item.seq.request_id, []).extend(lps)
        for item in plan.scheduled:
            if item.start == item.seq.num_cached_tokens:  # its first chunk after admission
                out.num_cached_tokens[item.seq.request_id] = item.seq.num_cached_tokens

    def _check_stop(
        self, seq: Sequence, index: int, token: int, update: TokenUpdate
    ) -> SequenceStatus | None:
        """The stop status of ``seq`` given its output ``index`` (placeholders of later steps
        may follow it in async mode, so counts come from ``index``, not from ``seq``)."""
        params = seq.params
        assert params.max_tokens is not None  # add_request sets it
        n_out = index + 1
        state = seq.grammar
        if state is not None:
            if not state.sync(seq.output_token_ids, n_out):
                log.warning(
                    "request %s: its grammar refused token %d; the output ends there",
                    seq.request_id,
                    state.refused,
                )
            if state.refused is not None or state.terminated:
                update.finish_reason = "stop"
                return SequenceStatus.FINISHED_STOPPED
        if n_out >= params.min_tokens:
            if not params.ignore_eos and token in self.eos_token_ids:
                update.finish_reason = "stop"
                return SequenceStatus.FINISHED_STOPPED
            if token in params.stop_token_ids:
                update.finish_reason, update.stop_reason = "stop", token
                return SequenceStatus.FINISHED_STOPPED
        if n_out >= params.max_tokens or seq.num_prompt_tokens + n_out >= self.max_model_len:
            update.finish_reason = "length"
            return SequenceStatus.FINISHED_LENGTH
        return None

    def stats(self) -> dict[str, float]:
        s = self.scheduler
        bm = s.block_manager
        return {
            "num_waiting": s.num_waiting,
            "num_running": s.num_running,
            "kv_usage": bm.usage,
            "num_free_blocks": bm.num_free_blocks,
            "num_total_blocks": bm.num_total_blocks,
            "kv_capacity_tokens": bm.capacity_tokens,
            "prefix_cache_hit_rate": bm.hit_rate,
            "steps": self.steps,
            "overlapped_steps": self.overlapped_steps,
            "num_preemptions": s.num_preemptions,
            **(self.structured.stats() if self.structured is not None else {}),
            **(self.spec.stats() if self.spec is not None else {}),
            **(self.runner.multimodal.stats() if self.runner.multimodal is not None else {}),
        }
