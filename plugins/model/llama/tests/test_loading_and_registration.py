"""load_weights' completeness checks and the plugin's registration."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers writes the checkpoints")

from tallow.layers import ArchConfig, BuildContext, WeightLoadError  # noqa: E402
from tallow.plugin import ArchitectureRegistry  # noqa: E402
from tallow.plugin.testing import modules_imported_by_registration  # noqa: E402

from tallow_model_llama import plugin  # noqa: E402
from tallow_model_llama.model import (  # noqa: E402
    LlamaForCausalLM,
    MistralForCausalLM,
    Qwen2ForCausalLM,
    Qwen3ForCausalLM,
)

CONFIG = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
)


@pytest.fixture
def llama_state():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**CONFIG)
    hf = transformers.AutoModelForCausalLM.from_config(config)
    return config.to_dict(), {k: v.clone() for k, v in hf.state_dict().items()}


def fresh(config: dict) -> LlamaForCausalLM:
    return LlamaForCausalLM(ArchConfig(config), BuildContext())


def test_complete_checkpoint_fills_every_parameter(llama_state):
    config, state = llama_state
    model = fresh(config)
    filled = model.load_weights(state.items())
    assert filled == {n for n, _ in model.named_parameters()}
    w = model.model.layers[1].self_attn.qkv_proj.weight
    torch.testing.assert_close(w[64:96], state["model.layers.1.self_attn.k_proj.weight"])


def test_missing_shard_and_unexpected_tensor_are_listed(llama_state):
    config, state = llama_state
    del state["model.layers.1.self_attn.k_proj.weight"]
    del state["model.norm.weight"]
    state["model.layers.0.mlp.experts.0.weight"] = torch.zeros(1)
    with pytest.raises(WeightLoadError) as err:
        fresh(config).load_weights(state.items())
    msg = str(err.value)
    assert "missing parameters (2)" in msg
    assert "model.layers.1.self_attn.qkv_proj.weight[k]" in msg and "model.norm.weight" in msg
    assert "unexpected checkpoint tensors (1): model.layers.0.mlp.experts.0.weight" in msg


def test_a_tensor_of_the_wrong_shape_is_named(llama_state):
    config, state = llama_state
    state["model.layers.0.mlp.up_proj.weight"] = torch.zeros(128, 63)
    with pytest.raises(
        WeightLoadError,
        match=r"'model.layers.0.mlp.up_proj.weight' -> parameter "
        r"'model.layers.0.mlp.gate_up_proj.weight'.*\(128, 63\)",
    ):
        fresh(config).load_weights(state.items())


def test_biases_a_model_does_not_have_are_unexpected(llama_state):
    config, state = llama_state
    state["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(64)
    with pytest.raises(WeightLoadError, match="which this model does not have"):
        fresh(config).load_weights(state.items())


def test_unknown_naming_is_refused(llama_state):
    config, state = llama_state
    with pytest.raises(WeightLoadError, match="cannot load tensors named 'onnx'.*gguf, hf"):
        fresh(config).load_weights(state.items(), naming="onnx")


def test_missing_config_field_is_named():
    with pytest.raises(ValueError, match="'intermediate_size' is required"):
        LlamaForCausalLM(
            ArchConfig({k: v for k, v in CONFIG.items() if k != "intermediate_size"}),
            BuildContext(),
        )


def test_old_checkpoints_rotary_buffers_are_ignored(llama_state):
    config, state = llama_state
    state["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
    fresh(config).load_weights(state.items())


def test_qwen2_sliding_window_follows_layer_types_and_max_window_layers():
    base = dict(CONFIG, sliding_window=8)
    layers = lambda cfg: [
        layer.self_attn.attn.layer.sliding_window  # noqa: E731
        for layer in Qwen2ForCausalLM(ArchConfig(cfg), BuildContext()).model.layers
    ]
    assert layers(dict(base, use_sliding_window=False)) == [None, None]
    assert layers(dict(base, use_sliding_window=True, max_window_layers=1)) == [None, 8]
    assert layers(dict(base, layer_types=["sliding_attention", "full_attention"])) == [8, None]
    mistral = MistralForCausalLM(ArchConfig(base), BuildContext())
    assert [m.self_attn.attn.layer.sliding_window for m in mistral.model.layers] == [8, 8]
    llama = LlamaForCausalLM(ArchConfig(base), BuildContext())
    assert [m.self_attn.attn.layer.sliding_window for m in llama.model.layers] == [None, None]


def test_registration_is_lazy_and_maps_gguf_architectures():
    eps = {ep.name: ep.value for ep in entry_points(group="tallow")}
    assert eps["tallow-model-llama"] == "tallow_model_llama.plugin"
    registry = ArchitectureRegistry()
    plugin.tallow_register_architectures(registry)
    assert all(e.lazy for e in registry)
    expected = {
        "LlamaForCausalLM": LlamaForCausalLM,
        "MistralForCausalLM": MistralForCausalLM,
        "Qwen2ForCausalLM": Qwen2ForCausalLM,
        "Qwen3ForCausalLM": Qwen3ForCausalLM,
    }
    for name, cls in expected.items():
        assert registry.get(name) is cls
        assert cls.hf_architectures == (name,)
        assert registry.entry(name).meta["gguf"] == cls.gguf_architectures
    assert registry.for_gguf("llama").name == "LlamaForCausalLM"
    assert registry.for_gguf("qwen2").name == "Qwen2ForCausalLM"
    assert registry.for_gguf("qwen3").name == "Qwen3ForCausalLM"


def test_registration_imports_no_torch():
    assert (
        modules_imported_by_registration(
            "tallow_model_llama.plugin", "tallow_register_architectures", "ArchitectureRegistry"
        )
        == []
    )
