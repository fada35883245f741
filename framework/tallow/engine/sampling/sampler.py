"""The draw: one token per row of logits, the same code on CPU and GPU.

Per row, in this order: logit bias → min_tokens mask of EOS/stop tokens → repetition penalty
(prompt+output tokens; positive logits divided, negative multiplied) → frequency/presence
penalties (output tokens, OpenAI semantics) → the grammar's token mask (structured outputs:
disallowed tokens -inf) → greedy rows take the argmax → temperature → top-k → top-p → min-p →
sample.

Sampling is the Gumbel-max trick with noise hashed from ``(seed, step, token index)``
(``tallow.kernels.gumbel``): a seeded row samples the same token whatever the rest of the batch
is, on any device. Unseeded rows get a fresh random seed per step.

Reported logprobs are those of the model's raw distribution (log_softmax of the logits before
any processing), like vLLM v1 by default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Protocol

import torch

from tallow.kernels.host import device_tensor
from tallow.kernels.sampling import apply_logit_edits, gumbel_argmax, gumbel_noise
from tallow.kernels.token_bitmask import apply_token_bitmask

from .batch import SamplingBatch
from .filters import apply_min_p, apply_top_k, apply_top_p
from .params import SamplingParams


def takes_argmax(params: SamplingParams, num_output_tokens: int) -> bool:
    """Whether the next token of a sequence with ``params`` and ``num_output_tokens`` outputs
    is simply the argmax of its logits: greedy, no logit edits, no logprobs, min_tokens
    reached. The engine skips building a :class:`SamplingBatch` for steps where every row
    does."""
    return params.argmax_only and num_output_tokens >= params.min_tokens


class SampledSequence(Protocol):
    """What :meth:`StepRows.of` reads of a sequence to sample."""

    params: SamplingParams
    num_output_tokens: int
    grammar: Any  # Any: a row's grammar state (GrammarState) or None, duck-typed here


@dataclass(frozen=True)
class StepRows:
    """How one step's rows are sampled, decided in one pass over them when the step is
    launched and read by every later stage of the step (the tensor-parallel broadcast, the
    draw)."""

    #: every row's token is the argmax of its logits (:func:`takes_argmax`), masked where a
    #: grammar constrains the row: the step needs no :class:`SamplingBatch`
    all_argmax: bool
    #: some row is constrained by a grammar (its mask waits for the grammar to catch up)
    any_grammar: bool
    #: each row's output count at launch: the index of the token it draws. The scheduler
    #: appends the step's own placeholders after the launch, and a step whose masks wait for
    #: its grammars is drawn after that, so the draw reads these rather than the count then.
    steps: tuple[int, ...] = ()

    @property
    def plain_argmax(self) -> bool:
        """The logits as they are decide every token (argmax, no mask), so each rank of a
        tensor-parallel group can take the tokens itself."""
        return self.all_argmax and not self.any_grammar

    @classmethod
    def of(cls, seqs: Iterable[SampledSequence]) -> "StepRows":
        all_argmax, any_grammar = True, False
        steps = []
        for seq in seqs:
            step = seq.num_output_tokens
            steps.append(step)
            all_argmax = all_argmax and takes_argmax(seq.params, step)
            any_grammar = any_grammar or seq.grammar is not None
        return cls(all_argmax=all_argmax, any_grammar=any_grammar, steps=tuple(steps))


@dataclass
class SamplerOutput:
    """``token_ids`` [N] int64. When any row asked for logprobs: ``logprobs`` [N] (of the
    sampled token, raw distribution), ``ranks`` [N] (1-based rank of the sampled token) and
    ``top_ids``/``top_logprobs`` [N, k] with k the largest ``logprobs`` asked for in the batch
    (k may be 0); otherwise these are None."""

    token_ids: torch.Tensor
    logprobs: torch.Tensor | None = None
    top_ids: torch.Tensor | None = None
    top_logprobs: torch.Tensor | None = None
    ranks: torch.Tensor | None = None


class Sampler:
    """Samples one token per row of logits. Stateless; one instance serves every step.

    On CUDA, rows without top-k/top-p/min-p go through the fused Triton Gumbel-argmax kernel
    (same tokens as the torch path); filtered rows and every row on CPU use torch.
    """

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> SamplerOutput:
        if logits.dim() != 2 or logits.shape != (batch.num_rows, batch.vocab_size):
            raise ValueError(
                f"logits: expected shape ({batch.num_rows}, {batch.vocab_size}), "
                f"got {tuple(logits.shape)}"
            )
        if logits.dtype != torch.float32:
            raise ValueError(f"logits: expected float32, got {logits.dtype}")
        raw = logits
        processed = logits
        if batch.edits.num_entries or batch.grammar_bitmask is not None:
            processed = logits.clone()
            apply_logit_edits(processed, batch.edits)
            if batch.grammar_bitmask is not None:
                apply_token_bitmask(processed, batch.grammar_bitmask, batch.grammar_rows)

        filtered = batch.filtered_rows
        if not filtered:
            token_ids = gumbel_argmax(
                processed, batch.inv_temperature, batch.greedy, batch.key1, batch.key2
            )
        else:
            token_ids = torch.empty(batch.num_rows, dtype=torch.int64, device=logits.device)
            skip = set(filtered)
            plain = [i for i in range(batch.num_rows) if i not in skip]
            if plain:
                idx = device_tensor(plain, torch.int64, logits.device)
                token_ids[idx] = gumbel_argmax(
                    processed[idx],
                    batch.inv_temperature[idx],
                    batch.greedy[idx],
                    batch.key1[idx],
                    batch.key2[idx],
                )
            token_ids[filtered] = self._sample_filtered(processed, batch, filtered)

        out = SamplerOutput(token_ids=token_ids)
        k = batch.max_num_logprobs
        if k is not None:
            self._fill_logprobs(out, raw, k)
        return out

    @staticmethod
    def _sample_filtered(
        processed: torch.Tensor, batch: SamplingBatch, rows: list[int]
    ) -> torch.Tensor:
        idx = device_tensor(rows, torch.int64, processed.device)
        scores = processed[idx] * batch.inv_temperature[idx, None]
        pos = {r: j for j, r in enumerate(rows)}

        def top_k(scores: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
            return apply_top_k(scores, k, batch.max_top_k)

        for which, values, fn in (
            (batch.top_k_rows, batch.top_k, top_k),
            (batch.top_p_rows, batch.top_p, apply_top_p),
            (batch.min_p_rows, batch.min_p, apply_min_p),
        ):
            if not which:
                continue
            sub = device_tensor([pos[r] for r in which], torch.int64, processed.device)
            orig = device_tensor(which, torch.int64, processed.device)
            scores[sub] = fn(scores[sub], values[orig])
        scores = scores + gumbel_noise(batch.key1[idx], batch.key2[idx], batch.vocab_size)
        return scores.argmax(dim=-1)

    @staticmethod
    def _fill_logprobs(out: SamplerOutput, raw: torch.Tensor, k: int) -> None:
        logprobs = torch.log_softmax(raw, dim=-1)
        chosen = logprobs.gather(1, out.token_ids.unsqueeze(1))
        out.logprobs = chosen.squeeze(1)
        out.ranks = (logprobs > chosen).sum(dim=-1) + 1
        top = torch.topk(logprobs, k, dim=-1)
        out.top_logprobs = top.values
        out.top_ids = top.indices
