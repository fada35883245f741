"""MiniMax M2 against tallow's model conformance suite: transformers on the same tiny random
weights (the correction bias random too), 32 greedy tokens and their logits, chunked prefill,
the engine."""

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
    intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=128,
    num_local_experts=8,
    num_experts_per_tok=2,
    rms_norm_eps=1e-6,
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


def randomize_correction_bias(model: Any, seed: int) -> None:
    """transformers keeps ``e_score_correction_bias`` as a buffer (zeros when built): values
    of the size of the sigmoid scores' spread, so that they change some choices."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.copy_(torch.randn(buf.shape, generator=gen) * 0.03)


class TestMiniMaxM2Conformance(ModelArchitectureConformance):
    """Half of each 16-wide head rotated (``rotary_dim`` 8), whole-projection q/k norms."""

    distribution = "tallow-model-minimax-m2"
    component = "MiniMaxM2ForCausalLM"
    prompt: ClassVar[list[int]] = PROMPT
    steps: ClassVar[int] = 32

    def hf_config(self) -> Any:
        import transformers

        return transformers.MiniMaxM2Config(**SMALL, rotary_dim=8)

    @pytest.fixture(scope="class")
    def transformers_model(self, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
        pytest.importorskip("transformers", reason="transformers is the parity oracle")
        model = random_hf_model(self.hf_config(), 15, std=self.weight_std)
        randomize_correction_bias(model, 16)
        directory = tmp_path_factory.mktemp("model")
        model.save_pretrained(str(directory), safe_serialization=True)
        return model, directory

    def test_layers_partial_rotary_and_norms(self, loaded: tuple[Any, set[str]]) -> None:
        model = loaded[0]
        assert [type(layer.mlp).__name__ for layer in model.model.layers] == ["FusedMoE"] * 2
        assert model.model.rotary_emb.rotary_dim == 8
        attn = model.model.layers[0].self_attn
        assert attn.q_norm.weight.shape == (64,) and attn.k_norm.weight.shape == (32,)
        bias = model.model.layers[1].mlp.gate.e_score_correction_bias
        assert float(bias.abs().max()) > 0, "the correction bias was not loaded"

    def test_prompt_reaches_most_experts(self, loaded: tuple[Any, set[str]]) -> None:
        for ids in expert_choices(loaded[0], self.prompt):
            used = torch.unique(ids).numel()
            assert used >= 5, f"the prompt reaches only {used} of 8 experts"
