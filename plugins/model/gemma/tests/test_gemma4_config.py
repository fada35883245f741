"""Gemma 4 configs read per layer: head sizes and KV heads, K=V, KV-sharing sources, RoPE
per layer kind, and clear errors for what the model cannot be."""

from __future__ import annotations

import pytest
import torch

from tallow.engine.random_model import shape_config
from tallow.layers import ArchConfig, BuildContext

from tallow_model_gemma import gemma4_config as g4
from tallow_model_gemma.gemma4 import Gemma4ForCausalLM

transformers = pytest.importorskip("transformers", reason="transformers is the oracle")

TINY = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    vocab_size=64,
    vocab_size_per_layer_input=64,
    hidden_size_per_layer_input=4,
    max_position_embeddings=64,
    sliding_window=4,
)


def test_e2b_shape_shares_kv_from_layers_13_and_14():
    plans = g4.layer_plans(g4.with_defaults(shape_config("random:gemma-4-e2b")))
    assert [p.shared_from for p in plans[:15]] == [None] * 15
    assert [p.shared_from for p in plans[15:]] == [14 if i % 5 == 4 else 13 for i in range(15, 35)]
    assert all(p.double_mlp == (p.index >= 15) for p in plans)
    full = [p for p in plans if p.kind == g4.FULL]
    assert {(p.head_dim, p.num_kv_heads, p.k_eq_v) for p in full} == {(512, 1, False)}


def test_26b_shape_has_k_eq_v_full_layers():
    plans = g4.layer_plans(g4.with_defaults(shape_config("random:gemma-4-26b-a4b")))
    kinds = {p.kind: (p.head_dim, p.num_kv_heads, p.k_eq_v) for p in plans}
    assert kinds == {g4.SLIDING: (256, 8, False), g4.FULL: (512, 2, True)}
    assert all(p.shared_from is None for p in plans)


@pytest.mark.parametrize("k_eq_v", [False, True])
def test_per_layer_config_as_transformers_writes_it(k_eq_v):
    """transformers 5 turns ``global_head_dim`` / ``num_global_key_value_heads`` into
    ``per_layer_config``; both forms give the same layers (the global KV heads only with
    ``attention_k_eq_v``, as transformers reads them)."""
    legacy = {
        **TINY,
        "global_head_dim": 16,
        "num_global_key_value_heads": 1,
        "attention_k_eq_v": k_eq_v,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
    }
    written = transformers.Gemma4TextConfig(**legacy).to_dict()
    assert "per_layer_config" in written and "global_head_dim" not in written
    ours = g4.layer_plans(g4.with_defaults(legacy))
    assert g4.layer_plans(g4.with_defaults(written)) == ours
    assert [(p.head_dim, p.num_kv_heads) for p in ours[:2]] == [(8, 2), (16, 1 if k_eq_v else 2)]


def test_layer_types_default_and_last_layer_full():
    config = g4.with_defaults({**TINY, "num_hidden_layers": 8})
    assert g4.layer_types(config) == [g4.SLIDING] * 5 + [g4.FULL, g4.SLIDING, g4.FULL]
    ours = g4.layer_types({**TINY, "layer_types": [g4.SLIDING] * 4})
    theirs = transformers.Gemma4TextConfig(**TINY, layer_types=[g4.SLIDING] * 4).layer_types
    assert ours == theirs == [g4.SLIDING] * 3 + [g4.FULL]


@pytest.mark.parametrize("kind", [g4.SLIDING, g4.FULL])
def test_rope_frequencies_match_transformers(kind):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = transformers.Gemma4TextConfig(**TINY, global_head_dim=16)
    dim = 8 if kind == g4.SLIDING else 16
    ours = g4.rope_inv_freq(config.to_dict(), kind, dim)
    rope = config.rope_parameters[kind]
    if rope["rope_type"] == "default":
        theirs = 1.0 / (rope["rope_theta"] ** (torch.arange(0, dim, 2).float() / dim))
    else:
        theirs, _ = ROPE_INIT_FUNCTIONS[rope["rope_type"]](config, "cpu", layer_type=kind)
    torch.testing.assert_close(ours, theirs)
    if kind == g4.FULL:  # a quarter of the pairs rotate
        assert int((ours != 0).sum()) == 2


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"num_kv_shared_layers": 4}, "num_kv_shared_layers must be between 0"),
        (
            {"num_kv_shared_layers": 2, "layer_types": [g4.SLIDING, g4.SLIDING, g4.FULL, g4.FULL]},
            "no earlier unshared layer is of that kind",
        ),
        ({"per_layer_config": {"1": {"intermediate_size": 3}}}, "only \\['head_dim'"),
        ({"per_layer_config": {"9": {"head_dim": 16}}}, "names layer 9"),
        ({"per_layer_config": {"0": {"head_dim": 16}}}, "sliding_attention layers have different"),
        (
            {"rope_parameters": {g4.FULL: {"rope_type": "yarn", "rope_theta": 1.0}}},
            "rope_type 'yarn' is not supported",
        ),
        ({"use_bidirectional_attention": "all"}, "causally only"),
        ({"enable_moe_block": True, "num_experts": 4}, "'top_k_experts' must be a positive"),
        ({"layer_types": ["local"] * 4}, "layer_types must list 4 entries"),
    ],
)
def test_bad_configs_are_refused_by_name(change, words):
    with pytest.raises(ValueError, match=words):
        Gemma4ForCausalLM({**TINY, **change}, BuildContext())


def test_tensor_parallel_experts_are_refused():
    build = BuildContext(tp_rank=0, tp_size=2)
    config = ArchConfig(
        {
            **TINY,
            "enable_moe_block": True,
            "num_experts": 4,
            "top_k_experts": 2,
            "moe_intermediate_size": 8,
        }
    )
    with pytest.raises(ValueError, match="enable_moe_block"):
        Gemma4ForCausalLM(config, build)


def test_vision_bidirectional_configs_serve_text_causally():
    """``use_bidirectional_attention: "vision"`` (as Gemma 4 checkpoints state) opens only
    image tokens' attention: text prompts run causally, so such configs build."""
    model = Gemma4ForCausalLM({**TINY, "use_bidirectional_attention": "vision"}, BuildContext())
    assert all(layer.self_attn.attn.layer.causal for layer in model.model.layers)
