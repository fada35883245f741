"""Phi-3 against tallow's model conformance suite (a tiny random config, transformers on the
same weights, 20 greedy steps, a flat batch, the engine). The config's original context (8
tokens) is shorter than the suite's prompt, so LongRoPE's long factors rotate the prompt and
generation, and its short ones the short chunked sequence. More: test_parity.py."""

from __future__ import annotations

from typing import Any

from tallow.plugin.testing import ModelArchitectureConformance


class TestPhi3Conformance(ModelArchitectureConformance):
    distribution = "tallow-model-phi3"
    component = "Phi3ForCausalLM"
    steps = 20

    def hf_config(self) -> Any:
        import transformers

        return transformers.Phi3Config(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=128,
            rms_norm_eps=1e-5,
            max_position_embeddings=64,
            original_max_position_embeddings=8,
            partial_rotary_factor=0.75,
            rope_scaling={
                "type": "longrope",
                "original_max_position_embeddings": 8,
                "short_factor": [1.0 + 0.15 * i for i in range(6)],
                "long_factor": [1.5 + 0.9 * i for i in range(6)],
            },
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=None,
        )
