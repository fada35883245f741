"""Config forms and checkpoint names the parity tests do not reach: legacy and sparse configs,
bad values, and both layouts of multimodal checkpoints."""

from __future__ import annotations

import pytest

from tallow_model_gemma import config as gemma_config
from tallow_model_gemma.model import Gemma3ForCausalLM, Gemma3ForConditionalGeneration
from tallow_model_gemma.naming import TextModelNames, hf_name_map


def test_sliding_layers_from_types_pattern_and_flags():
    assert gemma_config.sliding_layers(
        {
            "num_hidden_layers": 4,
            "layer_types": [
                "sliding_attention",
                "full_attention",
                "full_attention",
                "sliding_attention",
            ],
        }
    ) == [True, False, False, True]
    assert gemma_config.sliding_layers({"num_hidden_layers": 7, "sliding_window_pattern": 3}) == [
        True,
        True,
        False,
        True,
        True,
        False,
        True,
    ]
    assert gemma_config.sliding_layers(
        {"num_hidden_layers": 3, "sliding_window_pattern": [1, 0, 1]}
    ) == [True, False, True]


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({"num_hidden_layers": 2, "layer_types": ["sliding_attention"]}, "must list 2 entries"),
        ({"num_hidden_layers": 2, "layer_types": ["local", "global"]}, "'sliding_attention'"),
        ({"num_hidden_layers": 2, "sliding_window_pattern": 0}, "positive integer"),
        ({"num_hidden_layers": 2, "sliding_window_pattern": [True]}, "1 flags for 2 layers"),
    ],
)
def test_bad_layer_kinds_are_named(config, words):
    with pytest.raises(ValueError, match="model config: ") as err:
        gemma_config.sliding_layers(config)
    assert words in str(err.value)


def test_gemma3_rope_in_every_form():
    nested = {
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        }
    }
    legacy = {
        "rope_theta": 1e6,
        "rope_local_base_freq": 10000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
    }
    want = {
        "full_attention": (1e6, {"rope_type": "linear", "factor": 8.0}),
        "sliding_attention": (10000.0, None),
    }
    assert gemma_config.gemma3_rope(nested) == want
    assert gemma_config.gemma3_rope(legacy) == want
    # the generic GGUF config: one flat rope_parameters for the global layers
    gguf = {
        "rope_parameters": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        "rope_local_base_freq": 10000.0,
    }
    assert gemma_config.gemma3_rope(gguf) == want
    # bases left out: Gemma 3's defaults
    bare = {
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default"},
            "full_attention": {"rope_type": "default"},
        }
    }
    assert gemma_config.gemma3_rope(bare) == {
        "full_attention": (1e6, None),
        "sliding_attention": (10000.0, None),
    }


def test_sparse_configs_get_the_config_class_defaults():
    cfg = Gemma3ForCausalLM.config_from_hf(
        {
            "hidden_size": 640,
            "num_hidden_layers": 18,
            "_sliding_window_pattern": 3,
            "final_logit_softcapping": None,
        }
    )
    assert cfg["vocab_size"] == 262208 and cfg["query_pre_attn_scalar"] == 256
    assert cfg["sliding_window_pattern"] == 3 and cfg["hidden_size"] == 640
    assert cfg["final_logit_softcapping"] is None  # an explicit null stays null


def test_multimodal_config_is_flattened_to_its_text_model():
    outer = {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "torch_dtype": "bfloat16",
        "eos_token_id": [1, 106],
        "text_config": {
            "hidden_size": 2560,
            "num_hidden_layers": 34,
            "rope_scaling": {"rope_type": "linear", "factor": 8.0},
            "sliding_window": 1024,
        },
    }
    cfg = Gemma3ForConditionalGeneration.config_from_hf(outer)
    assert cfg["architectures"] == ["Gemma3ForConditionalGeneration"]
    assert (cfg["hidden_size"], cfg["num_attention_heads"], cfg["head_dim"]) == (2560, 8, 256)
    assert cfg["torch_dtype"] == "bfloat16" and cfg["eos_token_id"] == [1, 106]
    assert "text_config" not in cfg
    # flattening twice (the engine, then the model) changes nothing
    assert Gemma3ForConditionalGeneration.config_from_hf(cfg) == cfg
    with pytest.raises(ValueError, match="'text_config' object"):
        Gemma3ForConditionalGeneration.config_from_hf({"text_config": 3})


@pytest.mark.parametrize(
    "prefix, head",
    [("language_model.model.", "language_model.lm_head."), ("model.language_model.", "lm_head.")],
)
def test_both_multimodal_layouts(prefix, head):
    names = TextModelNames(hf_name_map())
    m = names.match(f"{prefix}layers.3.self_attn.k_proj.weight")
    assert m.target == "model.layers.3.self_attn.qkv_proj.weight" and m.rule.shard == "k"
    assert names.match(f"{prefix}embed_tokens.weight").target == "model.embed_tokens.weight"
    assert names.match(f"{head}weight").target == "lm_head.weight"
    for skipped in (
        "vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight",
        "model.vision_tower.vision_model.post_layernorm.bias",
        "multi_modal_projector.mm_input_projection_weight",
    ):
        assert names.match(skipped).ignored
    assert names.match("some.other.tensor") is None


def test_bidirectional_models_are_refused():
    import torch

    from tallow.layers import ArchConfig, BuildContext

    cfg = Gemma3ForCausalLM.config_from_hf(
        {
            "hidden_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 16,
            "intermediate_size": 64,
            "vocab_size": 10,
            "max_position_embeddings": 8,
            "use_bidirectional_attention": True,
        }
    )
    with pytest.raises(ValueError, match="use_bidirectional_attention"):
        Gemma3ForCausalLM(ArchConfig(cfg), BuildContext(device=torch.device("cpu")))
