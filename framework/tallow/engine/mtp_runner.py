"""The multi-token prediction head of ``speculative.method: mtp`` as the engine runs it: the
target's own MTP layer (:class:`tallow.layers.MTPHead`) with a paged KV cache of its own and
one head sequence per target completion.

Position ``p`` of a head sequence combines the target's hidden state at ``p`` with the token at
``p + 1``, so its tokens are the completion's shifted by one. Positions computed from the
target's hidden states are *true*; the guesses a proposal feeds (the head's own output hidden
state and its own token) are not, and the next :meth:`MTPRunner.sync` rolls the sequence back
to its true positions (blocks past them go back to the pool, as for a draft model's sequence)
before it feeds the target's new rows: every row the target kept since the last proposal.
A new sequence whose rows begin past position 0 (its prompt began with a hit in the target's
prefix cache, whose positions the target did not compute) feeds a zero hidden state at those
positions. Nothing is evicted: a sequence whose next rows the pool cannot hold proposes nothing
this time and keeps the rows to feed with the next ones; one whose rows do not follow its true
positions proposes nothing from then on.
"""

from __future__ import annotations

from typing import Sequence

import torch

from tallow.layers import MTPHead

from .draft_runner import forward_rows, pack_round
from .kv_manager import KVCacheManager, PagedGroupSize
from .model_runner import ModelRunner
from .sampling.params import SamplingParams
from .sequence import Sequence as EngineSequence
from .sequence import SequenceStatus

__all__ = ["MTPRunner", "HeadState"]


class HeadState:
    """One completion's head sequence: its tokens and KV, how many positions are true, the
    target's rows it could not feed yet, and whether it has fallen out of step with the
    target (then it proposes nothing)."""

    def __init__(self, seq: EngineSequence) -> None:
        self.seq = seq
        self.true_len = 0
        self.broken = False
        #: rows handed over while the pool could not hold them, fed first next time
        self.waiting: torch.Tensor | None = None


