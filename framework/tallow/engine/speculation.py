"""Speculative decoding, the engine's side of a speculator: asking it for proposals, adapting
each sequence's ``k`` and counting what the target kept.

The scheduler asks :meth:`SpecDecoding.propose` for each decoding sequence it places in a step
(within what the sequence may still emit and the step's budget; see
:meth:`tallow.engine.scheduler.Scheduler`), the runner verifies every proposal in the step's
one forward (:mod:`tallow.engine.verify`), and the engine reports each verified sequence's
outcome to :meth:`SpecDecoding.record` when the step is committed.

A speculator whose ``needs_hidden_states`` is true (MTP heads) is handed the target's hidden
states: the runner puts each generating sequence's kept rows in the step's result
(``StepResult.hidden``), the engine gives them to :meth:`SpecDecoding.keep_hidden` when it
commits the step, and :meth:`SpecDecoding.propose` / :meth:`SpecDecoding.prefetch` hand the
rows gathered since a sequence's last proposal to the speculator in its
:class:`~tallow.plugin.SpeculationContext`. Other speculators cost nothing of this.

Metrics (``stats``): proposals verified, tokens proposed, tokens kept, the acceptance rate
(kept / proposed) and the mean accepted length — tokens emitted per verified proposal, the
kept ones plus the target's own, so 1 means no guess was ever kept and ``k + 1`` that all were.
"""

from __future__ import annotations

import logging
import weakref
from typing import Iterable

import torch

from tallow.plugin import Proposal, SpeculationContext, Speculator

from .sequence import Sequence

log = logging.getLogger("tallow.engine")

__all__ = ["SpecDecoding"]


