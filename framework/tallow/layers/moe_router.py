"""Routers of mixture-of-experts layers: router logits → each token's experts and weights.

The variants the model families use (:class:`RouterSpec`):

- ``"softmax"``: softmax over all experts, the ``top_k`` largest (Mixtral, Qwen2/3-MoE),
  renormalised to sum to one when ``renormalize`` (Mixtral, Qwen3-MoE's ``norm_topk_prob``);
- ``"sigmoid"``: sigmoid scores; the choice adds a per-expert ``correction_bias`` (DeepSeek-V3,
  GLM-4.5's ``e_score_correction_bias``), the weights do not; with ``num_groups > 1`` only the
  ``topk_groups`` groups whose two best biased scores sum highest take part (grouped top-k;
  ``group_score="max"``: the groups of the highest single scores, DeepSeek-V2's
  group-limited greedy routing, which applies to ``"softmax"`` scores too);
- ``"softmax_selected"``: the ``top_k`` largest logits, then a softmax over those alone
  (gpt-oss).

``routed_scaling_factor`` multiplies every weight at the end (DeepSeek-V3: 2.5). Weights come
back in float32, ids as torch's topk gives them (int64: the kernels read them as they are, so a
decode step runs no conversion); everything is plain torch (topk and friends are CUDA-graph
safe), in as few kernels as each variant allows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tallow.kernels.moe import softmax_topk

SCORINGS = ("softmax", "sigmoid", "softmax_selected")


@dataclass(frozen=True)
class RouterSpec:
    """How a router turns logits into experts (see the module docstring)."""

    top_k: int
    scoring: str = "softmax"
    renormalize: bool = False
    num_groups: int = 1
    topk_groups: int = 1
    routed_scaling_factor: float = 1.0
    #: how a group of experts is scored for grouped top-k: "top2_sum" (DeepSeek-V3) or "max"
    group_score: str = "top2_sum"

    def __post_init__(self) -> None:
        if self.group_score not in ("top2_sum", "max"):
            raise ValueError(
                f"router group_score must be 'top2_sum' or 'max', got {self.group_score!r}"
            )
        if self.scoring not in SCORINGS:
            raise ValueError(
                f"router scoring must be one of {', '.join(SCORINGS)}, got {self.scoring!r}"
            )
        if self.top_k < 1:
            raise ValueError(f"router top_k must be positive, got {self.top_k}")
        if not 1 <= self.topk_groups <= self.num_groups:
            raise ValueError(
                f"router: topk_groups ({self.topk_groups}) must be between 1 and "
                f"num_groups ({self.num_groups})"
            )


def group_scores(choice: torch.Tensor, spec: RouterSpec) -> torch.Tensor:
    """Each token's score of each group of experts ``[T, num_groups]`` from ``choice``
    ``[T, E]``: the sum of its two best experts (DeepSeek-V3) or its best one
    (``group_score="max"``)."""
    tokens, experts = choice.shape
    if experts % spec.num_groups:
        raise ValueError(f"router: {experts} experts do not split into {spec.num_groups} groups")
    grouped = choice.view(tokens, spec.num_groups, experts // spec.num_groups)
    best = 1 if spec.group_score == "max" else min(2, grouped.shape[-1])
    return grouped.topk(best, dim=-1).values.sum(-1)


def group_mask(choice: torch.Tensor, spec: RouterSpec) -> torch.Tensor:
    """``choice`` with the experts outside each token's best ``topk_groups`` groups
    (:func:`group_scores`) at -inf."""
    tokens, experts = choice.shape
    scores = group_scores(choice, spec)
    keep = scores.topk(spec.topk_groups, dim=-1).indices
    mask = torch.zeros_like(scores, dtype=torch.bool).scatter_(1, keep, True)
    grouped = choice.view(tokens, spec.num_groups, experts // spec.num_groups)
    return grouped.masked_fill(~mask[..., None], float("-inf")).view(tokens, experts)


def expert_scores(
    logits: torch.Tensor, spec: RouterSpec, correction_bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """For a softmax or sigmoid router, (scores, choice) ``[T, E]`` float32: the scores the
    weights are taken from, and what experts (and groups) are ranked by: the scores plus the
    correction bias, if any."""
    scores = (
        logits.softmax(-1, dtype=torch.float32)
        if spec.scoring == "softmax"
        else logits.float().sigmoid()
    )
    return scores, scores if correction_bias is None else scores + correction_bias.float()


def select_experts(
    logits: torch.Tensor, spec: RouterSpec, correction_bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``logits [T, E]`` → (weights float32 ``[T, top_k]``, expert ids int64 ``[T, top_k]``)."""
    if logits.dim() != 2 or logits.shape[1] < spec.top_k:
        raise ValueError(
            f"router: logits must be [tokens, experts >= top_k={spec.top_k}], "
            f"got {tuple(logits.shape)}"
        )
    if correction_bias is not None and spec.scoring != "sigmoid":
        raise ValueError("router: a correction bias goes with sigmoid scoring")
    if spec.scoring == "softmax" and spec.num_groups == 1:  # the common router: one kernel
        return softmax_topk(logits, spec.top_k, spec.renormalize, spec.routed_scaling_factor)
    if spec.scoring == "softmax_selected":
        values, ids = logits.float().topk(spec.top_k, dim=-1)
        weights = values.softmax(-1)
    else:
        scores, choice = expert_scores(logits, spec, correction_bias)
        if spec.num_groups > 1:
            choice = group_mask(choice, spec)
        values, ids = choice.topk(spec.top_k, dim=-1)
        # the choice is the scores themselves unless a bias or the group mask changed it
        weights = values if choice is scores else scores.gather(1, ids)
        if spec.renormalize:
            # softmax weights are positive; sigmoid ones may all but vanish
            total = weights.sum(-1, keepdim=True)
            weights = weights / (total if spec.scoring == "softmax" else total.clamp_min(1e-20))
    if spec.routed_scaling_factor != 1.0:
        weights = weights * spec.routed_scaling_factor
    return weights, ids
