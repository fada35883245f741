"""Requests and the sequences (completions) they generate, as the scheduler tracks them.

Token accounting, which every other part of the engine relies on:

* ``all_token_ids`` = prompt followed by the outputs sampled so far; ``num_tokens`` its length.
* ``num_computed_tokens`` = how many leading tokens have their K/V in the cache.
* A sampled token is appended when its step is applied; its K/V are computed by the *next*
  step. So a sequence that is decoding has ``num_computed_tokens == num_tokens - 1`` and its
  next step computes exactly one token (the last) and samples from that row.
* A sequence whose remaining tokens are more than one is in prefill: its prompt, or, after a
  preemption, its prompt and outputs being recomputed. Every step that brings
  ``num_computed_tokens`` up to ``num_tokens`` samples a new token.
* With async scheduling a step is applied before its tokens are read back from the device: each
  sampled sequence gets a placeholder (``PENDING_TOKEN``) that is filled in when the step is
  collected. Placeholders are always the last ``num_pending_tokens`` outputs; everything that
  needs token *values* (prefix-cache hashes, penalties) reads only the first
  ``num_known_tokens``. Counts (``num_tokens``, ``num_output_tokens``) include placeholders, so
  lengths, the seeded sampler's step counter and min_tokens are right before the values are.
"""

from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from .sampling.params import SamplingParams

__all__ = ["SequenceStatus", "Sequence", "Request", "PENDING_TOKEN"]

_seq_ids = itertools.count()

#: Stands for a sampled token still on the device. Negative, so that a placeholder fed to a
#: model by mistake fails loudly (an embedding lookup of -1) instead of computing garbage.
PENDING_TOKEN = -1


class SequenceStatus(enum.Enum):
    WAITING = "waiting"  # not holding KV blocks: new, or preempted and to be recomputed
    RUNNING = "running"  # admitted: holds the blocks of its computed tokens
    FINISHED_STOPPED = "stop"  # EOS, a stop token id or a stop string
    FINISHED_LENGTH = "length"  # max_tokens or the context length reached
    FINISHED_ABORTED = "abort"  # cancelled by the client or the engine

    @property
    def is_finished(self) -> bool:
        # By value: hashing a str is cached, while hashing an Enum member runs Python code, and
        # this is asked several times per sequence per step.
        return self._value_ in _FINISHED_VALUES

    @property
    def finish_reason(self) -> str | None:
        """The OpenAI ``finish_reason`` of a finished status ("stop", "length", "abort")."""
        return self._value_ if self._value_ in _FINISHED_VALUES else None


_FINISHED_VALUES = frozenset({"stop", "length", "abort"})


