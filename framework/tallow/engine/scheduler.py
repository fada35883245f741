"""Continuous batching: which sequences compute which tokens in the next step.

Each :meth:`Scheduler.schedule` fills one step under a token budget
(``max_num_batched_tokens``): first every running sequence in policy order (decodes cost one
token; a prefill in progress takes a chunk of what is left, after room is kept for the
decodes), then waiting sequences are admitted while the budget, ``max_num_seqs`` and the KV
blocks allow. When a running sequence needs a block and none is free, the lowest-ranked
running sequence is preempted *by recompute*: its blocks are freed and it goes back to the
waiting queue with nothing computed; when it is admitted again it recomputes its prompt and
the outputs it had (using the prefix cache where it can) and continues where it stopped.

An embedding request (``pooling``) computes its whole prompt in one step, never in chunks (an
encoder's attention is bidirectional: every token needs all the others), skips the prefix cache
(pooling needs every token's hidden state) and samples nothing: the engine finishes it when the
step's pooled vector is read back. Its prompt must fit one step's budget; until a step has room
for it, it waits. An engine that embeds runs its block manager without prefix caching, so an
encoder's blocks (whose K/V depend on later tokens) are never offered for sharing.

A sequence whose length is known in advance (``ignore_eos`` with ``max_tokens``, one
completion) *reserves* the blocks it will grow into: a waiting sequence is admitted only if the
free blocks still cover every such reservation after its own (its whole known length, or for
other sequences the tokens it computes now). Those sequences are then never preempted by one
another; recomputing a preempted 2,000-token sequence costs more than waiting for room. Other
sequences reserve nothing and are admitted as before.

Order: ``"fcfs"`` ranks by arrival; ``"priority"`` by (priority, arrival), lower first. Under
``"priority"`` a waiting sequence may also preempt running ones of strictly lower priority to
get in.

Protocol, one step: ``out = schedule()`` → the runner performs ``out.blocks_to_copy``, runs
``out.scheduled`` and samples one token per sequence in each item's ``sample_seqs`` →
``update(out, sampled)`` → the engine checks stop conditions and calls :meth:`Scheduler.finish`. The
scheduler never decides a stop; in particular the engine must finish a sequence when it
reaches ``max_model_len`` tokens. Not thread-safe: the engine core's thread owns it.

Each ``schedule()`` call plans its step in a
:class:`tallow.engine.scheduling_pass.SchedulingPass`, which lives for that call only.

``update`` is two halves that async scheduling calls apart: ``applied = advance(out)`` right
after the step is launched (computed counts move on, ``n > 1`` requests fork, each sampled
sequence gets a placeholder token), so the next ``schedule()`` may plan the following step
while this one runs; ``commit(applied, sampled)`` once its tokens are read back (placeholders
filled, full blocks registered in the prefix cache). A sequence whose last token is pending and
that will end by length anyway (``max_tokens``, ``max_model_len``) is not scheduled again.
"""

from __future__ import annotations

import bisect
from operator import attrgetter
from typing import Any, Callable

from .block_manager import BlockManager
from .kv_manager import KVCacheManager
from .errors import AdmissionError, QueueFullError
from .sampling.params import SamplingParams
from .scheduled import AppliedStep, NewToken, Proposer, ScheduledSeq, SchedulerOutput
from .scheduling_pass import SchedulingPass
from .sequence import Request, Sequence, SequenceStatus

__all__ = [
    "Scheduler",
    "SchedulerOutput",
    "ScheduledSeq",
    "AppliedStep",
    "NewToken",
    "AdmissionError",
    "QueueFullError",
]

_POLICIES = ("fcfs", "priority")


