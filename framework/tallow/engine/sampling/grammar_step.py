"""One step's grammar work, done on the grammar thread: bring each constrained sequence's
matcher up to its committed tokens (the tokens the step before sampled), fill the masks of the
rows the next step samples, and record which grammars have ended.

The engine thread hands the work over as entries ``(state, outputs, count)``: ``state`` a
:class:`~tallow.engine.sampling.grammar.GrammarState`, ``outputs`` its sequence's live list of
output tokens, of which the first ``count`` are committed (the engine thread only appends
placeholders past them, fills those and drops them, so the first ``count`` never change while
the job runs). It reads a state's verdict — ``refused``, ``ended`` — only after it waited for
the job that wrote it.

The work calls the backend a few times per step, not once per row (``accept_tokens``,
``fill_bitmasks``, a few tensor operations): every call that releases the GIL has to win it
back from the engine thread afterwards, which can take as long as the interpreter's switch
interval while that thread runs Python.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch

from tallow.plugin import GrammarBackend

if TYPE_CHECKING:  # pragma: no cover
    from .grammar import GrammarState

#: one sequence's work: its grammar state, its output tokens, how many of them are committed
RowWork = tuple["GrammarState", Sequence[int], int]


def advance(backend: GrammarBackend, entries: Sequence[RowWork]) -> None:
    """Bring every entry's matcher to exactly ``outputs[:count]``. The usual case — one new
    token — goes to the backend in one batched ``accept_tokens`` call; anything else (tokens
    taken back, several new ones) through :meth:`GrammarState.sync`. A state listed twice is
    brought to its last entry's count."""
    latest: dict[int, RowWork] = {}
    for entry in entries:
        latest[id(entry[0])] = entry
    states: list[GrammarState] = []
    tokens: list[int] = []
    for state, outputs, count in latest.values():
        if state.refused is not None or state.accepted == count:
            continue
        if state.accepted == count - 1:
            states.append(state)
            tokens.append(outputs[count - 1])
        else:
            state.sync(outputs, count)
    if not states:
        return
    taken = backend.accept_tokens([state.matcher for state in states], tokens)
    for state, token, accepted in zip(states, tokens, taken, strict=True):
        if accepted:
            state.accepted += 1
        else:
            state.refused = token


def fill(backend: GrammarBackend, entries: Sequence[RowWork], host: torch.Tensor,
         eos_words: Sequence[tuple[int, int]]) -> None:
    """Fill row ``i`` of ``host`` with the mask of ``entries[i]`` (already advanced). A row
    whose mask allows no token but EOS has ended (``state.ended``): nothing may follow, and
    its sequence stops before that token. Rows of ended or refused grammars are left all
    allowed: their token is dropped, and a row with every token masked would give the
    sampler nothing to draw. ``eos_words`` are ``(word, the word's bits of other tokens)``
    for each word that holds an EOS token's bit."""
    states = [entry[0] for entry in entries]
    backend.fill_bitmasks([state.matcher for state in states], host, range(len(states)))
    words = host.numpy()
    # A row is live if any bit but an EOS token's is set: clear the EOS bits in place for one
    # pass over the rows (numpy's reduction is several times faster than torch's here, and
    # one call), then put them back.
    saved = [(word, words[:, word].copy()) for word, _ in eos_words]
    for word, others in eos_words:
        words[:, word] &= others
    live = words.any(axis=1)
    for word, column in saved:
        words[:, word] = column
    dead = (~live).nonzero()[0].tolist()
    for i in dead:
        states[i].ended = True
    dead.extend(i for i, state in enumerate(states) if state.refused is not None)
    if dead:
        words[dead] = -1


def settle_unfilled(advanced: Sequence[RowWork], filled: Sequence[RowWork]) -> None:
    """``state.ended`` of the advanced states that got no mask (their sequence finished, or
    is not in the next step): asked of the matcher, one row at a time (few rows: usually the
    sequences ending this step for another reason)."""
    skip = {id(entry[0]) for entry in filled}
    for state, _, _ in advanced:
        if id(state) not in skip and state.refused is None:
            state.ended = state.matcher.is_terminated()