@dataclass(eq=False)
class Sequence:
    """One of the ``n`` completions of a request.

    ``block_ids`` (its block table), ``block_hashes`` and ``num_registered_blocks`` are owned by
    the :class:`~tallow.engine.block_manager.BlockManager`; ``status`` and
    ``num_computed_tokens`` by the :class:`~tallow.engine.scheduler.Scheduler`. Append tokens
    with :meth:`append_token` only, so ``all_token_ids`` stays in step with the outputs.
    Sequences compare by identity and hash by ``seq_id``.
    """

    request_id: str
    index: int
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float = 0.0
    priority: int = 0
    seq_id: int = field(default_factory=lambda: next(_seq_ids))
    output_token_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    #: one block table per paged cache group (owned by the block managers); ``block_ids`` is
    #: the first group's
    block_tables: list[list[int]] = field(default_factory=lambda: [[]], repr=False)
    #: per state cache group, the state slot the sequence holds (-1: none)
    state_slots: list[int] = field(default_factory=list, repr=False)
    #: prompt tokens served by the prefix cache at its first admission
    num_cached_tokens: int = 0
    finish_reason: str | None = None
    #: the stop token id or stop string that ended it, if the engine records one
    stop_reason: int | str | None = None
    #: True once the whole prompt has been computed (then it is never prefilled as new again)
    prompt_computed: bool = False
    #: prompt positions whose prompt-logprob rows were handed to the engine already
    num_prompt_logprob_rows: int = 0
    num_preemptions: int = 0
    # Chained hashes of its full blocks of tokens, computed lazily; tokens never change once
    # appended, so these stay valid across preemptions.
    block_hashes: list[bytes] = field(default_factory=list, repr=False)
    #: per paged group, how many leading blocks mark_computed has already offered to the
    #: prefix cache (``num_registered_blocks`` is the first group's)
    registered_blocks: list[int] = field(default_factory=lambda: [0], repr=False)
    #: trailing outputs that are placeholders for tokens still on the device (async scheduling)
    num_pending_tokens: int = 0
    #: an embedding request: its prompt is computed whole in one step and pooled; it samples
    #: nothing and ends with that step
    pooling: bool = False
    #: the structured-output grammar state (a tallow.engine.sampling.GrammarState) of a
    #: constrained completion; None when its output is free
    grammar: Any = field(
        default=None, repr=False
    )  # Any: a GrammarState (sampling.grammar) or None; sequence sits below it
    #: the images of its prompt (a tallow.engine.multimodal.MultimodalPrompt), None: text only
    mm: Any = field(default=None, repr=False)  # Any: a MultimodalPrompt; multimodal sits above it
    _all: list[int] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self.prompt_token_ids = list(self.prompt_token_ids)
        self.output_token_ids = list(self.output_token_ids)
        self._all = self.prompt_token_ids + self.output_token_ids

    def __hash__(self) -> int:
        return hash(self.seq_id)

    # -- cache tables ----------------------------------------------------------------------
    @property
    def block_ids(self) -> list[int]:
        """The block table of the first paged cache group."""
        return self.block_tables[0]

    @block_ids.setter
    def block_ids(self, table: list[int]) -> None:
        self.block_tables[0] = table

    @property
    def num_registered_blocks(self) -> int:
        return self.registered_blocks[0]

    @num_registered_blocks.setter
    def num_registered_blocks(self, count: int) -> None:
        self.registered_blocks[0] = count

    # -- tokens ------------------------------------------------------------------------
    @property
    def all_token_ids(self) -> list[int]:
        """Prompt + outputs. The live list, not a copy: read it, never modify it."""
        return self._all

    @property
    def num_tokens(self) -> int:
        return len(self._all)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def last_token_id(self) -> int:
        return self._all[-1]

    @property
    def num_uncomputed_tokens(self) -> int:
        """Tokens whose K/V still have to be computed (1 for a decoding sequence)."""
        return len(self._all) - self.num_computed_tokens

    @property
    def is_prefill(self) -> bool:
        """More than one token is left to compute: a prompt (or a recompute after preemption)
        is being processed. A decode step computes exactly one token; a one-token prompt is
        therefore computed like a decode."""
        return self.num_computed_tokens < len(self._all) - 1

    @property
    def num_known_tokens(self) -> int:
        """Leading tokens whose ids the host knows (all but the pending placeholders)."""
        return len(self._all) - self.num_pending_tokens

    def append_token(self, token_id: int) -> None:
        if self.num_pending_tokens:
            raise RuntimeError(f"sequence {self.seq_id}: a known token cannot follow a pending one")
        self.output_token_ids.append(token_id)
        self._all.append(token_id)

    def append_pending_token(self) -> int:
        """Append a placeholder for a token still on the device; return its output index."""
        self.output_token_ids.append(PENDING_TOKEN)
        self._all.append(PENDING_TOKEN)
        self.num_pending_tokens += 1
        return len(self.output_token_ids) - 1

    def fill_pending_token(self, index: int, token_id: int) -> None:
        """Replace the first placeholder, output ``index``, by the token read back."""
        first = len(self.output_token_ids) - self.num_pending_tokens
        if not self.num_pending_tokens or index != first:
            raise RuntimeError(
                f"sequence {self.seq_id}: output {index} is not its first "
                f"pending token ({self.num_pending_tokens} pending)"
            )
        self.output_token_ids[index] = token_id
        self._all[self.num_prompt_tokens + index] = token_id
        self.num_pending_tokens -= 1

    def drop_pending_tokens(self) -> None:
        """Forget the placeholders (the sequence has finished: their tokens are not wanted)."""
        if self.num_pending_tokens:
            del self.output_token_ids[-self.num_pending_tokens :]
            del self._all[-self.num_pending_tokens :]
            self.num_pending_tokens = 0

    def truncate_outputs(self, count: int) -> None:
        """Keep the first ``count`` outputs of a finished sequence: a verify step may emit
        tokens past the one that stopped it (speculative decoding), which are not outputs."""
        if not self.status.is_finished:
            raise RuntimeError(f"sequence {self.seq_id}: only a finished sequence drops outputs")
        if count < self.num_output_tokens:
            del self.output_token_ids[count:]
            del self._all[self.num_prompt_tokens + count :]

    def room_after_next(self, max_model_len: int) -> int:
        """How many tokens may follow this sequence's next one under ``max_model_len`` and its
        ``max_tokens``: the most a speculative proposal may hold (before a step's budget)."""
        room = max_model_len - self.num_tokens - 1
        if self.params.max_tokens is not None:
            room = min(room, self.params.max_tokens - self.num_output_tokens - 1)
        return room

    def rewind(self, num_tokens: int) -> None:
        """Keep the first ``num_tokens`` tokens and at most that many computed: for a
        sequence whose outputs are guesses taken back (a draft model's own sequence rolled back
        to what the target kept; speculative decoding). The prompt is never dropped."""
        if not self.num_prompt_tokens <= num_tokens <= self.num_tokens or self.num_pending_tokens:
            raise ValueError(
                f"rewind: sequence {self.seq_id} cannot keep {num_tokens} of its "
                f"{self.num_tokens} tokens ({self.num_prompt_tokens} prompt, "
                f"{self.num_pending_tokens} pending)"
            )
        del self.output_token_ids[num_tokens - self.num_prompt_tokens :]
        del self._all[num_tokens:]
        self.num_computed_tokens = min(self.num_computed_tokens, num_tokens)

    # -- status ------------------------------------------------------------------------
    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def seed(self) -> int | None:
        """The request's seed, or None; the engine derives each completion's stream from it."""
        return self.params.seed

    def __repr__(self) -> str:
        return (
            f"Sequence(seq_id={self.seq_id}, request_id={self.request_id!r}, "
            f"index={self.index}, status={self.status.name}, tokens={self.num_tokens} "
            f"({self.num_prompt_tokens} prompt), computed={self.num_computed_tokens}, "
            f"blocks={self.block_ids})"
        )


