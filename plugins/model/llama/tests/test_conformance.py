"""Each architecture of tallow-model-llama against tallow's model conformance suite (tiny random
configs, transformers on the same weights). RoPE variants, windows and tied heads:
test_parity.py."""

from __future__ import annotations

from typing import Any

from tallow.plugin.testing import ModelArchitectureConformance

SMALL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=128,
    rms_norm_eps=1e-5,
    max_position_embeddings=256,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)


class TestLlamaConformance(ModelArchitectureConformance):
    distribution = "tallow-model-llama"
    component = "LlamaForCausalLM"

    def hf_config(self) -> Any:
        import transformers

        return transformers.LlamaConfig(**SMALL, attention_bias=True)


class TestMistralConformance(ModelArchitectureConformance):
    distribution = "tallow-model-llama"
    component = "MistralForCausalLM"

    def hf_config(self) -> Any:
        import transformers

        return transformers.MistralConfig(**SMALL)


class TestQwen2Conformance(ModelArchitectureConformance):
    distribution = "tallow-model-llama"
    component = "Qwen2ForCausalLM"

    def hf_config(self) -> Any:
        import transformers

        return transformers.Qwen2Config(**SMALL, rope_theta=1000000.0)


class TestQwen3Conformance(ModelArchitectureConformance):
    distribution = "tallow-model-llama"
    component = "Qwen3ForCausalLM"

    def hf_config(self) -> Any:
        import transformers

        return transformers.Qwen3Config(**SMALL, head_dim=32)
