"""GLM-4 against tallow's model conformance suite (a tiny random config, transformers on the
same weights, 20 greedy steps, a flat batch, the engine). More configs and GGUF: test_glm4.py."""

from __future__ import annotations

from typing import Any

from tallow.plugin.testing import ModelArchitectureConformance


class TestGlm4Conformance(ModelArchitectureConformance):
    distribution = "tallow-model-glm4"
    component = "Glm4ForCausalLM"
    steps = 20

    def hf_config(self) -> Any:
        import transformers

        return transformers.Glm4Config(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            partial_rotary_factor=0.5,
            vocab_size=128,
            rms_norm_eps=1e-5,
            max_position_embeddings=256,
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=None,
        )
