"""Each Gemma architecture (Gemma 4 with per-layer inputs and a KV-shared layer) against tallow's model conformance suite (tiny random configs,
transformers on the same weights; the 12-token prompt outruns the 5-token window). Softcaps,
the attention scale, local RoPE, GGUF and the real model: the other test modules."""

from __future__ import annotations

from typing import Any

from tallow.plugin.testing import ModelArchitectureConformance

SMALL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    vocab_size=128,
    rms_norm_eps=1e-6,
    max_position_embeddings=256,
    sliding_window=5,
    query_pre_attn_scalar=24,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
    # a tied head over an embedding scaled by sqrt(hidden) makes a two-layer random
    # model echo its input token; untied, greedy decoding moves
    tie_word_embeddings=False,
)


class TestGemma2Conformance(ModelArchitectureConformance):
    distribution = "tallow-model-gemma"
    component = "Gemma2ForCausalLM"

    def hf_config(self) -> Any:
        import transformers

        return transformers.Gemma2Config(
            **SMALL, attn_logit_softcapping=3.0, final_logit_softcapping=30.0
        )


class TestGemma3Conformance(ModelArchitectureConformance):
    distribution = "tallow-model-gemma"
    component = "Gemma3ForCausalLM"

    def hf_config(self) -> Any:
        import transformers

        return transformers.Gemma3TextConfig(
            **SMALL, layer_types=["sliding_attention", "full_attention"]
        )


class TestGemma4Conformance(ModelArchitectureConformance):
    distribution = "tallow-model-gemma"
    component = "Gemma4ForCausalLM"

    def hf_config(self) -> Any:
        import transformers

        small = {k: v for k, v in SMALL.items() if k != "query_pre_attn_scalar"}
        return transformers.Gemma4TextConfig(
            **{**small, "num_hidden_layers": 3},
            layer_types=["sliding_attention", "full_attention", "full_attention"],
            global_head_dim=16,
            hidden_size_per_layer_input=8,
            vocab_size_per_layer_input=128,
            num_kv_shared_layers=1,
            final_logit_softcapping=10.0,
        )
