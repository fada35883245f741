"""GLM-4.5 MoE against tallow's model conformance suite: transformers on the same tiny random
weights (the router's correction bias random too), 32 greedy tokens through a dense first
layer and MoE layers, chunked prefill, the engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from tallow.plugin.testing import ModelArchitectureConformance
from tallow.plugin.testing.model import random_hf_model
from tallow.plugin.testing.model_parity import expert_choices

SMALL = dict(
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=128,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_shared_experts=1,
    first_k_dense_replace=1,
    n_group=4,
    topk_group=2,
    routed_scaling_factor=2.5,
    norm_topk_prob=True,
    rms_norm_eps=1e-5,
    max_position_embeddings=256,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
PROMPT = [
    3,
    17,
    50,
    9,
    64,
    28,
    5,
    77,
    31,
    20,
    1,
    42,
    99,
    120,
    7,
    63,
    88,
    14,
    101,
    36,
    55,
    111,
    24,
    92,
    70,
    12,
    127,
    46,
    83,
    2,
]


class Glm4MoeConformance(ModelArchitectureConformance):
    distribution = "tallow-model-glm4-moe"
    component = "Glm4MoeForCausalLM"
    prompt: ClassVar[list[int]] = PROMPT
    steps: ClassVar[int] = 32
    qk_norm: ClassVar[bool] = False

    @pytest.fixture(scope="class")
    def transformers_model(self, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
        pytest.importorskip("transformers", reason="transformers is the parity oracle")
        model = random_hf_model(self.hf_config(), 13, std=self.weight_std)
        gen = torch.Generator().manual_seed(14)
        with torch.no_grad():  # a buffer in transformers: zeros unless set
            for name, buf in model.named_buffers():
                if name.endswith("e_score_correction_bias"):
                    buf.copy_(torch.randn(buf.shape, generator=gen) * 0.01)
        directory = tmp_path_factory.mktemp("model")
        model.save_pretrained(str(directory), safe_serialization=True)
        return model, directory

    def hf_config(self) -> Any:
        import transformers

        return transformers.Glm4MoeConfig(**SMALL, attention_bias=True, use_qk_norm=self.qk_norm)

    def test_dense_then_moe_layers_and_partial_rotary(self, loaded: tuple[Any, set[str]]) -> None:
        model = loaded[0]
        assert [type(layer.mlp).__name__ for layer in model.model.layers] == [
            "LlamaMLP",
            "FusedMoE",
            "FusedMoE",
        ]
        assert model.model.rotary_emb.rotary_dim == 8  # half of each 16-wide head
        used = [torch.unique(i).numel() for i in expert_choices(model, self.prompt)]
        assert len(used) == 2 and min(used) >= 4, f"the prompt reaches only {used} of 8 experts"


class TestGlm4MoeConformance(Glm4MoeConformance):
    """q/k/v biases, no q/k norm (GLM-4.5)."""


class TestGlm4MoeQkNormConformance(Glm4MoeConformance):
    """Per-head q/k RMSNorm (``use_qk_norm``, GLM-4.5-Air style configs)."""

    qk_norm = True
