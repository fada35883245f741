"""Both architectures against tallow's model conformance suite, one tiny random configuration
per switch each has: parity of every logit with transformers over a prompt and 20 greedy
steps, output that is not constant, a flat batch of chunked sequences, and the engine
generating transformers' tokens."""

from __future__ import annotations

from typing import Any

from tallow.plugin.testing import ModelArchitectureConformance

BASE = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    vocab_size=128,
    max_position_embeddings=128,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)


class GPTNeoXSuite(ModelArchitectureConformance):
    distribution = "tallow-model-gptneox"
    component = "GPTNeoXForCausalLM"
    steps = 20
    weight_std = 0.3  # large enough that greedy decoding does not repeat one token
    settings: dict[str, Any] = {}

    def hf_config(self) -> Any:
        import transformers

        return transformers.GPTNeoXConfig(
            **{**BASE, "intermediate_size": 256, "rotary_pct": 0.5, **self.settings}
        )


class TestPythia(GPTNeoXSuite):
    """Parallel residual, gelu, half of each head rotated."""


class TestSequentialResidual(GPTNeoXSuite):
    settings = dict(use_parallel_residual=False, rotary_pct=0.25, rotary_emb_base=500.0)


class TestNoBiasTiedFullRotary(GPTNeoXSuite):
    settings = dict(
        attention_bias=False, tie_word_embeddings=True, rotary_pct=1.0, hidden_act="gelu_new"
    )


class TestReluThreeLayers(GPTNeoXSuite):
    settings = dict(hidden_act="relu", num_hidden_layers=3, layer_norm_eps=1e-3)


class StableLmSuite(ModelArchitectureConformance):
    distribution = "tallow-model-gptneox"
    component = "StableLmForCausalLM"
    steps = 20
    weight_std = 0.3
    settings: dict[str, Any] = {}

    def hf_config(self) -> Any:
        import transformers

        return transformers.StableLmConfig(
            **{
                **BASE,
                "intermediate_size": 128,
                "num_key_value_heads": 2,
                "partial_rotary_factor": 0.5,
                **self.settings,
            }
        )


class TestStableLm(StableLmSuite):
    """Sequential residual, no biases, grouped-query heads, half of each head rotated."""


class TestStableLmParallelQkvBias(StableLmSuite):
    settings = dict(
        use_parallel_residual=True, use_qkv_bias=True, partial_rotary_factor=0.25, rope_theta=500.0
    )


class TestStableLmQkLayerNormTied(StableLmSuite):
    settings = dict(qk_layernorm=True, tie_word_embeddings=True, num_key_value_heads=4)