@dataclass(eq=False)
class Request:
    """A prompt and its ``params.n`` sequences. Only ``seqs[0]`` is prefilled; the others are
    forked from it (sharing its KV blocks) when its prompt is complete."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    seqs: list[Sequence]
    arrival_time: float
    priority: int = 0
    #: True once seqs[1:] share seqs[0]'s blocks (always True when n == 1)
    forked: bool = False

    @classmethod
    def create(
        cls,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        arrival_time: float | None = None,
        priority: int = 0,
        pooling: bool = False,
        mm: Any = None,
    ) -> "Request":
        arrival = time.time() if arrival_time is None else float(arrival_time)
        prompt = list(prompt_token_ids)
        seqs = [
            Sequence(
                request_id=request_id,
                index=i,
                prompt_token_ids=prompt,
                params=params,
                arrival_time=arrival,
                priority=priority,
                pooling=pooling,
                mm=mm,
            )
            for i in range(params.n)
        ]
        return cls(
            request_id=request_id,
            prompt_token_ids=prompt,
            params=params,
            seqs=seqs,
            arrival_time=arrival,
            priority=priority,
            forked=params.n == 1,
        )

    @property
    def is_finished(self) -> bool:
        return all(s.status.is_finished for s in self.seqs)

    @property
    def num_cached_tokens(self) -> int:
        """Prompt tokens served by the prefix cache when the request was first admitted."""
        return self.seqs[0].num_cached_tokens

    @property
    def unforked_children(self) -> list[Sequence]:
        """The sequences still waiting to be forked from seqs[0] (empty once forked)."""
        return [] if self.forked else self.seqs[1:]
