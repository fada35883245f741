"""StableLM's loading: per-head q/k norms, the parallel residual's single norm, and what it
refuses. Its parity with transformers is in test_conformance.py."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is the parity oracle")

from tallow.layers import ArchConfig, BuildContext, WeightLoadError  # noqa: E402

from tallow_model_gptneox.stablelm import StableLmForCausalLM  # noqa: E402


def _state(**overrides):
    torch.manual_seed(0)
    config = transformers.StableLmConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=64,
        **overrides,
    )
    hf = transformers.AutoModelForCausalLM.from_config(config)
    return config.to_dict(), {k: v.clone() for k, v in hf.state_dict().items()}


def test_per_head_norms_load_by_head_and_missing_ones_are_named():
    config, state = _state(qk_layernorm=True)
    state["model.layers.0.self_attn.k_layernorm.norms.1.weight"] = torch.full((8,), 3.0)
    model = StableLmForCausalLM(ArchConfig(config), BuildContext())
    model.load_weights(state.items())
    k_norms = model.model.layers[0].self_attn.k_layernorm.norms
    assert len(k_norms) == 2 and k_norms[1].weight.tolist() == [3.0] * 8
    del state["model.layers.0.self_attn.q_layernorm.norms.3.weight"]
    with pytest.raises(
        WeightLoadError,
        match=r"missing parameters \(1\): "
        r"model.layers.0.self_attn.q_layernorm.norms.3.weight",
    ):
        StableLmForCausalLM(ArchConfig(config), BuildContext()).load_weights(state.items())


def test_parallel_residual_has_no_second_norm():
    config, state = _state(use_parallel_residual=True)
    assert not any("post_attention_layernorm" in k for k in state)
    model = StableLmForCausalLM(ArchConfig(config), BuildContext())
    assert model.model.layers[0].post_attention_layernorm is None
    model.load_weights(state.items())


def test_per_head_norms_refuse_tensor_parallel_ranks():
    config, _ = _state(qk_layernorm=True)
    with pytest.raises(ValueError, match="per-head norms are not sharded"):
        StableLmForCausalLM(ArchConfig(config), BuildContext(tp_rank=0, tp_size=2))
