"""Granite against tallow's model conformance suite (a tiny random config with its four
multipliers, transformers on the same weights, 20 greedy steps, a flat batch, the engine). More
configs and GGUF: test_granite.py."""

from __future__ import annotations

from typing import Any

from tallow.plugin.testing import ModelArchitectureConformance


class TestGraniteConformance(ModelArchitectureConformance):
    distribution = "tallow-model-granite"
    component = "GraniteForCausalLM"
    steps = 20
    weight_std = 0.15  # a stream dominated by the input embedding would only echo it

    def hf_config(self) -> Any:
        import transformers

        return transformers.GraniteConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=128,
            rms_norm_eps=1e-5,
            max_position_embeddings=256,
            embedding_multiplier=2.0,
            residual_multiplier=1.5,
            attention_multiplier=0.09,
            logits_scaling=4.0,
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=None,
        )
