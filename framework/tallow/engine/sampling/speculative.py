"""Verifying proposed tokens: which of a speculator's guesses the target model keeps.

A verify step computes the target's logits at a sequence's last token and at each of its ``k``
proposed tokens: row ``j`` is the target's distribution of the token after ``d_1 .. d_j``. The
sequence then emits the longest prefix of the proposal the target keeps plus one token of the
target's own, 1 to ``k + 1`` tokens in all:

- **Greedy rows** keep ``d_{j+1}`` while it is row ``j``'s argmax; the first row whose argmax
  differs (or row ``k`` when all were kept) gives the target's token. The output is the
  target's greedy output exactly.
- **Sampled rows** use speculative (rejection) sampling (Leviathan et al., 2023; Chen et al.,
  2023): ``d_{j+1}`` is kept with probability ``min(1, p_j(d) / q_j(d))``, ``p`` the target's
  distribution after every logit edit, temperature and filter, ``q`` the proposer's (all its
  mass on ``d`` for a deterministic proposer); the first rejected position draws from the
  residual ``max(0, p_j - q_j)`` renormalized; when every guess is kept, row ``k`` gives a
  bonus token from ``p_k``. Each emitted token is then distributed exactly as the target
  alone would have drawn it.

Rows are processed in the sampler's order (logit bias, min_tokens, penalties, the grammar's
mask, then temperature, top-k, top-p, min-p), each as if the proposed tokens before it were
already outputs, so penalties and min_tokens count them. Reported logprobs are the raw
distribution's, as in :mod:`.sampler`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from tallow.kernels.sampling import apply_logit_edits
from tallow.kernels.token_bitmask import apply_token_bitmask

from .batch import RowParams, SamplingBatch
from .filters import apply_min_p, apply_top_k, apply_top_p
from .params import SamplingParams

__all__ = [
    "accept_greedy",
    "rejection_sample",
    "VerifySeq",
    "VerifiedToken",
    "verify_step",
    "row_generator",
]


def accept_greedy(target_ids: Sequence[int], draft_ids: Sequence[int]) -> list[int]:
    """The tokens a greedy sequence emits: ``target_ids`` (each row's argmax, ``k + 1`` of
    them) up to and including the first row whose argmax is not the next proposed token."""
    if len(target_ids) != len(draft_ids) + 1:
        raise ValueError(
            f"target_ids: expected {len(draft_ids) + 1} rows (k + 1), got {len(target_ids)}"
        )
    out: list[int] = []
    for j, token in enumerate(target_ids):
        out.append(int(token))
        if j == len(draft_ids) or token != draft_ids[j]:
            break
    return out


def rejection_sample(
    target_probs: torch.Tensor,
    draft_ids: Sequence[int],
    draft_probs: torch.Tensor | None,
    generator: torch.Generator | None = None,
) -> list[int]:
    """Speculative sampling of one sequence's chain (see the module docstring).

    ``target_probs`` [k + 1, V]: the target's distribution at each row; ``draft_ids`` the ``k``
    proposed tokens; ``draft_probs`` [k, V] the proposer's distributions (None: each proposed
    token had all the proposer's mass). Random numbers come from ``generator`` (a CPU
    generator; None: torch's default). Returns the 1 .. k + 1 emitted tokens.
    """
    k = len(draft_ids)
    if target_probs.dim() != 2 or target_probs.shape[0] != k + 1:
        raise ValueError(
            f"target_probs: expected shape ({k + 1}, vocab), got {tuple(target_probs.shape)}"
        )
    if draft_probs is not None and tuple(draft_probs.shape) != (k, target_probs.shape[1]):
        raise ValueError(
            f"draft_probs: expected shape ({k}, {target_probs.shape[1]}), got "
            f"{tuple(draft_probs.shape)}"
        )
    p_all = target_probs.detach().to("cpu", torch.float64)
    q_all = None if draft_probs is None else draft_probs.detach().to("cpu", torch.float64)
    out: list[int] = []
    for j, d in enumerate(draft_ids):
        p = p_all[j]
        q_d = 1.0 if q_all is None else float(q_all[j, d])
        u = float(torch.rand((), generator=generator, dtype=torch.float64))
        if q_d > 0.0 and u * q_d < float(p[d]):
            out.append(int(d))
            continue
        if q_all is None:
            residual = p.clone()
            residual[d] = 0.0
        else:
            residual = (p - q_all[j]).clamp_(min=0.0)
        total = float(residual.sum())
        # p == q leaves no residual, but then the guess is always kept: only rounding gets
        # here, and p itself is the right distribution for it
        dist = residual / total if total > 0.0 else p
        out.append(int(torch.multinomial(dist, 1, generator=generator)))
        return out
    out.append(int(torch.multinomial(p_all[k], 1, generator=generator)))
    return out


def row_generator(seed: int | None, step: int) -> torch.Generator | None:
    """The CPU generator of a seeded sequence's draws at output ``step`` (None unseeded: the
    default generator), so a seeded request repeats its tokens given the same proposals."""
    if seed is None:
        return None
    g = torch.Generator()
    g.manual_seed((seed * 1_000_003 + step * 7_919 + 17) & 0x7FFF_FFFF_FFFF_FFFF)
    return g


@dataclass
class VerifySeq:
    """One sequence of a verify step: its rows are ``len(draft_ids) + 1`` consecutive rows of
    the step's logits (a sequence with no proposal has one row, sampled as usual)."""

    params: SamplingParams
    output_token_ids: list[int]
    prompt_token_ids: list[int]
    seed: int | None
    draft_ids: list[int]
    draft_probs: torch.Tensor | None = None

    @property
    def num_rows(self) -> int:
        return len(self.draft_ids) + 1


