"""Llama 4 (text) against tallow's model conformance suite: transformers on the same tiny
random weights, saved and read back by the registered plugin, 32 greedy tokens past two
attention chunks."""

from __future__ import annotations

from typing import Any, ClassVar

from tallow.plugin.testing import ModelArchitectureConformance

SMALL = dict(
    hidden_size=64,
    intermediate_size=48,
    intermediate_size_mlp=96,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=128,
    rms_norm_eps=1e-5,
    max_position_embeddings=256,
    num_local_experts=4,
    num_experts_per_tok=1,
    interleave_moe_layer_step=2,
    attention_chunk_size=16,
    floor_scale=8,
    attn_scale=0.5,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
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


class TestLlama4Conformance(ModelArchitectureConformance):
    distribution = "tallow-model-llama4"
    component = "Llama4ForCausalLM"
    prompt: ClassVar[list[int]] = PROMPT
    steps: ClassVar[int] = 32

    def hf_config(self) -> Any:
        import transformers

        return transformers.Llama4TextConfig(**SMALL)
