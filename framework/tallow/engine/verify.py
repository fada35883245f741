"""The verify step of speculative decoding, on the runner's side: a step's logits rows and its
scheduled sequences turned into the tokens each sequence emits.

A step with proposed tokens has every row of each proposing sequence in its logits
(:meth:`~tallow.engine.batch_inputs.BatchInputs.fill_host` puts them there) and one row per
other sampled sequence. Each sequence becomes a
:class:`~tallow.engine.sampling.speculative.VerifySeq`; a sequence whose output a grammar
constrains gets a mask at each of its rows, the mask after the proposed tokens before that
row, filled by walking its matcher through the proposal and rolling it back (the matcher is
the engine thread's here: verify steps are never overlapped).
"""

from __future__ import annotations

from typing import Sequence

import torch

from .sampling.grammar import GrammarState, StructuredOutputs
from .sampling.speculative import VerifiedToken, VerifySeq, verify_step
from .scheduler import ScheduledSeq
from .sequence import Sequence as EngineSequence

__all__ = ["verify_scheduled", "proposal_masks", "child_seed"]


def child_seed(seed: int | None, index: int) -> int | None:
    """The seed of completion ``index`` of a request: distinct streams for n > 1."""
    if seed is None:
        return None
    return seed if index == 0 else (seed * 1_000_003 + index * 7_919) & 0x7FFF_FFFF_FFFF


def proposal_masks(
    state: GrammarState, seq: EngineSequence, draft_ids: Sequence[int], words: int
) -> torch.Tensor | None:
    """The packed masks of ``seq``'s rows ([len(draft_ids) + 1, words] int32, CPU): row ``j``
    allows what the grammar allows after the outputs and ``draft_ids[:j]``. Rows after a
    proposed token the grammar refuses repeat the last mask (that token cannot be kept, so
    they are never used). None when the grammar has refused a token or ended (the row is
    not constrained; the engine ends the sequence when the step is committed). The matcher
    is left where it was."""
    known = seq.num_output_tokens - seq.num_pending_tokens
    if not state.sync(seq.output_token_ids, known) or state.terminated:
        return None
    matcher = state.matcher
    rows = len(draft_ids) + 1
    masks = torch.zeros(rows, words, dtype=torch.int32)
    taken = 0
    for j in range(rows):
        matcher.fill_bitmask(masks, j)
        if j == rows - 1:
            break
        if matcher.is_terminated() or not matcher.accept(int(draft_ids[j])):
            masks[j + 1 :] = masks[j]
            break
        taken += 1
    if taken:
        matcher.rollback(taken)
    return masks


def verify_scheduled(
    logits: torch.Tensor,
    scheduled: list[ScheduledSeq],
    vocab_size: int,
    eos_token_ids: set[int],
    grammar: StructuredOutputs | None,
) -> list[list[VerifiedToken]]:
    """The tokens each sampled sequence of a verify step emits, in the order of the step's
    targets (``sample_seqs`` of each item in turn); ``logits`` holds the step's sampled rows
    in that order."""
    seqs: list[VerifySeq] = []
    masks: list[torch.Tensor] = []
    masked_rows: list[int] = []
    row = 0
    for item in scheduled:
        if item.draft_token_ids:
            targets: list[tuple[EngineSequence, list[int], object]] = [
                (item.seq, item.draft_token_ids, item.draft_probs)
            ]
        else:
            targets = [(seq, [], None) for seq in item.sample_seqs]
        for seq, drafts, probs in targets:
            assert probs is None or isinstance(probs, torch.Tensor)  # a Proposal's probs
            vs = VerifySeq(
                params=seq.params,
                output_token_ids=list(seq.output_token_ids),
                prompt_token_ids=seq.prompt_token_ids,
                seed=child_seed(seq.params.seed, seq.index),
                draft_ids=list(drafts),
                draft_probs=None if probs is None else probs.to(logits.device),
            )
            state = seq.grammar
            if grammar is not None and state is not None and not seq.status.is_finished:
                mask = proposal_masks(state, seq, drafts, grammar.backend.tokenizer.bitmask_words)
                if mask is not None:
                    masks.append(mask)
                    masked_rows.extend(range(row, row + vs.num_rows))
            seqs.append(vs)
            row += vs.num_rows
    packed = None
    if masks:
        packed = (
            torch.cat(masks).to(logits.device),
            torch.tensor(masked_rows, dtype=torch.int64, device=logits.device),
        )
    return verify_step(
        logits, seqs, vocab_size, eos_token_ids=sorted(eos_token_ids), grammar=packed
    )