@dataclass
class VerifiedToken:
    token_id: int
    logprob: float | None = None
    rank: int | None = None
    top: list[tuple[int, float]] = field(default_factory=list)


def _row_params(seqs: Sequence[VerifySeq]) -> list[RowParams]:
    rows: list[RowParams] = []
    for s in seqs:
        step = len(s.output_token_ids)
        for j in range(s.num_rows):
            rows.append(
                RowParams(
                    params=s.params,
                    output_token_ids=s.output_token_ids + s.draft_ids[:j],
                    prompt_token_ids=s.prompt_token_ids,
                    seed=s.seed,
                    step=step + j,
                )
            )
    return rows


def verify_step(
    logits: torch.Tensor,
    seqs: Sequence[VerifySeq],
    vocab_size: int,
    *,
    eos_token_ids: Sequence[int] = (),
    grammar: tuple[torch.Tensor, torch.Tensor | None] | None = None,
) -> list[list[VerifiedToken]]:
    """The tokens each of ``seqs`` emits, given ``logits`` [sum of their rows, V] (rows in
    order). ``grammar`` is (masks, rows) of the rows a grammar constrains (rows None: every
    row). Logprobs are filled for sequences that ask for them."""
    total = sum(s.num_rows for s in seqs)
    if logits.dim() != 2 or logits.shape[0] != total:
        raise ValueError(
            f"logits: expected {total} rows (one per proposed token plus one per "
            f"sequence), got shape {tuple(logits.shape)}"
        )
    raw = logits.float()
    processed = raw
    batch = SamplingBatch.build(
        _row_params(seqs), vocab_size, raw.device, eos_token_ids=eos_token_ids
    )
    if batch.edits.num_entries or grammar is not None:
        processed = raw.clone()
        apply_logit_edits(processed, batch.edits)
        if grammar is not None:
            apply_token_bitmask(processed, *grammar)
    argmax = processed.argmax(dim=-1).tolist()
    probs = _sampling_probs(processed, batch) if not batch.all_greedy else None
    emitted: list[list[int]] = []
    row = 0
    for s in seqs:
        n = s.num_rows
        if s.params.greedy:
            tokens = accept_greedy(argmax[row : row + n], s.draft_ids)
        else:
            assert probs is not None  # built when any row samples
            tokens = rejection_sample(
                probs[row : row + n],
                s.draft_ids,
                s.draft_probs,
                row_generator(s.seed, len(s.output_token_ids)),
            )
        emitted.append(tokens)
        row += n
    return _with_logprobs(raw, seqs, emitted)


def _sampling_probs(processed: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Each row's distribution after temperature, top-k, top-p and min-p (greedy rows: their
    scores at temperature 1, never read)."""
    scores = processed * batch.inv_temperature[:, None]
    for which, values, fn in (
        (batch.top_k_rows, batch.top_k, None),
        (batch.top_p_rows, batch.top_p, apply_top_p),
        (batch.min_p_rows, batch.min_p, apply_min_p),
    ):
        if not which:
            continue
        idx = torch.tensor(which, dtype=torch.int64, device=scores.device)
        if fn is None:
            scores[idx] = apply_top_k(scores[idx], values[idx], batch.max_top_k)
        else:
            scores[idx] = fn(scores[idx], values[idx])
    return torch.softmax(scores, dim=-1)


def _with_logprobs(
    raw: torch.Tensor, seqs: Sequence[VerifySeq], emitted: list[list[int]]
) -> list[list[VerifiedToken]]:
    out: list[list[VerifiedToken]] = []
    row = 0
    for s, tokens in zip(seqs, emitted):
        want = s.params.logprobs
        if want is None:
            out.append([VerifiedToken(t) for t in tokens])
        else:
            lps = torch.log_softmax(raw[row : row + len(tokens)], dim=-1)
            ids = torch.tensor(tokens, dtype=torch.int64, device=raw.device)
            chosen = lps.gather(1, ids[:, None])
            ranks = ((lps > chosen).sum(dim=-1) + 1).tolist()
            top = torch.topk(lps, want, dim=-1) if want else None
            toks = []
            for j, t in enumerate(tokens):
                tok = VerifiedToken(t, float(chosen[j, 0]), int(ranks[j]))
                if top is not None:
                    tok.top = list(zip(top.indices[j].tolist(), top.values[j].tolist()))
                toks.append(tok)
            out.append(toks)
        row += s.num_rows
    return out