def _positive_int(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager | KVCacheManager,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        prefill_chunk_size: int | None,
        max_model_len: int,
        policy: str = "fcfs",
        max_waiting: int | None = None,
    ) -> None:
        self.block_manager = block_manager
        self.max_num_seqs = _positive_int("max_num_seqs", max_num_seqs)
        self.max_num_batched_tokens = _positive_int(
            "max_num_batched_tokens", max_num_batched_tokens
        )
        self.prefill_chunk_size = (
            None
            if prefill_chunk_size is None
            else _positive_int("prefill_chunk_size", prefill_chunk_size)
        )
        self.max_model_len = _positive_int("max_model_len", max_model_len)
        if policy not in _POLICIES:
            raise ValueError(f"policy must be one of {', '.join(_POLICIES)}, got {policy!r}")
        self.policy = policy
        self.max_waiting = (
            None if max_waiting is None else _positive_int("max_waiting", max_waiting)
        )
        # A sequence may grow to max_model_len tokens and must then fit alone, or preemption
        # could never make room for it.
        if block_manager.capacity_tokens < self.max_model_len:
            raise ValueError(
                f"the KV cache holds {block_manager.capacity_tokens} tokens "
                f"({block_manager.num_total_blocks} blocks of {block_manager.block_size}), "
                f"fewer than max_model_len={self.max_model_len}: lower max_model_len or give "
                f"the KV cache more memory"
            )
        # attrgetter builds the same tuples as a lambda would, without a Python call per
        # sequence (every step sorts the running sequences by it).
        self.order_key: Callable[[Sequence], tuple[object, ...]] = (
            attrgetter("priority", "arrival_time", "seq_id")
            if policy == "priority"
            else attrgetter("arrival_time", "seq_id")
        )
        self.waiting: list[Sequence] = []  # sorted by self.order_key
        self.running: list[Sequence] = []
        self.requests: dict[str, Request] = {}
        self._pending: SchedulerOutput | None = None
        self.num_preemptions = 0
        #: unfinished requests whose output a grammar constrains (structured outputs)
        self.num_constrained = 0
        #: seq_id -> blocks at the known final length, for sequences that reserve them
        self.final_blocks: dict[int, int] = {}
        #: speculative decoding: asked for proposals of decoding sequences (None: off)
        self.proposer: Proposer | None = None

    # -- requests ------------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        arrival_time: float | None = None,
        priority: int = 0,
        pooling: bool = False,
        mm: Any = None,
    ) -> Request:
        """Queue a request; raise AdmissionError if it can never be served, QueueFullError if
        the waiting queue is full. ``pooling``: an embedding request (see the module
        docstring); ``mm``: the images of an expanded prompt (a
        :class:`tallow.engine.multimodal.MultimodalPrompt`)."""
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
        if not isinstance(request_id, str) or not request_id:
            raise AdmissionError(
                f"request_id must be a non-empty string, got {request_id!r}", field="request_id"
            )
        if request_id in self.requests:
            raise AdmissionError(f"request id {request_id!r} is already in use", field="request_id")
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise AdmissionError(f"priority must be an integer, got {priority!r}", field="priority")
        prompt = list(prompt_token_ids)
        if not prompt:
            raise AdmissionError(
                "the prompt is empty: at least one token is needed", field="prompt"
            )
        if any(not isinstance(t, int) or isinstance(t, bool) or t < 0 for t in prompt):
            raise AdmissionError(
                "prompt_token_ids must be token ids (integers >= 0)", field="prompt"
            )
        length, bm = len(prompt), self.block_manager
        if pooling:
            self._check_pooled_prompt(length)
        elif length + 1 > self.max_model_len:
            raise AdmissionError(
                f"the prompt has {length} tokens; with at least one generated token that "
                f"exceeds the context length max_model_len={self.max_model_len} (the KV "
                f"cache holds {bm.capacity_tokens} tokens)",
                field="prompt",
            )
        if length + (not pooling) > bm.capacity_tokens:
            raise AdmissionError(
                f"the prompt has {length} tokens; with at least one generated token that "
                f"exceeds the KV cache capacity of {bm.capacity_tokens} tokens "
                f"(max_model_len={self.max_model_len})",
                field="prompt",
            )
        if mm is not None and mm.whole_images:
            self._check_whole_images(mm)
        if params.n > self.max_num_seqs:
            raise AdmissionError(
                f"n={params.n} completions exceed max_num_seqs="
                f"{self.max_num_seqs}, the most sequences run at once",
                field="n",
            )
        if self.max_waiting is not None and len(self.waiting) >= self.max_waiting:
            raise QueueFullError(
                f"the waiting queue is full ({self.max_waiting} sequences); retry later"
            )
        request = Request.create(
            request_id,
            prompt,
            params,
            arrival_time=arrival_time,
            priority=priority,
            pooling=pooling,
            mm=mm,
        )
        self.requests[request_id] = request
        self.num_constrained += params.structured_outputs is not None
        self._note_final_length(request.seqs[0])
        self._enqueue(request.seqs[0])
        return request

    def _check_pooled_prompt(self, length: int) -> None:
        if length > self.max_model_len:
            raise AdmissionError(
                f"the input has {length} tokens, more than the context length "
                f"max_model_len={self.max_model_len}",
                field="prompt",
            )
        if length > self.max_num_batched_tokens:
            raise AdmissionError(
                f"the input has {length} tokens, more than one step computes "
                f"(scheduler.max_num_batched_tokens={self.max_num_batched_tokens}); an "
                "embedding input is computed whole in one step",
                field="prompt",
            )

    def get_request(self, request_id: str) -> Request | None:
        """The request, while any of its sequences is unfinished; else None."""
        return self.requests.get(request_id)

    def finish(
        self, seq: Sequence, status: SequenceStatus, stop_reason: int | str | None = None
    ) -> None:
        """End ``seq`` with a finished ``status`` and free its blocks (idempotent)."""
        if not status.is_finished:
            raise ValueError(f"finish needs a finished status, got {status.name}")
        if seq.status.is_finished:
            return
        self.block_manager.free(seq)
        self.final_blocks.pop(seq.seq_id, None)
        if self.proposer is not None:
            self.proposer.forget(seq)
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.drop_pending_tokens()  # tokens of steps still running: nobody wants them now
        seq.status = status
        seq.finish_reason = status.finish_reason
        seq.stop_reason = stop_reason
        request = self.requests.get(seq.request_id)
        if request is None:
            return
        if seq.index == 0 and not request.forked:
            # The prompt never completed, so the other completions never started.
            for child in request.seqs[1:]:
                if not child.status.is_finished:
                    child.status = SequenceStatus.FINISHED_ABORTED
                    child.finish_reason = SequenceStatus.FINISHED_ABORTED.finish_reason
            request.forked = True
        if request.is_finished:
            del self.requests[seq.request_id]
            self.num_constrained -= request.params.structured_outputs is not None

    def abort(self, request_id: str) -> list[Sequence]:
        """Abort every unfinished sequence of the request, wherever it is; return them. An
        unknown or finished request id is a no-op returning []."""
        request = self.requests.get(request_id)
        if request is None:
            return []
        aborted = [s for s in request.seqs if not s.status.is_finished]
        for seq in aborted:
            self.finish(seq, SequenceStatus.FINISHED_ABORTED)
        return aborted

    # -- state ---------------------------------------------------------------------------
    def has_unfinished(self) -> bool:
        return bool(self.requests)

    @property
    def num_waiting(self) -> int:
        """Sequences waiting for admission (new requests and preempted sequences)."""
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_unfinished_requests(self) -> int:
        return len(self.requests)

    @property
    def kv_usage(self) -> float:
        return self.block_manager.usage

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.block_manager.hit_rate

    # -- helpers -------------------------------------------------------------------------
    def _note_final_length(self, seq: Sequence) -> None:
        """Record the blocks ``seq`` will reach if its length is known in advance: with
        ``ignore_eos`` and ``max_tokens`` it ends at prompt + max_tokens (or max_model_len)
        unless a stop string or stop token ends it sooner."""
        p = seq.params
        if p.ignore_eos and p.max_tokens is not None and p.n == 1:
            final = min(seq.num_prompt_tokens + p.max_tokens, self.max_model_len)
            self.final_blocks[seq.seq_id] = self.block_manager.blocks_for(final)

    def reserved_blocks(self) -> int:
        """Blocks the running sequences of known length will still claim."""
        if not self.final_blocks:
            return 0
        final = self.final_blocks
        return sum(
            max(0, final[seq.seq_id] - len(seq.block_ids))
            for seq in self.running
            if seq.seq_id in final
        )

    def _enqueue(self, seq: Sequence) -> None:
        bisect.insort(self.waiting, seq, key=self.order_key)

    def _check_whole_images(self, mm: Any) -> None:
        """Each image of ``mm`` must fit one step (its tokens are computed together)."""
        step = min(
            self.max_num_batched_tokens, self.prefill_chunk_size or self.max_num_batched_tokens
        )
        for image in mm.images:
            if image.processed.num_tokens > step:
                raise AdmissionError(
                    f"an image of {image.processed.num_tokens} tokens does not fit one step of "
                    f"{step} tokens (max_num_batched_tokens / prefill_chunk_size), and this "
                    "model computes each image in one step",
                    field="images",
                )

    # -- the step ------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """Plan the next step (see the module docstring)."""
        if self._pending is not None and any(
            item.seq.status is SequenceStatus.RUNNING for item in self._pending.scheduled
        ):
            raise RuntimeError(
                "schedule() called again before update() applied the previous SchedulerOutput"
            )
        step = SchedulingPass(self)
        step.schedule_running()
        if not step.preempted or self.policy == "priority":
            step.admit_waiting()
        out = step.output()
        self._pending = out
        return out

    def preempt(self, seq: Sequence) -> None:
        """Preempt running ``seq`` by recompute: free its blocks and queue it again with
        nothing computed (see the module docstring)."""
        self.block_manager.free(seq)
        if self.proposer is not None:
            self.proposer.forget(seq)
        self.running.remove(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self._enqueue(seq)

    def update(self, out: SchedulerOutput, sampled: dict[int, int]) -> list[Sequence]:
        """Apply a step the runner has run: advance computed tokens, register full blocks in
        the prefix cache, fork ``n > 1`` completions at the end of the prompt and append the
        sampled tokens (``seq_id -> token id``). Returns the sequences that got a token, in
        the order of ``out.scheduled`` and then ``sample_seqs``. Sequences finished or aborted
        since ``schedule()`` are skipped. Same as :meth:`advance` then :meth:`commit`."""
        if out is not self._pending:
            raise ValueError("update() takes the SchedulerOutput of the latest schedule(), once")
        for item in out.scheduled:
            if item.seq.status is not SequenceStatus.RUNNING:
                continue
            for target in item.sample_seqs:
                if not target.status.is_finished and target.seq_id not in sampled:
                    raise ValueError(
                        f"update: no sampled token for sequence {target.seq_id} "
                        f"(request {target.request_id!r}, index {target.index})"
                    )
        return [new.seq for new in self.commit(self.advance(out), sampled)]

    def advance(self, out: SchedulerOutput) -> AppliedStep:
        """Apply a launched step before its tokens are known: computed tokens advance, ``n > 1``
        requests fork at the end of their prompt, and every sequence that samples gets a
        placeholder token. The next :meth:`schedule` may then run; :meth:`commit` completes
        the step when its tokens are read back."""
        if out is not self._pending:
            raise ValueError("advance() takes the SchedulerOutput of the latest schedule(), once")
        live = [item for item in out.scheduled if item.seq.status is SequenceStatus.RUNNING]
        for item in live:
            if item.seq.num_computed_tokens != item.start:
                raise RuntimeError(
                    f"advance: sequence {item.seq.seq_id} has "
                    f"{item.seq.num_computed_tokens} computed tokens, the plan "
                    f"started at {item.start}"
                )
        self._pending = None
        applied = AppliedStep(out)
        tokens, running = applied.tokens, SequenceStatus.RUNNING
        for item in live:
            seq = item.seq
            end = item.start + item.num_tokens
            seq.num_computed_tokens = end
            if item.prompt_logprobs:
                seq.num_prompt_logprob_rows = max(seq.num_prompt_logprob_rows, end)
            if not seq.prompt_computed and end >= seq.num_prompt_tokens:
                seq.prompt_computed = True
            if not item.sample_seqs:
                continue
            if seq.index == 0 and seq.params.n > 1:
                request = self.requests.get(seq.request_id)
                if request is not None and not request.forked:
                    self._fork_children(request)
            for target in item.sample_seqs:
                if target.status is running:
                    tokens.append(NewToken(target, target.append_pending_token()))
        return applied

    def commit(
        self,
        applied: AppliedStep,
        sampled: dict[int, int],
        accepted: dict[int, list[int]] | None = None,
    ) -> list[NewToken]:
        """Complete an applied step with its sampled tokens (``seq_id -> token id``): fill the
        placeholders and register the blocks the step computed in the prefix cache. Returns
        the tokens of sequences still unfinished (possibly preempted since), in step order;
        the engine checks their stops. Tokens of sequences finished meanwhile are dropped.

        ``accepted`` (speculative decoding) maps a sequence that verified proposed tokens to
        the tokens it emits after the one in ``sampled`` (its emitted tokens are that one and
        these, at most one more than it proposed; see :meth:`_settle_proposals`)."""
        kept = [new for new in applied.tokens if not new.seq.status.is_finished]
        tokens = [sampled.get(new.seq.seq_id) for new in kept]
        if None in tokens:  # check them all before filling any
            seq = kept[tokens.index(None)].seq
            raise ValueError(
                f"commit: no sampled token for sequence {seq.seq_id} "
                f"(request {seq.request_id!r}, index {seq.index})"
            )
        for new, token in zip(kept, tokens):
            assert token is not None  # checked above
            new.seq.fill_pending_token(new.index, int(token))
        if any(item.draft_token_ids for item in applied.out.scheduled):
            kept = self._settle_proposals(applied.out, kept, accepted or {})
        mark_computed, running = self.block_manager.mark_computed, SequenceStatus.RUNNING
        for item in applied.out.scheduled:
            if item.seq.status is running:
                mark_computed(item.seq, upto=item.start + item.num_tokens)
        return kept

    def _settle_proposals(
        self, out: SchedulerOutput, kept: list[NewToken], accepted: dict[int, list[int]]
    ) -> list[NewToken]:
        """After a verify step: append each sequence's further emitted tokens, move its
        computed count back to the tokens whose K/V are valid (its last token and the kept
        proposals) and give back the blocks only rejected proposals were in. Returns ``kept``
        with the new tokens after their sequence's first, in order."""
        more: dict[int, list[NewToken]] = {}
        for item in out.scheduled:
            seq = item.seq
            k = len(item.draft_token_ids)
            if not k or seq.status.is_finished:
                continue
            extra = accepted.get(seq.seq_id, [])
            if len(extra) > k:
                raise ValueError(
                    f"commit: sequence {seq.seq_id} emits {len(extra) + 1} tokens "
                    f"from {k} proposed ones (at most {k + 1})"
                )
            for token in extra:
                seq.append_token(int(token))
                more.setdefault(seq.seq_id, []).append(NewToken(seq, seq.num_output_tokens - 1))
            if seq.status is SequenceStatus.RUNNING:
                # computed through the last kept proposal; rejected rows' slots are free to
                # be written again, and blocks holding only them go back
                seq.num_computed_tokens = item.start + 1 + len(extra)
                self.block_manager.trim(seq, seq.num_tokens)
        if not more:
            return kept
        ordered: list[NewToken] = []
        for new in kept:
            ordered.append(new)
            ordered.extend(more.pop(new.seq.seq_id, ()))
        return ordered

    def _fork_children(self, request: Request) -> None:
        parent = request.seqs[0]
        for child in request.seqs[1:]:
            if child.status.is_finished:
                continue
            self.block_manager.fork(parent, child)
            child.status = SequenceStatus.RUNNING
            child.prompt_computed = True
            child.num_cached_tokens = parent.num_cached_tokens
            child.num_prompt_logprob_rows = parent.num_prompt_logprob_rows
            self.running.append(child)
        request.forked = True