class SpecDecoding:
    """One engine's speculator, its ``k`` and its counters."""

    def __init__(
        self,
        speculator: Speculator,
        num_speculative_tokens: int,
        *,
        adaptive: bool = False,
        vocab_size: int | None = None,
    ) -> None:
        if num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {num_speculative_tokens}")
        self.speculator = speculator
        self.k = int(num_speculative_tokens)
        self.adaptive = bool(adaptive)
        self.vocab_size = vocab_size
        #: each running sequence's own k (adaptive mode); sequences are dropped with their
        #: last reference
        self._k_of: "weakref.WeakKeyDictionary[Sequence, int]" = weakref.WeakKeyDictionary()
        #: the speculator proposes in batches (:meth:`prefetch`)
        self.batched = type(speculator).propose_batch is not Speculator.propose_batch
        #: seq_id -> (its token count, its proposal) asked for by :meth:`prefetch`
        self._ready: dict[int, tuple[int, Proposal]] = {}
        #: the speculator reads the target's hidden states (the runner keeps them)
        self.needs_hidden = bool(type(speculator).needs_hidden_states)
        #: seq_id -> (first position, row chunks) of hidden states not yet handed over
        self._hidden: dict[int, tuple[int, list[torch.Tensor]]] = {}
        self.num_proposals = 0  # verified proposals of at least one token
        self.num_proposed_tokens = 0
        self.num_accepted_tokens = 0

    # -- the engine's side, before a step is planned --------------------------------------
    def prefetch(self, running: Iterable[Sequence], max_model_len: int) -> None:
        """Ask a speculator that proposes in batches (one overriding
        :meth:`Speculator.propose_batch`) for the proposals of every decoding sequence of
        ``running`` at once; :meth:`propose` then hands each out, cut to what the step allows.
        Other speculators are asked one sequence at a time by :meth:`propose`."""
        self._ready.clear()
        if not self.batched:
            return
        seqs: list[Sequence] = []
        requests = []
        for seq in running:
            if seq.num_uncomputed_tokens != 1 or seq.num_pending_tokens:
                continue
            k = min(self.k_of(seq), seq.room_after_next(max_model_len))
            if k > 0:
                seqs.append(seq)
                requests.append((seq.all_token_ids, k, self._context(seq)))
        if not requests:
            return
        for seq, got in zip(seqs, self.speculator.propose_batch(requests), strict=True):
            proposal = got if isinstance(got, Proposal) else Proposal(list(got))
            self._ready[seq.seq_id] = (seq.num_tokens, proposal)

    # -- the scheduler's side -----------------------------------------------------------
    def propose(self, seq: Sequence, limit: int) -> tuple[list[int], object]:
        """Up to ``min(k, limit)`` proposed tokens after ``seq``'s last, and the proposer's
        distributions (None when certain)."""
        k = min(self._k_of.get(seq, self.k) if self.adaptive else self.k, limit)
        ready = self._ready.pop(seq.seq_id, None)
        if k <= 0:
            return [], None
        if ready is not None and ready[0] == seq.num_tokens:
            proposal = ready[1]
        else:
            got = self.speculator.propose(seq.all_token_ids, k, self._context(seq))
            proposal = got if isinstance(got, Proposal) else Proposal(list(got))
        tokens, probs = proposal.token_ids, proposal.probs
        if len(tokens) > k:  # more than asked: the rest would not fit the step's plan
            tokens = tokens[:k]
            probs = None if probs is None else probs[:k]
        vocab = self.vocab_size
        if vocab is not None and any(t >= vocab for t in tokens):
            bad = next(t for t in tokens if t >= vocab)
            raise ValueError(
                f"speculator {self.speculator.name or type(self.speculator).__name__}"
                f" proposed token id {bad}, outside the vocabulary of {vocab}"
            )
        return tokens, probs

    def _context(self, seq: Sequence) -> SpeculationContext:
        params = seq.params
        hidden, start = None, 0
        kept = self._hidden.pop(seq.seq_id, None) if self.needs_hidden else None
        if kept is not None:
            start, chunks = kept
            hidden = chunks[0] if len(chunks) == 1 else torch.cat(chunks)
        return SpeculationContext(
            request_id=seq.request_id,
            index=seq.index,
            num_prompt_tokens=seq.num_prompt_tokens,
            temperature=0.0 if params.greedy else params.temperature,
            hidden=hidden,
            hidden_start=start,
        )

    def keep_hidden(self, seq: Sequence, start: int, rows: torch.Tensor) -> None:
        """A committed step computed and kept the target's hidden ``rows`` of ``seq`` at
        positions ``start ..``: gathered until its next proposal. Rows that do not follow
        the ones gathered (a sequence preempted and computed again) start over."""
        kept = self._hidden.get(seq.seq_id)
        if kept is not None and kept[0] + sum(c.shape[0] for c in kept[1]) == start:
            kept[1].append(rows)
        else:
            self._hidden[seq.seq_id] = (start, [rows])

    def share_hidden(self, source: Sequence, fork: Sequence) -> None:
        """``fork`` (a completion forked from ``source`` at the end of its prompt) starts
        with the rows gathered for ``source``."""
        kept = self._hidden.get(source.seq_id)
        if kept is not None:
            self._hidden[fork.seq_id] = (kept[0], list(kept[1]))

    def forget(self, seq: Sequence) -> None:
        """``seq`` finished or was preempted: the speculator drops what it kept for it."""
        self._k_of.pop(seq, None)
        self._ready.pop(seq.seq_id, None)
        self._hidden.pop(seq.seq_id, None)
        self.speculator.finished(seq.request_id, seq.index)

    # -- the engine's side ----------------------------------------------------------------
    def record(self, seq: Sequence, proposed: int, kept: int) -> None:
        """A verify step kept ``kept`` of ``seq``'s ``proposed`` tokens."""
        self.num_proposals += 1
        self.num_proposed_tokens += proposed
        self.num_accepted_tokens += kept
        if self.adaptive:
            k = self._k_of.get(seq, self.k)
            if kept == proposed:
                k = min(self.k, k + 1)
            elif 2 * kept < proposed:
                k = max(1, k - 1)
            self._k_of[seq] = k

    def k_of(self, seq: Sequence) -> int:
        """The k ``seq`` is asked for next (``k`` unless adaptive)."""
        return self._k_of.get(seq, self.k) if self.adaptive else self.k

    @property
    def acceptance_rate(self) -> float:
        return (
            self.num_accepted_tokens / self.num_proposed_tokens if self.num_proposed_tokens else 0.0
        )

    @property
    def mean_accepted_length(self) -> float:
        return (
            (self.num_accepted_tokens + self.num_proposals) / self.num_proposals
            if self.num_proposals
            else 0.0
        )

    def reset_stats(self) -> None:
        self.num_proposals = self.num_proposed_tokens = self.num_accepted_tokens = 0

    def stats(self) -> dict[str, float]:
        return {
            "spec_num_proposals": self.num_proposals,
            "spec_num_proposed_tokens": self.num_proposed_tokens,
            "spec_num_accepted_tokens": self.num_accepted_tokens,
            "spec_acceptance_rate": self.acceptance_rate,
            "spec_mean_accepted_length": self.mean_accepted_length,
        }
