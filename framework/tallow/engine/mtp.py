"""``speculative.method: mtp``: the multi-token prediction layers a checkpoint ships (DeepSeek-V3,
GLM-4.5, Qwen3-Next) guess the next tokens from the target's own hidden states.

The speculator is a built-in (registered by :mod:`tallow.builtins`). The engine builds the
target with its MTP head (``BuildContext.mtp``, from ``speculative.method``) and hands the
speculator its model runner through :meth:`MTPSpeculator.attach`, which takes the head from
``model.mtp_head()`` and gives it a paged KV cache of its own (:mod:`tallow.engine.mtp_runner`).

Each proposal feeds the head the target's hidden rows kept since the sequence's last proposal
(:class:`~tallow.plugin.SpeculationContext` ``hidden``; the speculator's
``needs_hidden_states`` makes the engine keep them) with the tokens that follow them, which
yields the first guess; each further guess runs the head once more on its own output hidden
state and the token it just guessed. Guesses are the argmax at temperature 0, else drawn at the
request's temperature with the head's distribution as the proposal's ``probs`` (the rejection
sampling keeps the output distribution exactly the target's), as for a draft model.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from tallow.layers import MTPHead
from tallow.plugin import Proposal, SpeculationContext, SpeculatorHost

from .draft_model import DraftSpeculator
from .mtp_runner import MTPRunner

__all__ = ["MTPSpeculator"]


class MTPSpeculator(DraftSpeculator):
    """``mtp``: proposals of the target's multi-token prediction head."""

    name = "mtp"
    needs_hidden_states = True

    def __init__(self, config: Any = None) -> None:
        super().__init__(config)
        self.mtp: MTPRunner | None = None

    @classmethod
    def validate(cls, config: Any) -> list[str]:
        return []

    def attach(self, host: SpeculatorHost) -> None:
        target = host.target
        model = getattr(target, "model", None)
        finder = getattr(model, "mtp_head", None)
        head = finder() if finder is not None else None
        if not isinstance(head, MTPHead):
            raise ValueError(
                f"speculative.method mtp: {host.model_name} ({type(model).__name__}) has no "
                "multi-token prediction layers: its checkpoint ships none, or its model "
                "plugin does not load them (DeepSeek-V3 / GLM-4.5 style "
                "num_nextn_predict_layers, Qwen3-Next mtp.*)"
            )
        config = self.config
        chunk = config.scheduler.max_num_batched_tokens
        if config.scheduler.prefill_chunk_size:
            chunk = min(chunk, config.scheduler.prefill_chunk_size)
        self.mtp = MTPRunner(head, target, chunk)
        self.vocab_size = host.vocab_size
        self._generator = torch.Generator(device=host.device).manual_seed(int(config.model.seed))

    @torch.inference_mode()
    def propose_batch(
        self, requests: Sequence[tuple[Sequence[int], int, SpeculationContext]]
    ) -> list[Proposal | list[int]]:
        mtp = self.mtp
        if mtp is None:
            raise RuntimeError("the mtp speculator proposes only once attach() took its head")
        out: list[Proposal | list[int]] = [Proposal([]) for _ in requests]
        asked: list[tuple[int, tuple[str, int], int, float]] = []  # (request, key, k, temp)
        syncs = []
        for i, (token_ids, k, context) in enumerate(requests):
            # guess j (from 1) is predicted at position len - 2 + j: the last guess is
            # never fed, so k guesses need head positions up to len + k - 3
            k = min(k, mtp.max_model_len - len(token_ids) + 2)
            key = (context.request_id, context.index)
            asked.append((i, key, k, context.temperature))
            # the rows are fed even when no guess is wanted: the head keeps in step
            syncs.append((key, token_ids, context.hidden, context.hidden_start, max(0, k - 1)))
        live = [
            (a, got[0], got[1])
            for a, got in zip(asked, mtp.sync(syncs))
            if got is not None and a[2] >= 1
        ]
        tokens: dict[int, list[int]] = {a[0]: [] for a, *_ in live}
        probs: dict[int, list[torch.Tensor]] = {a[0]: [] for a, *_ in live}
        step = 0
        while live:
            chosen, dists = self._choose(
                torch.stack([logits for _, logits, _ in live]), [a[3] for a, *_ in live]
            )
            guesses = []
            for (a, _, hidden), token, p in zip(live, chosen, dists):
                tokens[a[0]].append(token)
                if p is not None:
                    probs[a[0]].append(p)
                if step + 1 < a[2]:
                    guesses.append((a, token, hidden))
            step += 1
            if not guesses:
                break
            logits, hiddens = mtp.extend([(a[1], token, h) for a, token, h in guesses])
            live = [(a, logits[j], hiddens[j]) for j, (a, _, _) in enumerate(guesses)]
        for i, guessed in tokens.items():
            out[i] = Proposal(guessed, torch.stack(probs[i]) if probs[i] else None)
        return out

    def finished(self, request_id: str, index: int) -> None:
        if self.mtp is not None:
            self.mtp.free(request_id, index)
