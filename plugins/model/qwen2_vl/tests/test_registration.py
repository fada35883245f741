"""The plugin registers Qwen2.5-VL, Qwen2-VL and Qwen3-VL lazily (no torch imported), its
checkpoints load in both tensor layouts, and bad configs are refused naming the key."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tallow.layers import ArchConfig, BuildContext, VisionLanguageModel
from tallow.plugin import ArchitectureRegistry
from tallow.plugin.testing import modules_imported_by_registration

from tallow_model_qwen2_vl import plugin


def test_registration_is_lazy() -> None:
    assert (
        modules_imported_by_registration(
            "tallow_model_qwen2_vl.plugin", "tallow_register_architectures", "ArchitectureRegistry"
        )
        == []
    )
    registry = ArchitectureRegistry()
    plugin.tallow_register_architectures(registry)
    for name in (
        "Qwen2_5_VLForConditionalGeneration",
        "Qwen2VLForConditionalGeneration",
        "Qwen3VLForConditionalGeneration",
    ):
        cls = registry.entry(name).load()
        assert issubclass(cls, VisionLanguageModel) and cls.position_axes == 3
        assert cls.hf_architectures == (name,)


def _tensors(checkpoint: tuple[Any, Any]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    from tallow.plugin.testing.model import load_checkpoint_dir

    return load_checkpoint_dir(checkpoint[1])


@pytest.mark.parametrize("layout", ["transformers-5", "original"])
def test_both_tensor_layouts_load_every_parameter(checkpoint, layout) -> None:
    from tallow_model_qwen2_vl.model import Qwen2_5_VLForConditionalGeneration

    config, tensors = _tensors(checkpoint)
    if layout == "original":  # visual.*, model.layers.*: the layout of the published files
        renamed = {}
        for name, t in tensors.items():
            name = name.replace("model.visual.", "visual.", 1)
            renamed[name.replace("model.language_model.", "model.", 1)] = t
        tensors = renamed
    model = Qwen2_5_VLForConditionalGeneration(ArchConfig(config), BuildContext())
    filled = model.load_weights(iter(tensors.items()), naming="hf")
    assert {n for n, _ in model.named_parameters()} <= filled
    hf = checkpoint[0].model.visual.patch_embed.proj.weight
    assert torch.equal(model.visual.patch_embed.weight, hf.reshape(hf.shape[0], -1))


def test_bad_configs_name_the_key(checkpoint) -> None:
    from tallow_model_qwen2_vl.model import Qwen2_5_VLForConditionalGeneration

    config, _ = _tensors(checkpoint)
    broken = dict(config, vision_config=dict(config["vision_config"], out_hidden_size=32))
    with pytest.raises(ValueError, match="out_hidden_size 32 differs from hidden_size 64"):
        Qwen2_5_VLForConditionalGeneration(ArchConfig(broken), BuildContext())
    no_sections = dict(
        config, text_config=dict(config["text_config"], rope_parameters={"rope_theta": 1e4})
    )
    with pytest.raises(ValueError, match="mrope_section is required"):
        Qwen2_5_VLForConditionalGeneration(ArchConfig(no_sections), BuildContext())
    with pytest.raises(ValueError, match="vision_config object is required"):
        Qwen2_5_VLForConditionalGeneration(
            ArchConfig({k: v for k, v in config.items() if k != "vision_config"}), BuildContext()
        )
