"""``speculative.method: draft``: a smaller model of the same tokenizer guesses the next tokens.

The speculator is a built-in (registered by :mod:`tallow.builtins` like any plugin's). The
engine builds it with ``cls(config)`` and hands it the target's device, registries and
tokenizer through :meth:`DraftSpeculator.attach`, where the draft model is built by the
engine's own builder (:mod:`tallow.engine.draft_runner`) and its tokenizer checked against the
target's.

Each :meth:`DraftSpeculator.propose` brings the completion's draft sequence up to its tokens
(rolling back what the target rejected, feeding what the draft has not seen) and decodes
``k`` tokens with the draft: greedily when the request is greedy, else drawn at the request's
temperature, with the draft's distribution at each position returned as the proposal's
``probs`` so that the engine's rejection sampling keeps the output distribution exactly the
target's. The draft's other sampling settings (top-k, top-p, penalties) are not applied: any
proposer distribution is exact under rejection sampling, only the acceptance differs.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from tallow.plugin import Proposal, SpeculationContext, Speculator, SpeculatorHost

from .draft_runner import DraftRunner, build_draft

__all__ = ["DraftSpeculator"]


class DraftSpeculator(Speculator):
    """``draft``: proposals of a draft model (``speculative.draft_model``)."""

    name = "draft"

    def __init__(self, config: Any = None) -> None:
        super().__init__(config)
        self.draft: DraftRunner | None = None
        #: columns of the target's logits, which each row of ``probs`` must have
        self.vocab_size = 0
        self._generator: torch.Generator | None = None

    @classmethod
    def validate(cls, config: Any) -> list[str]:
        spec = getattr(config, "speculative", None)
        if spec is None or not spec.draft_model:
            return ["speculative.draft_model is not set (the draft model's source)"]
        return []

    def attach(self, host: SpeculatorHost) -> None:
        config = self.config
        built = build_draft(config, host)
        scheduler = config.scheduler
        chunk = scheduler.max_num_batched_tokens
        if scheduler.prefill_chunk_size:
            chunk = min(chunk, scheduler.prefill_chunk_size)
        self.draft = DraftRunner(built, chunk)
        self.vocab_size = host.vocab_size
        self._generator = torch.Generator(device=host.device).manual_seed(int(config.model.seed))

    def propose(self, token_ids: Sequence[int], k: int, context: SpeculationContext) -> Proposal:
        got = self.propose_batch([(token_ids, k, context)])[0]
        return got if isinstance(got, Proposal) else Proposal(got)

    @torch.inference_mode()
    def propose_batch(
        self, requests: Sequence[tuple[Sequence[int], int, SpeculationContext]]
    ) -> list[Proposal | list[int]]:
        draft = self.draft
        if draft is None:
            raise RuntimeError("the draft speculator proposes only once attach() built its model")
        out: list[Proposal | list[int]] = [Proposal([]) for _ in requests]
        asked: list[tuple[int, tuple[str, int], int, float]] = []  # (request, key, k, temp)
        syncs = []
        for i, (token_ids, k, context) in enumerate(requests):
            # the last guess is never fed, so k guesses need positions up to len + k - 2
            k = min(k, draft.max_model_len - len(token_ids) + 1)
            if k < 1 or not token_ids:
                continue
            key = (context.request_id, context.index)
            asked.append((i, key, k, context.temperature))
            syncs.append((key, token_ids, k - 1))
        # requests the draft's pool cannot hold propose nothing: a plain decode step for them
        live = [(a, row) for a, row in zip(asked, draft.sync(syncs)) if row is not None]
        tokens: dict[int, list[int]] = {a[0]: [] for a, _ in live}
        probs: dict[int, list[torch.Tensor]] = {a[0]: [] for a, _ in live}
        step = 0
        while live:
            chosen, dists = self._choose(
                torch.stack([row for _, row in live]), [a[3] for a, _ in live]
            )
            guesses = []
            for (a, _), token, p in zip(live, chosen, dists):
                tokens[a[0]].append(token)
                if p is not None:
                    probs[a[0]].append(p)
                if step + 1 < a[2]:
                    guesses.append((a, token))
            step += 1
            if not guesses:
                break
            rows = draft.extend([(a[1], token) for a, token in guesses])
            live = [(a, rows[j]) for j, (a, _) in enumerate(guesses)]
        for i, guessed in tokens.items():
            out[i] = Proposal(guessed, torch.stack(probs[i]) if probs[i] else None)
        return out

    def _choose(
        self, logits: torch.Tensor, temperatures: list[float]
    ) -> tuple[list[int], list[torch.Tensor | None]]:
        """The next guess of each row of the draft's ``logits`` ([rows, vocab]) over the ids
        both models have: the argmax where the temperature is 0, else a draw at that
        temperature, returned with the distribution it was drawn from, widened to the
        target's vocabulary (None for greedy rows)."""
        width = min(self.vocab_size, logits.shape[-1])
        scores = logits[:, :width]
        tokens = scores.argmax(dim=-1)
        dists: list[torch.Tensor | None] = [None] * len(temperatures)
        sampled = [j for j, t in enumerate(temperatures) if t > 0.0]
        if sampled:
            rows = torch.tensor(sampled, dtype=torch.int64, device=logits.device)
            temps = torch.tensor(
                [temperatures[j] for j in sampled], dtype=scores.dtype, device=logits.device
            )
            probs = torch.softmax(scores.index_select(0, rows) / temps[:, None], dim=-1)
            drawn = torch.multinomial(probs, 1, generator=self._generator).squeeze(1)
            tokens.index_copy_(0, rows, drawn)
            if width < self.vocab_size:
                probs = torch.nn.functional.pad(probs, (0, self.vocab_size - width))
            for r, j in enumerate(sampled):
                dists[j] = probs[r]
        return tokens.tolist(), dists

    def finished(self, request_id: str, index: int) -> None:
        if self.draft is not None:
            self.draft.free(request_id, index)
