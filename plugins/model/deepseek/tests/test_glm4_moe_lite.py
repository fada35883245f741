"""GLM-4.7-Flash (``Glm4MoeLiteForCausalLM``) beyond the conformance suite: a layer pattern
from ``mlp_layer_types`` that ``first_k_dense_replace`` could not say, the rule for configs
without it, and the settings it refuses."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is the parity oracle")

from tallow.layers import ArchConfig, BuildContext  # noqa: E402
from tallow.plugin.testing.model_parity import (  # noqa: E402
    assert_cuda_parity,
    assert_greedy_parity,
    load_saved,
    random_hf_model,
)

from deepseek_configs import PROMPT, SMALL, randomize_correction_bias  # noqa: E402
from tallow_model_deepseek.model import Glm4MoeLiteForCausalLM  # noqa: E402

BASE = {k: v for k, v in SMALL.items() if k != "first_k_dense_replace"}


def _config(**extra):
    return transformers.Glm4MoeLiteConfig(
        **{**BASE, "q_lora_rank": 24, "n_group": 2, "topk_group": 1, **extra}
    )


def _kinds(model) -> list[str]:
    return [type(layer.mlp).__name__ for layer in model.model.layers]


def test_mlp_layer_types_pattern_and_rotate_half():
    """MoE, dense, MoE (a pattern ``first_k_dense_replace`` cannot express) with rotate-half
    rope: 32 greedy tokens and their logits as transformers'."""
    config = _config(mlp_layer_types=["sparse", "dense", "sparse"], rope_interleave=False)
    hf = random_hf_model(config, seed=31)
    randomize_correction_bias(hf, 32)
    model = Glm4MoeLiteForCausalLM(ArchConfig(config.to_dict()), BuildContext())
    assert _kinds(model) == ["FusedMoE", "LlamaMLP", "FusedMoE"]
    assert model.rope_neox_style
    state = dict(hf.state_dict())
    state["model.layers.3.eh_proj.weight"] = torch.zeros(64, 128)  # an MTP layer: skipped
    model.load_weights(iter(state.items()), naming="hf")
    model.process_weights_after_loading()
    assert_greedy_parity(model.eval(), hf, PROMPT, 32, what="glm4-moe-lite pattern")


def test_config_without_mlp_layer_types():
    """A config.json with ``first_k_dense_replace`` and no ``mlp_layer_types`` (the released
    GLM-4.7-Flash config) gets that many dense layers; with neither, one (transformers'
    default)."""
    raw = _config().to_dict()
    raw.pop("mlp_layer_types")
    assert _kinds(Glm4MoeLiteForCausalLM(ArchConfig(raw), BuildContext())) == [
        "LlamaMLP",
        "FusedMoE",
        "FusedMoE",
    ]
    raw["first_k_dense_replace"] = 2
    assert _kinds(Glm4MoeLiteForCausalLM(ArchConfig(raw), BuildContext())) == [
        "LlamaMLP",
        "LlamaMLP",
        "FusedMoE",
    ]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"mlp_layer_types": ["dense", "sparse"]}, "mlp_layer_types must list"),
        ({"mlp_layer_types": ["dense", "moe", "sparse"]}, "mlp_layer_types must list"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor 0.5 is not supported"),
    ],
)
def test_refused_configs(change, message):
    raw = {**_config().to_dict(), **change}
    with pytest.raises(ValueError, match=message):
        Glm4MoeLiteForCausalLM(ArchConfig(raw), BuildContext())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_parity(tmp_path):
    hf = random_hf_model(_config(), seed=33)
    randomize_correction_bias(hf, 34)
    from tallow_format_safetensors.format import SafetensorsFormat

    assert_cuda_parity(
        lambda **kw: load_saved(
            hf, tmp_path, Glm4MoeLiteForCausalLM, SafetensorsFormat().load, **kw
        ),
        hf,
        PROMPT,
        32,
        what="glm4-moe-lite",
    )


def test_random_shape_of_glm_4_7_flash():
    """``random:glm-4.7-flash`` (built on the meta device): 29.9B parameters, one dense layer
    then 46 MoE layers, and a latent cache of 47 x (512 + 64) x 2 = 54,144 bytes per token in
    bfloat16."""
    from tallow.engine.cache_groups import find_cache_groups, group_block_bytes
    from tallow.engine.random_model import shape_config
    from tallow.kernels.kv_cast import AutoKVCodec

    config = ArchConfig(shape_config("random:glm-4.7-flash"))
    with torch.device("meta"):
        model = Glm4MoeLiteForCausalLM(
            config, BuildContext(dtype=torch.bfloat16, device=torch.device("meta"))
        )
    assert 29.9e9 < sum(p.numel() for p in model.parameters()) < 30.0e9
    kinds = _kinds(model)
    assert kinds[0] == "LlamaMLP" and kinds[1:] == ["FusedMoE"] * 46
    (group,) = find_cache_groups(model)
    per_token = (
        group_block_bytes(group, AutoKVCodec(), block_size=16, model_dtype=torch.bfloat16) / 16
    )
    assert per_token == 47 * 576 * 2
