"""One scheduling pass: the plan of the next step (the rules are in the module docstring of
:mod:`tallow.engine.scheduler`).

A :class:`SchedulingPass` is made by each :meth:`tallow.engine.scheduler.Scheduler.schedule`
call and lives for that call only: it places the running sequences first (decodes, prefill
chunks, speculative proposals, preempting the lowest-ranked ones when blocks run out), then
admits waiting sequences while the budget, the running slots, the KV blocks and the blocks
reserved by sequences of known length allow. It reads and changes the scheduler through
:class:`SchedulerState`, so this module does not import the scheduler's (which imports it).
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Protocol

from .block_manager import BlockManager
from .kv_manager import KVCacheManager
from .scheduled import Proposer, ScheduledSeq, SchedulerOutput
from .sequence import Request, Sequence, SequenceStatus

__all__ = ["SchedulerState", "SchedulingPass"]


class SchedulerState(Protocol):
    """What a scheduling pass reads and changes of its scheduler
    (:class:`tallow.engine.scheduler.Scheduler`)."""

    block_manager: BlockManager | KVCacheManager
    max_num_seqs: int
    max_num_batched_tokens: int
    prefill_chunk_size: int | None
    max_model_len: int
    policy: str
    #: the policy's order, highest rank first (``waiting`` is kept sorted by it)
    order_key: Callable[[Sequence], tuple[object, ...]]
    waiting: list[Sequence]
    running: list[Sequence]
    requests: dict[str, Request]
    #: seq_id -> blocks at the known final length, for sequences that reserve them
    final_blocks: dict[int, int]
    proposer: Proposer | None

    def reserved_blocks(self) -> int:
        """Blocks the running sequences of known length will still claim."""
        ...

    def preempt(self, seq: Sequence) -> None:
        """Preempt running ``seq`` by recompute: free its blocks and queue it again."""
        ...


class SchedulingPass:
    """The working state of one :meth:`tallow.engine.scheduler.Scheduler.schedule` call: the
    running sequences first, then admissions from the waiting queue (the module docstring of
    :mod:`tallow.engine.scheduler` gives the rules)."""

    def __init__(self, scheduler: SchedulerState) -> None:
        self.s = scheduler
        self.budget = scheduler.max_num_batched_tokens
        self.decodes: list[ScheduledSeq] = []
        self.prefills: list[ScheduledSeq] = []
        self.admitted: list[ScheduledSeq] = []
        self.copies: dict[int, list[tuple[int, ...]]] = {}
        self.items: dict[int, tuple[list[ScheduledSeq], ScheduledSeq]] = {}
        self.preempted: list[Sequence] = []
        #: blocks the running sequences of known length will still claim (see admit_waiting)
        self.reserved: int | None = None
        scheduler.running.sort(key=scheduler.order_key)
        self.used_slots = sum(self._slots(seq) for seq in scheduler.running)

    # -- rules for one sequence ----------------------------------------------------------
    def _slots(self, seq: Sequence) -> int:
        """Running slots ``seq`` stands for: an unforked first sequence reserves its siblings."""
        if seq.index == 0 and seq.params.n > 1:
            request = self.s.requests.get(seq.request_id)
            if request is not None and not request.forked:
                return len(request.seqs)
        return 1

    def _chunk(self, seq: Sequence, start: int, remaining: int, budget: int) -> int:
        if seq.pooling:  # all of it or nothing
            return remaining if remaining <= budget else 0
        n = min(remaining, budget)
        chunk_size = self.s.prefill_chunk_size
        if chunk_size is not None:
            n = min(n, chunk_size)
        if seq.mm is not None:  # a model whose images are computed whole: stop before one
            n = seq.mm.chunk_end(start, n)
        if (
            seq.params.prompt_logprobs is not None
            and not seq.prompt_computed
            and start < seq.num_prompt_logprob_rows
        ):
            # Recomputing after a preemption: stop where already-reported rows end, so the
            # next chunk reports exactly the rows not yet reported.
            n = min(n, seq.num_prompt_logprob_rows - start)
        return n

    def _item(
        self,
        seq: Sequence,
        num_tokens: int,
        is_decode: bool,
        proposal: tuple[list[int], object] | None = None,
    ) -> ScheduledSeq:
        start = seq.num_computed_tokens
        params = seq.params
        sample: list[Sequence] = []
        if seq.pooling:
            return ScheduledSeq(seq, start, num_tokens, pool=start + num_tokens == seq.num_tokens)
        if proposal is not None:  # a decode with proposed tokens: their rows are verified
            return ScheduledSeq(
                seq,
                start,
                num_tokens,
                [seq],
                is_decode=True,
                draft_token_ids=proposal[0],
                draft_probs=proposal[1],
            )
        if start + num_tokens == seq.num_tokens:
            sample.append(seq)
            if seq.index == 0 and params.n > 1:
                request = self.s.requests.get(seq.request_id)
                if request is not None and not request.forked:
                    sample.extend(c for c in request.seqs[1:] if not c.status.is_finished)
        prompt_logprobs = (
            params.prompt_logprobs is not None
            and not seq.prompt_computed
            and start >= seq.num_prompt_logprob_rows
        )
        return ScheduledSeq(seq, start, num_tokens, sample, prompt_logprobs, is_decode)

    @staticmethod
    def _may_use_prefix_cache(seq: Sequence) -> bool:
        # Cached blocks would skip prompt rows whose logprobs (or hidden states, to pool) the
        # request asked for.
        if seq.pooling:
            return False
        return seq.params.prompt_logprobs is None or seq.prompt_computed

    def _awaits_length_stop(self, seq: Sequence) -> bool:
        """``seq``'s last token is still on the device and ends it by length whatever its
        value: computing it would be wasted (the engine finishes it when the token arrives)."""
        if not seq.num_pending_tokens:
            return False
        max_tokens = seq.params.max_tokens
        return (
            max_tokens is not None and seq.num_output_tokens >= max_tokens
        ) or seq.num_tokens >= self.s.max_model_len

    def _check_fits_alone(self, seq: Sequence) -> None:
        bm = self.s.block_manager
        if seq.num_tokens > bm.capacity_tokens:
            raise RuntimeError(
                f"sequence {seq.seq_id} of request {seq.request_id!r} has {seq.num_tokens} "
                f"tokens, more than the KV cache holds ({bm.capacity_tokens}); the engine "
                f"must finish sequences at max_model_len={self.s.max_model_len}"
            )

    # -- the pass ------------------------------------------------------------------------
    def _add(
        self,
        bucket: list[ScheduledSeq],
        seq: Sequence,
        num_tokens: int,
        proposal: tuple[list[int], object] | None = None,
    ) -> None:
        item = self._item(seq, num_tokens, bucket is self.decodes, proposal)
        copies = self.s.block_manager.append_slots(seq, num_tokens)
        if copies:
            self.copies[seq.seq_id] = list(copies)
        bucket.append(item)
        self.items[seq.seq_id] = (bucket, item)
        self.budget -= num_tokens

    def _preempt(self, seq: Sequence) -> None:
        """Preempt ``seq``, taking back what this step had already given it."""
        planned = self.items.pop(seq.seq_id, None)
        if planned is not None:
            bucket, item = planned
            bucket.remove(item)
            self.budget += item.num_tokens
            self.copies.pop(seq.seq_id, None)
        self.used_slots -= self._slots(seq)
        self.s.preempt(seq)
        self.preempted.append(seq)

    def schedule_running(self) -> None:
        s, bm = self.s, self.s.block_manager
        # Sequences that end by length when their pending token arrives get no more work.
        # (Embedding requests whose vector is still on its way back have nothing left to
        # compute: their chunk below is empty.)
        queue = deque(seq for seq in s.running if not self._awaits_length_stop(seq))
        # Decodes still to be placed; a prefill chunk leaves them room in the budget.
        pending_decodes = sum(1 for seq in queue if seq.num_uncomputed_tokens == 1)
        while queue:
            seq = queue.popleft()
            remaining = seq.num_uncomputed_tokens
            decode = remaining == 1
            if decode:
                pending_decodes -= 1
                num_new = 1 if self.budget >= 1 else 0
            else:
                num_new = self._chunk(
                    seq, seq.num_computed_tokens, remaining, self.budget - pending_decodes
                )
            if num_new <= 0:
                continue
            fits = bm.can_allocate(seq, num_new)
            if not fits:
                self._check_fits_alone(seq)
            while not fits and queue:
                victim = queue.pop()  # the lowest-ranked sequence not yet placed
                if victim.num_uncomputed_tokens == 1:
                    pending_decodes -= 1
                self._preempt(victim)
                fits = bm.can_allocate(seq, num_new)
            if not fits:
                self._preempt(seq)
                continue
            proposal = (
                self._propose(seq, pending_decodes) if decode and s.proposer is not None else None
            )
            if proposal is not None:
                num_new += len(proposal[0])
            self._add(self.decodes if decode else self.prefills, seq, num_new, proposal)

    def _propose(self, seq: Sequence, pending_decodes: int) -> tuple[list[int], object] | None:
        """Proposed tokens for a decoding sequence, within what it may still emit
        (``max_tokens``, ``max_model_len``), the step's budget (after one token for each decode
        still to be placed) and the free KV blocks: a proposal never preempts anyone. None
        when there is none."""
        s = self.s
        assert s.proposer is not None  # checked by the caller
        if seq.num_pending_tokens or seq.params.n > 1 and not self._forked(seq):
            return None
        limit = min(seq.room_after_next(s.max_model_len), self.budget - 1 - pending_decodes)
        if limit <= 0:
            return None
        tokens, probs = s.proposer.propose(seq, limit)
        if not tokens:
            return None
        if len(tokens) > limit:
            raise ValueError(
                f"the speculator proposed {len(tokens)} tokens, more than the {limit} asked for"
            )
        if not s.block_manager.can_allocate(seq, 1 + len(tokens)):
            return None
        return tokens, probs

    def _forked(self, seq: Sequence) -> bool:
        request = self.s.requests.get(seq.request_id)
        return request is None or request.forked

    def _priority_victim(self, seq: Sequence) -> Sequence | None:
        s = self.s
        if s.policy != "priority" or not s.running:
            return None
        worst = max(s.running, key=s.order_key)
        return worst if worst.priority > seq.priority else None

    def _fits_reservations(self, seq: Sequence, num_new: int, hits: list[int]) -> bool:
        """Whether admitting ``seq`` leaves the blocks reserved by running sequences of known
        length free (see the module docstring)."""
        s, bm = self.s, self.s.block_manager
        final = s.final_blocks.get(seq.seq_id)
        if self.reserved is None:
            if not s.final_blocks:
                return True
            self.reserved = s.reserved_blocks()
        if final is None:
            if not self.reserved:
                return True
            final = bm.blocks_for(len(hits) * bm.block_size + num_new)
        return bm.num_free_blocks - self.reserved >= final - len(hits)

    def admit_waiting(self) -> None:
        s, bm = self.s, self.s.block_manager
        self.reserved = None  # computed when first needed
        i = 0  # waiting[:i] are passed over: they end by length when their last token arrives
        while i < len(s.waiting) and self.budget > 0:
            seq = s.waiting[i]
            if self._awaits_length_stop(seq):
                i += 1
                continue
            hits = bm.get_prefix_hits(seq) if self._may_use_prefix_cache(seq) else []
            cached = len(hits) * bm.block_size
            num_new = self._chunk(seq, cached, seq.num_tokens - cached, self.budget)
            if not num_new:
                break  # an embedding input that needs a step with more room
            slots = self._slots(seq)
            if (
                self.used_slots + slots > s.max_num_seqs
                or not bm.can_allocate(seq, num_new, hits)
                or not self._fits_reservations(seq, num_new, hits)
            ):
                victim = self._priority_victim(seq)
                if victim is None:
                    break
                self._preempt(victim)
                continue
            s.waiting.pop(i)
            first = seq.num_preemptions == 0
            cached = bm.allocate_prefix(seq, hits, record_stats=first)
            if first:
                seq.num_cached_tokens = cached
            seq.status = SequenceStatus.RUNNING
            s.running.append(seq)
            self.used_slots += slots
            self._add(self.admitted, seq, num_new)
            if self.reserved is not None and seq.seq_id in s.final_blocks:
                self.reserved += max(0, s.final_blocks[seq.seq_id] - len(seq.block_ids))

    def output(self) -> SchedulerOutput:
        scheduled = self.decodes + self.prefills + self.admitted
        copies = (
            [pair for item in scheduled for pair in self.copies.get(item.seq.seq_id, ())]
            if self.copies
            else []
        )
        out = SchedulerOutput(
            scheduled=scheduled,
            blocks_to_copy=copies,
            preempted=self.preempted,
            num_batched_tokens=sum(i.num_tokens for i in scheduled),
        )
        pop_state_ops = getattr(self.s.block_manager, "pop_state_ops", None)
        if pop_state_ops is not None:
            out.state_ops = pop_state_ops()
        return out
