"""DeepSeek-V3 and DeepSeek-V2 against tallow's model conformance suite: transformers on the
same tiny random weights (the V3 router's correction bias random too), 32 greedy tokens, a
prompt past the dense first layer into the MoE ones, chunked prefill, the engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from tallow.layers import MLAAttention
from tallow.plugin.testing import ModelArchitectureConformance
from tallow.plugin.testing.model import random_hf_model
from tallow.plugin.testing.model_parity import expert_choices

from deepseek_configs import PROMPT, SMALL, randomize_correction_bias


class DeepseekConformance(ModelArchitectureConformance):
    distribution = "tallow-model-deepseek"
    prompt: ClassVar[list[int]] = PROMPT
    steps: ClassVar[int] = 32

    @pytest.fixture(scope="class")
    def transformers_model(self, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
        pytest.importorskip("transformers", reason="transformers is the parity oracle")
        model = random_hf_model(self.hf_config(), 11, std=self.weight_std)
        randomize_correction_bias(model, 12)
        directory = tmp_path_factory.mktemp("model")
        model.save_pretrained(str(directory), safe_serialization=True)
        return model, directory

    def test_layers_dense_then_moe_with_latent_attention(
        self, loaded: tuple[Any, set[str]]
    ) -> None:
        model = loaded[0]
        kinds = [type(layer.mlp).__name__ for layer in model.model.layers]
        assert kinds == ["LlamaMLP", "FusedMoE", "FusedMoE"]
        assert sum(isinstance(m, MLAAttention) for m in model.modules()) == 3
        assert all(m.absorbed for m in model.modules() if isinstance(m, MLAAttention))

    def test_prompt_reaches_most_experts(self, loaded: tuple[Any, set[str]]) -> None:
        chosen = expert_choices(loaded[0], self.prompt)
        assert len(chosen) == 2
        for ids in chosen:
            used = torch.unique(ids).numel()
            assert used >= 5, f"the prompt reaches only {used} of 8 experts"


class TestDeepseekV3Conformance(DeepseekConformance):
    """A low-rank query, sigmoid routing over 4 groups (2 taken) with a correction bias,
    renormalised weights times 2.5."""

    component = "DeepseekV3ForCausalLM"

    def hf_config(self) -> Any:
        import transformers

        return transformers.DeepseekV3Config(
            **SMALL,
            q_lora_rank=24,
            n_group=4,
            topk_group=2,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
        )


class TestDeepseekV2Conformance(DeepseekConformance):
    """Queries straight from the hidden state, softmax routing limited to the 2 of 4 groups
    holding the best experts, weights times 1.5 without renormalisation."""

    component = "DeepseekV2ForCausalLM"

    def hf_config(self) -> Any:
        import transformers

        return transformers.DeepseekV2Config(
            **SMALL,
            q_lora_rank=None,
            n_group=4,
            topk_group=2,
            topk_method="group_limited_greedy",
            routed_scaling_factor=1.5,
        )


class TestGlm4MoeLiteConformance(DeepseekConformance):
    """GLM-4.7-Flash (``Glm4MoeLiteForCausalLM``): V3's latent attention and sigmoid routing
    over 4 groups (2 taken), interleaved rope, the MoE layers named by ``mlp_layer_types``."""

    component = "Glm4MoeLiteForCausalLM"

    def hf_config(self) -> Any:
        import transformers

        small = {k: v for k, v in SMALL.items() if k != "first_k_dense_replace"}
        return transformers.Glm4MoeLiteConfig(
            **small,
            q_lora_rank=24,
            n_group=4,
            topk_group=2,
            routed_scaling_factor=1.8,
            norm_topk_prob=True,
            mlp_layer_types=["dense", "sparse", "sparse"],
        )
