"""Mixtral against tallow's model conformance suite: transformers on the same tiny random
weights (saved with the ``block_sparse_moe`` names), 32 greedy tokens, and a prompt routed to
every one of the 8 experts in every layer."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from tallow.layers import FusedMoE
from tallow.plugin.testing import ModelArchitectureConformance, PagedRunner

SMALL = dict(
    hidden_size=64,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=128,
    num_local_experts=8,
    num_experts_per_tok=2,
    rms_norm_eps=1e-5,
    max_position_embeddings=256,
    sliding_window=None,
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


class TestMixtralConformance(ModelArchitectureConformance):
    distribution = "tallow-model-mixtral"
    component = "MixtralForCausalLM"
    prompt: ClassVar[list[int]] = PROMPT
    steps: ClassVar[int] = 32

    def hf_config(self) -> Any:
        import transformers

        return transformers.MixtralConfig(**SMALL)

    def test_prompt_reaches_every_expert(self, loaded: tuple[Any, set[str]]) -> None:
        """The parity checks cover the experts only if each of them gets tokens: the prompt
        and the greedy steps (what the parity test compares) reach all 8 in every layer."""
        model = loaded[0]
        chosen: list[torch.Tensor] = []
        hooks = [
            m.experts.register_forward_hook(lambda mod, args, out: chosen.append(args[2]))
            for m in model.modules()
            if isinstance(m, FusedMoE)
        ]
        try:
            PagedRunner(model).greedy(0, self.prompt, self.steps)
        finally:
            for hook in hooks:
                hook.remove()
        layers = SMALL["num_hidden_layers"]
        assert len(chosen) == layers * (1 + self.steps), "not every layer ran its MoE block"
        for layer in range(layers):  # chosen: the prompt's layers, then each step's
            used = torch.unique(torch.cat([ids.flatten() for ids in chosen[layer::layers]]))
            assert used.numel() == 8, f"layer {layer} reaches only {used.tolist()} of 8 experts"
