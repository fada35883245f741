"""What a scheduler step plans and what applying it leaves: the types the scheduler, the model
runner and the engine core exchange (see :mod:`tallow.engine.scheduler` for the protocol)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from .sequence import Sequence

__all__ = ["AppliedStep", "NewToken", "Proposer", "ScheduledSeq", "SchedulerOutput"]


@dataclass
class ScheduledSeq:
    """One row group of a step: ``seq`` computes tokens ``start .. start + num_tokens - 1``.

    ``sample_seqs`` get a token sampled from the logits of the *last* row: ``[]`` for a
    non-final prefill chunk, ``[seq]`` normally, and all ``n`` sequences of the request for the
    final prompt chunk of an ``n > 1`` request (the others are forked from ``seq`` by
    :meth:`~tallow.engine.scheduler.Scheduler.update`). With ``prompt_logprobs`` the runner
    must return the logits of every row: row ``j`` predicts token ``start + j + 1``. Rows are
    never reported twice for a prompt, even across a preemption.
    """

    seq: Sequence
    start: int
    num_tokens: int
    sample_seqs: list[Sequence] = field(default_factory=list)
    prompt_logprobs: bool = False
    #: a running sequence computing its one pending token (as opposed to a prompt chunk)
    is_decode: bool = False
    #: an embedding request's whole prompt: pool its rows' hidden states (nothing is sampled)
    pool: bool = False
    #: tokens a speculator proposed after the sequence's last one (speculative decoding): the
    #: step computes them too (``num_tokens`` is 1 + their count) and every row is verified
    draft_token_ids: list[int] = field(default_factory=list)
    #: the proposer's distributions at those positions (a [k, vocab] tensor), None when each
    #: proposed token was certain (see tallow.plugin.Proposal)
    draft_probs: object = None

    @property
    def end(self) -> int:
        return self.start + self.num_tokens


@dataclass
class SchedulerOutput:
    """The plan of one step. ``blocks_to_copy`` are copy-on-write copies (src, dst) to perform
    before the forward ((src, dst, group) for a paged group other than the first); with state
    cache groups, ``state_ops`` (group, src, dst) are applied in order before it too: slot
    ``dst`` takes a copy of slot ``src``, or zeros when ``src`` is -1. ``preempted`` lost their
    blocks this step (informational)."""

    scheduled: list[ScheduledSeq] = field(default_factory=list)
    blocks_to_copy: list[tuple[int, ...]] = field(default_factory=list)
    state_ops: list[tuple[int, int, int]] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    num_batched_tokens: int = 0

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

    @property
    def num_sampled(self) -> int:
        return sum(len(item.sample_seqs) for item in self.scheduled)


@dataclass
class NewToken:
    """Output ``index`` of ``seq`` is sampled by an applied step (a placeholder until commit)."""

    seq: Sequence
    index: int


@dataclass
class AppliedStep:
    """A step :meth:`~tallow.engine.scheduler.Scheduler.advance` has applied;
    :meth:`~tallow.engine.scheduler.Scheduler.commit` completes it."""

    out: SchedulerOutput
    #: the placeholders it appended, in the order of ``out.scheduled`` then ``sample_seqs``
    tokens: list[NewToken] = field(default_factory=list)


class Proposer(Protocol):
    """What the scheduler asks of speculative decoding (the engine's
    :class:`~tallow.engine.speculation.SpecDecoding`): up to ``limit`` proposed tokens after
    ``seq``'s last token, and their distributions (None: each token certain)."""

    def propose(self, seq: Sequence, limit: int) -> tuple[list[int], object]: ...

    def forget(self, seq: Sequence) -> None:
        """``seq`` finished or was preempted."""
