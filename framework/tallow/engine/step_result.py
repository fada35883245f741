"""What a launched step leaves behind: :class:`PendingStep` while its results are on the device,
:class:`StepResult` once :meth:`tallow.engine.model_runner.ModelRunner.collect` has read them
back (sampled tokens, prompt logprobs, pooled vectors, verified tokens, kept hidden states)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from .outputs import Logprob
from .sampling import StepRows
from .sampling.grammar import MaskFill
from .sampling.sampler import SamplerOutput
from .sampling.speculative import VerifiedToken
from .sequence import Sequence as EngineSequence

__all__ = ["PendingStep", "SampledToken", "StepResult", "verified_result"]


@dataclass
class SampledToken:
    token_id: int
    logprob: float | None = None
    rank: int | None = None
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class StepResult:
    #: seq_id → the token sampled for it this step
    sampled: dict[int, SampledToken] = field(default_factory=dict)
    #: seq_id → logprobs of the prompt positions computed this step (first prompt token: None)
    prompt_logprobs: dict[int, list[dict[int, Logprob] | None]] = field(default_factory=dict)
    #: seq_id → the pooled hidden states of an embedding request (float32, on the host)
    pooled: dict[int, torch.Tensor] = field(default_factory=dict)
    #: seq_id → the tokens a verify step emits after the one in ``sampled`` (speculative
    #: decoding; absent for sequences that emit one)
    accepted: dict[int, list["SampledToken"]] = field(default_factory=dict)
    #: seq_id → (first position, the target's hidden states at the positions the step
    #: computed and kept) when the runner keeps them (``keep_hidden``): every row of a
    #: prefill chunk, a verify step's rows up to its last accepted token
    hidden: dict[int, tuple[int, torch.Tensor]] = field(default_factory=dict)


def verified_result(
    targets: list[EngineSequence], verified: list[list[VerifiedToken]], result: StepResult
) -> StepResult:
    """A verify step's tokens into ``result``: each target's first emitted token in
    ``sampled``, the others in ``accepted``."""
    for seq, tokens in zip(targets, verified, strict=True):
        emitted = [SampledToken(t.token_id, t.logprob, t.rank, t.top) for t in tokens]
        result.sampled[seq.seq_id] = emitted[0]
        if len(emitted) > 1:
            result.accepted[seq.seq_id] = emitted[1:]
    return result


@dataclass
class PendingStep:
    """A launched step whose results are still on the device."""

    result: StepResult = field(default_factory=StepResult)
    #: the sequences sampled, in the order of the rows of ``token_ids``
    targets: list[EngineSequence] = field(default_factory=list)
    #: how ``targets`` are sampled, decided when the step is launched
    sampled_rows: StepRows = StepRows(all_argmax=True, any_grammar=False)
    token_ids: torch.Tensor | None = None
    sampled: SamplerOutput | None = None
    #: a pinned host copy of ``token_ids``, queued right behind the sampling (CUDA only)
    host_token_ids: torch.Tensor | None = None
    #: recorded after the step's last queued work (CUDA only; on a CPU work is synchronous)
    done: torch.cuda.Event | None = None
    #: embedding requests pooled by the step, in the order of the rows of ``pooled``
    pool_targets: list[EngineSequence] = field(default_factory=list)
    pooled: torch.Tensor | None = None
    host_pooled: torch.Tensor | None = None
    #: the logits of a step with grammar-constrained rows, kept until the grammars have seen
    #: the tokens of the step before (:meth:`ModelRunner.sample_constrained` samples them)
    logits: torch.Tensor | None = None
    #: the masks of those rows being filled on the grammar thread
    #: (:meth:`ModelRunner.start_masks`), and the rows of ``targets`` they belong to
    mask_fill: MaskFill | Literal[False] | None = None
    mask_rows: list[int] = field(default_factory=list)
    #: a verify step (speculative decoding): the tokens each target emits, in the order of
    #: ``targets``, decided at launch (the step was sampled on the host)
    verified: list[list[VerifiedToken]] | None = None

    def rows_by_seq(self) -> dict[int, int]:
        """seq_id → its row in ``token_ids``."""
        return {seq.seq_id: j for j, seq in enumerate(self.targets)}

    def is_done(self) -> bool:
        """Whether the device has finished the step (never waits)."""
        return self.done is None or bool(self.done.query())
