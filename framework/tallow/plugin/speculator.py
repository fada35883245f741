"""The speculator contract: cheap guesses of a sequence's next tokens, checked by the target.

Speculative decoding makes several tokens per forward of the target model when a cheap guess is
right. Each decode step a :class:`Speculator` proposes up to ``k`` tokens for a sequence; the
engine computes the target's logits at the sequence's last token and at every proposed one in
*one* step, keeps the longest prefix of the proposal the target agrees with (greedy: the
argmax; sampling: rejection sampling, so the output distribution is exactly the target's) and
adds the target's own token after it. A wrong guess costs compute, never correctness.

A speculator is registered through ``tallow_register_speculators`` as a lazy
``"module:Class"`` target; the engine builds the one ``speculative.method`` names with
``cls(config)`` and calls :meth:`Speculator.propose` on the engine thread before each decode
step. No torch import is needed here: proposals are plain token ids, and ``probs`` (a draft
model's distribution) is a tensor only for speculators that have one.

A speculator that runs a model of its own (a draft model) is handed the engine's device, plugin
registries and tokenizer through :meth:`Speculator.attach` once the model is built, before
the first proposal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Sequence

from tallow.types import Component

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["Proposal", "Speculator", "SpeculationContext", "SpeculatorHost"]


@dataclass
class Proposal:
    """Up to ``k`` proposed next tokens of one sequence.

    ``probs`` is the proposer's distribution at each proposed position (``[len(token_ids),
    vocab]`` float, rows summing to 1), for a proposer that samples its guesses (a draft model
    at temperature > 0); None means each token was chosen deterministically (prompt lookup, a
    greedy draft), which rejection sampling treats as a distribution with all its mass on the
    token.
    """

    token_ids: list[int]
    probs: "torch.Tensor | None" = None

    def __post_init__(self) -> None:
        self.token_ids = list(self.token_ids)
        for t in self.token_ids:
            if isinstance(t, bool) or not isinstance(t, int) or t < 0:
                raise ValueError(
                    f"Proposal.token_ids: expected token ids (integers >= 0), got {t!r}"
                )
        if self.probs is not None and (
            self.probs.dim() != 2 or self.probs.shape[0] != len(self.token_ids)
        ):
            raise ValueError(
                f"Proposal.probs: expected shape ({len(self.token_ids)}, vocab), "
                f"got {tuple(self.probs.shape)}"
            )


@dataclass(frozen=True)
class SpeculationContext:
    """What the engine tells a speculator about the sequence it asks a proposal for.

    ``request_id`` and ``index`` identify the completion (a speculator that keeps state per
    sequence keys it by them and drops it in :meth:`Speculator.finished`);
    ``num_prompt_tokens`` says where the prompt ends in the token ids; ``temperature`` is 0 for
    greedy decoding.

    ``hidden`` is filled only for speculators whose ``needs_hidden_states`` is true (MTP/EAGLE
    heads; None for the others): the target's hidden states (what its LM head reads, after
    the final norm; ``[n, hidden_size]`` on the engine's device) at positions ``hidden_start
    .. hidden_start + n - 1`` of the sequence, every position the target computed and kept
    since the sequence's previous proposal (the whole prompt before the first). Its last row
    is the position of the last accepted token, whose successor (the target's own token) is
    the sequence's last token. Rows are handed over once; None when there are none.
    """

    request_id: str
    index: int
    num_prompt_tokens: int
    temperature: float = 0.0
    hidden: "torch.Tensor | None" = None
    hidden_start: int = 0


@dataclass(frozen=True)
class SpeculatorHost:
    """What the engine hands :meth:`Speculator.attach`: enough to build and run a model of
    the speculator's own beside the target.

    ``device`` and ``dtype`` are the target's; ``registries`` the engine's plugin registries
    (a :class:`tallow.plugin.Registries`: weight formats, models, attention backends, KV
    codecs), from which a draft model is loaded the way the target was; ``tokenizer`` the
    target's (a ``tallow.engine.tokenizer.Tokenizer``: ``get_vocab()``, ``vocab_size``,
    ``eos_token_ids``); ``vocab_size`` the width of the target's logits, which a proposal's
    ``probs`` must have; ``model_name`` names the target in messages; ``max_model_len`` is
    the longest sequence the engine accepts; ``max_num_seqs`` the most it runs at once.
    ``target`` is the target's model runner (a ``tallow.engine.model_runner.ModelRunner``:
    ``model``, ``backend``, ``num_blocks``, ``block_size``), for heads that run on the
    target's own weights (MTP); None where the engine does not give it.
    """

    device: "torch.device"
    dtype: "torch.dtype"
    registries: Any  # a tallow.plugin.Registries
    tokenizer: Any  # a tallow.engine.tokenizer.Tokenizer (the engine sits above the contract)
    vocab_size: int
    model_name: str
    max_model_len: int
    max_num_seqs: int
    target: Any = None  # a tallow.engine.model_runner.ModelRunner (the engine sits above)


class Speculator(Component):
    """Proposes tokens for the target model to verify (see the module docstring).

    Subclasses set ``name`` and implement :meth:`propose`. They are built once per engine with
    ``cls(config)`` (the :class:`tallow.config.TallowConfig`; read plugin settings with
    :func:`tallow.plugin.plugin_settings`) and called on the engine thread only, so they need
    no lock. ``validate(config)`` lists reasons the speculator cannot serve ``config``.
    """

    name: ClassVar[str] = ""
    #: whether :meth:`propose` wants the target's last hidden state in its context (MTP/EAGLE
    #: heads); the engine keeps it only for speculators that ask
    needs_hidden_states: ClassVar[bool] = False

    def __init__(self, config: Any = None) -> None:
        # Any: a tallow.config.TallowConfig or None (kept for subclasses' settings)
        self.config = config

    def propose(
        self, token_ids: Sequence[int], k: int, context: SpeculationContext
    ) -> Proposal | list[int]:
        """Up to ``k`` (>= 1) tokens to follow ``token_ids`` (the sequence's prompt and its
        outputs so far; read it, never change it). Fewer, or none, when there is no good
        guess: an empty proposal makes the step a plain decode step for this sequence."""
        raise NotImplementedError

    def propose_batch(
        self, requests: Sequence[tuple[Sequence[int], int, SpeculationContext]]
    ) -> list[Proposal | list[int]]:
        """Proposals for several sequences at once, one per ``(token_ids, k, context)`` of
        ``requests``, in order: what :meth:`propose` returns for each. The engine asks it, when
        a speculator overrides it, for every decoding sequence before it plans a step (a
        proposal may then be cut to what the step allows); a draft model computes all of them
        in one forward per position. The default asks :meth:`propose` for each."""
        return [self.propose(token_ids, k, context) for token_ids, k, context in requests]

    def attach(self, host: SpeculatorHost) -> None:
        """Called once by the engine, after the target model is built and before the first
        :meth:`propose`: a speculator with a model of its own builds it here on
        ``host.device`` and checks that it can serve the target (a shared tokenizer, say),
        raising ValueError with the reason otherwise. The default keeps nothing."""

    def finished(self, request_id: str, index: int) -> None:
        """The completion ended (or was preempted and will start over): drop what is kept for
        it. The default keeps nothing."""