class MTPRunner:
    """The head's runner, block pool and sequences (see the module docstring). ``target``
    is the target's model runner, whose device, dtype, attention backend, block size and
    pool size the head's cache takes; ``chunk`` is the most tokens one head forward
    computes."""

    def __init__(self, head: MTPHead, target: ModelRunner, chunk: int) -> None:
        self.head = head
        self.runner = ModelRunner(
            head,
            device=target.device,
            dtype=target.dtype,
            # one layer's cache beside the target's many: as many blocks as the target's pool
            num_blocks=target.num_blocks,
            block_size=target.block_size,
            attention_backend=target.backend,
            vocab_size=target.vocab_size,
            max_num_seqs=target.max_num_seqs,
            max_model_len=target.max_model_len,
        )
        self.max_model_len = target.max_model_len
        self.chunk = max(1, int(chunk))
        self.blocks = KVCacheManager(
            list(self.runner.group_sizes) or [PagedGroupSize(target.num_blocks)],
            block_size=target.block_size,
            enable_prefix_caching=False,
            max_step_tokens=self.chunk,
        )
        self._states: dict[tuple[str, int], HeadState] = {}
        self._params = SamplingParams(temperature=0.0)

    @property
    def num_sequences(self) -> int:
        return len(self._states)

    def state(self, request_id: str, index: int) -> HeadState | None:
        return self._states.get((request_id, index))

    def sync(
        self,
        requests: list[tuple[tuple[str, int], Sequence[int], torch.Tensor | None, int, int]],
    ) -> list[tuple[torch.Tensor, torch.Tensor] | None]:
        """For each ``(key, token_ids, hidden, hidden_start, room)`` (``hidden``: the
        target's rows at positions ``hidden_start ..`` not yet fed, None for none): the
        head's (logits [vocab] float32, output hidden [H]) at the completion's last true
        position, with blocks for ``room`` more positions reserved (the guesses
        :meth:`extend` feeds); None when the sequence cannot propose. All sequences' rows go
        through shared forwards of at most ``chunk`` tokens."""
        # ((request, state, rows' first position, rows), next position, rows left)
        pending: list[tuple[tuple[int, HeadState, int, torch.Tensor], int, int]] = []
        for i, (key, token_ids, hidden, start, room) in enumerate(requests):
            prepared = self._prepare(key, token_ids, hidden, start, room)
            if prepared is not None:
                state, first, rows = prepared
                pending.append(((i, state, first, rows), first, rows.shape[0]))
        out: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(requests)
        while pending:
            taken, pending = pack_round(pending, self.chunk)
            logits, outs = self._forward(
                [(state.seq, start, n) for (_, state, _, _), start, n in taken],
                torch.cat(
                    [
                        rows[start - first : start - first + n]
                        for (_, _, first, rows), start, n in taken
                    ]
                ),
            )
            ended = [
                (i, state)
                for (i, state, _, _), start, n in taken
                if start + n == state.seq.num_tokens
            ]
            for row, (i, state) in enumerate(ended):
                state.true_len = state.seq.num_tokens
                out[i] = (logits[row], outs[row])
        return out

    def _prepare(
        self,
        key: tuple[str, int],
        token_ids: Sequence[int],
        hidden: torch.Tensor | None,
        start: int,
        room: int,
    ) -> tuple[HeadState, int, torch.Tensor] | None:
        """``key``'s head sequence rolled back to its true positions and extended by the
        tokens of ``hidden``'s positions, its blocks reserved, with the first position and
        the rows to feed; None when it cannot propose."""
        state = self._states.get(key)
        if state is None:
            seq = EngineSequence(key[0], key[1], [], self._params, status=SequenceStatus.RUNNING)
            state = self._states[key] = HeadState(seq)
        if state.broken:
            return None
        if state.waiting is not None:
            waiting, state.waiting = state.waiting, None
            if hidden is None or start != state.true_len + waiting.shape[0]:
                self._break(state)
                return None
            hidden = torch.cat([waiting, hidden])
            start = state.true_len
        if hidden is not None and start > 0 and state.seq.num_tokens == 0:
            # a new sequence whose prompt began with a prefix-cache hit: the target computed
            # no hidden state there, and the head's positions take a zero one (its token
            # embedding alone)
            hidden = torch.cat([hidden.new_zeros(start, hidden.shape[1]), hidden])
            start = 0
        n = 0 if hidden is None else int(hidden.shape[0])
        # rows must follow the true positions and reach the completion's last token
        if n == 0 or start != state.true_len or start + n + 1 != len(token_ids):
            self._break(state)
            return None
        assert hidden is not None  # n > 0
        seq = state.seq
        seq.rewind(start)
        self.blocks.trim(seq, start)
        for t in token_ids[start + 1 :]:
            seq.append_token(int(t))
        if not self.blocks.can_allocate(seq, n + room):
            # no proposal this time: the rows wait for a pool with room
            seq.rewind(start)
            state.waiting = hidden
            return None
        copies = self.blocks.append_slots(seq, n + room)
        assert not copies  # no block is shared: no prefix caching, no forks
        return state, start, hidden

    def _break(self, state: HeadState) -> None:
        """The sequence fell out of step (rows are missing): its blocks go back and it
        proposes nothing until it ends."""
        state.broken = True
        self.blocks.free(state.seq)

    def extend(
        self, guesses: list[tuple[tuple[str, int], int, torch.Tensor]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed one guess per sequence (``(key, token, hidden)``: the guessed token and the
        head's output hidden state it follows; slots reserved by :meth:`sync`) in one
        forward: the logits and output hidden states after each, in order."""
        rows = []
        for key, token, _ in guesses:
            seq = self._states[key].seq
            seq.append_token(int(token))
            rows.append((seq, seq.num_tokens - 1, 1))
        return self._forward(rows, torch.stack([h for *_, h in guesses]))

    def _forward(
        self, rows: list[tuple[EngineSequence, int, int]], hidden: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One head forward of ``(seq, start, n)`` row groups over ``hidden`` (their rows,
        in order): the logits and output hidden states after the groups that end their
        sequence's tokens, in order."""
        self.head.feed_hidden(hidden.to(self.runner.dtype))
        try:
            last = forward_rows(self.runner, rows)
        finally:
            self.head.feed_hidden(None)
        return self.head.compute_logits(last).float(), last

    def free(self, request_id: str, index: int) -> None:
        """Drop the head sequence of a completion and give its blocks back."""
        state = self._states.pop((request_id, index), None)
        if state is not None and not state.broken:
            self.blocks.free(state.seq)
