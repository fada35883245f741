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

    @torch.inference_mode()
    def propose(self, token_ids: Sequence[int], k: int, context: SpeculationContext) -> Proposal:
        draft = self.draft
        if draft is None:
            raise RuntimeError("the draft speculator proposes only once attach() built its model")
        # the last guess is never fed, so k guesses need positions up to len + k - 2
        k = min(k, draft.max_model_len - len(token_ids) + 1)
        if k < 1 or not token_ids:
            return Proposal([])
        rid, index = context.request_id, context.index
        logits = draft.sync(rid, index, token_ids, room=k - 1)
        if logits is None:  # the draft's pool is full: a plain decode step this time
            return Proposal([])
        temperature = context.temperature
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        for j in range(k):
            token, probs = self._choose(logits, temperature)
            tokens.append(token)
            if probs is not None:
                rows.append(probs)
            if j + 1 < k:
                logits = draft.extend(rid, index, token)
        return Proposal(tokens, torch.stack(rows) if rows else None)

    def _choose(self, logits: torch.Tensor, temperature: float) -> tuple[int, torch.Tensor | None]:
        """The next guess from the draft's ``logits`` over the ids both models have, and
        the distribution it was drawn from, widened to the target's vocabulary (None:
        greedy)."""
        width = min(self.vocab_size, logits.shape[-1])
        scores = logits[:width]
        if temperature <= 0.0:
            return int(scores.argmax()), None
        probs = torch.softmax(scores / temperature, dim=-1)
        token = int(torch.multinomial(probs, 1, generator=self._generator))
        if width < self.vocab_size:
            probs = torch.nn.functional.pad(probs, (0, self.vocab_size - width))
        return token, probs

    def finished(self, request_id: str, index: int) -> None:
        if self.draft is not None:
            self.draft.free(request_id, index)
