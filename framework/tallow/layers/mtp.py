"""The multi-token prediction (MTP) head a checkpoint may ship beside its decoder (DeepSeek-V3,
GLM-4.5, Qwen3-Next), as ``speculative.method: mtp`` runs it.

One MTP step at position ``p`` reads the target's hidden state at ``p`` (or, for later guesses,
the head's own output at ``p``) and the token at ``p + 1``, runs one decoder layer of its own
(with a paged KV cache of its own, which the engine binds like a model's) and predicts the token
at ``p + 2``.

A model plugin builds its head when ``build.mtp`` is set and returns it from
``CausalLM.mtp_head()``; the head is not a submodule of the model (the model's KV cache and
forward know nothing of it) but lives on the same device, and the model's ``load_weights``
hands the head its checkpoint tensors (:meth:`CausalLM.load_weights` on the head's own name
map). The engine calls :meth:`MTPHead.feed_hidden` with one hidden row per input token
before each ``forward(input_ids, positions)``, whose output rows are what the next step takes
as its hidden input; ``compute_logits`` turns them into logits.
"""

from __future__ import annotations

import torch

from .causal_lm import CausalLM

__all__ = ["MTPHead"]


class MTPHead(CausalLM):
    """A multi-token prediction head (see the module docstring). Subclasses build their
    modules, implement ``forward`` reading :meth:`hidden_input`, and
    ``compute_logits``."""

    tasks = ("generate",)
    _hidden: torch.Tensor | None = None

    def feed_hidden(self, hidden: torch.Tensor | None) -> None:
        """The hidden rows (``[T, hidden_size]``, one per input token, in order) that the
        next ``forward`` combines with its tokens (None lets them go)."""
        self._hidden = hidden

    def hidden_input(self, num_tokens: int) -> torch.Tensor:
        """The rows :meth:`feed_hidden` gave, checked against the forward's ``num_tokens``."""
        hidden = self._hidden
        if hidden is None or hidden.shape[0] != num_tokens:
            got = None if hidden is None else tuple(hidden.shape)
            raise RuntimeError(
                f"{type(self).__name__}: a forward of {num_tokens} tokens needs as many hidden "
                f"rows from feed_hidden(), got {got}"
            )
        return hidden
