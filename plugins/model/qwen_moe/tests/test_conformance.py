"""Qwen3-MoE and Qwen2-MoE against tallow's model conformance suite: transformers on the same
tiny random weights, 32 greedy tokens, a prompt long enough that most experts are hit."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from tallow.plugin.testing import ModelArchitectureConformance
from tallow.plugin.testing.model_parity import expert_choices

SMALL = dict(
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=128,
    num_experts=8,
    num_experts_per_tok=2,
    rms_norm_eps=1e-5,
    max_position_embeddings=256,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
# 30 tokens: with the 32 greedy steps still inside the engine test's 64 positions
PROMPT = [
    3,
    17,
    50,
    9,
    64,
    28,
    5,
    77,
    31,
    20,
    1,
    42,
    99,
    120,
    7,
    63,
    88,
    14,
    101,
    36,
    55,
    111,
    24,
    92,
    70,
    12,
    127,
    46,
    83,
    2,
]


class ReachesTheExperts:
    """The parity checks mean something for the experts only if the prompt is routed to most
    of them."""

    prompt: ClassVar[list[int]]

    def test_prompt_reaches_most_experts(self, loaded: tuple[Any, set[str]]) -> None:
        chosen = expert_choices(loaded[0], self.prompt)
        assert chosen, "no MoE block ran"
        for ids in chosen:  # every MoE layer, on the prompt's real hidden states
            used = torch.unique(ids).numel()
            assert used >= 6, f"the prompt reaches only {used} of 8 experts"


class TestQwen3MoeConformance(ReachesTheExperts, ModelArchitectureConformance):
    distribution = "tallow-model-qwen-moe"
    component = "Qwen3MoeForCausalLM"
    prompt: ClassVar[list[int]] = PROMPT
    steps: ClassVar[int] = 32

    def hf_config(self) -> Any:
        import transformers

        return transformers.Qwen3MoeConfig(**SMALL, head_dim=32, norm_topk_prob=True)


class TestQwen2MoeConformance(ReachesTheExperts, ModelArchitectureConformance):
    distribution = "tallow-model-qwen-moe"
    component = "Qwen2MoeForCausalLM"
    prompt: ClassVar[list[int]] = PROMPT
    steps: ClassVar[int] = 32

    def hf_config(self) -> Any:
        import transformers

        return transformers.Qwen2MoeConfig(
            **SMALL, shared_expert_intermediate_size=48, norm_topk_prob=False
        )
