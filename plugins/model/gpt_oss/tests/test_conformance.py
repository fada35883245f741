"""gpt-oss against tallow's model conformance suite: transformers on the same tiny random
weights, 32 greedy tokens, with everything the architecture adds active: attention sinks,
alternating sliding-window (8 tokens: the prompt crosses it) and full layers, YaRN, the
softmax-over-selected-logits router with its bias and the clamped SwiGLU experts with biases;
and a prompt routed to every one of the 8 experts in every layer."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from tallow.layers import FusedMoE
from tallow.plugin.testing import ModelArchitectureConformance, PagedRunner

YARN = {
    "rope_type": "yarn",
    "factor": 4.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 32,
    "rope_theta": 150000.0,
}
SMALL = dict(
    hidden_size=64,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=128,
    num_local_experts=8,
    num_experts_per_tok=2,
    sliding_window=8,
    max_position_embeddings=128,
    rope_parameters=YARN,
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


class TestGptOssConformance(ModelArchitectureConformance):
    distribution = "tallow-model-gpt-oss"
    component = "GptOssForCausalLM"
    prompt: ClassVar[list[int]] = PROMPT
    steps: ClassVar[int] = 32

    def hf_config(self) -> Any:
        import transformers

        return transformers.GptOssConfig(**SMALL)

    def test_architecture_features_are_active(self, loaded: tuple[Any, set[str]]) -> None:
        """The parity above covers sinks, windows and YaRN only if the model has them."""
        model = loaded[0]
        layers = [layer.self_attn.attn for layer in model.model.layers]
        assert [a.layer.sliding_window for a in layers] == [8, None]
        assert all(a.sinks is not None and float(a.sinks.abs().sum()) > 0 for a in layers)
        rotary = model.model.rotary_emb
        assert rotary.attention_scaling != 1.0  # YaRN's attention factor

    def test_prompt_reaches_every_expert(self, loaded: tuple[Any, set[str]]) -> None:
        """The parity checks cover the experts only if each of them gets tokens: the prompt
        and the greedy steps reach all 8 in every layer."""
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
        for layer in range(layers):
            used = torch.unique(torch.cat([ids.flatten() for ids in chosen[layer::layers]]))
            assert used.numel() == 8, f"layer {layer} reaches only {used.tolist()} of 8 experts"
