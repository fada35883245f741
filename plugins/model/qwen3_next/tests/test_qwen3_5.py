"""Qwen3.5 dense and MoE against transformers on tiny random weights: the conformance suite
for the text models (``Qwen3_5ForCausalLM``, ``Qwen3_5MoeForCausalLM``), and the text model of
a ``Qwen3_5MoeForConditionalGeneration`` checkpoint (tensors under ``model.language_model.``,
a vision tower skipped) against transformers' multimodal model on text prompts."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from tallow.plugin.testing import ModelArchitectureConformance

sys.path.insert(0, str(Path(__file__).parent))
from tiny_config import TINY  # noqa: E402

# Qwen3.5's configs have no decoder_sparse_step / mlp_only_layers / norm_topk_prob
COMMON = {
    k: v
    for k, v in TINY.items()
    if k
    not in (
        "mlp_only_layers",
        "norm_topk_prob",
        "moe_intermediate_size",
        "shared_expert_intermediate_size",
        "num_experts",
        "num_experts_per_tok",
    )
}
MOE = dict(
    moe_intermediate_size=32,
    shared_expert_intermediate_size=48,
    num_experts=8,
    num_experts_per_tok=2,
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


class TestQwen3_5Conformance(ModelArchitectureConformance):
    distribution = "tallow-model-qwen3-next"
    component = "Qwen3_5ForCausalLM"
    prompt: ClassVar[list[int]] = PROMPT
    steps: ClassVar[int] = 32

    def hf_config(self) -> Any:
        import transformers

        return transformers.Qwen3_5TextConfig(**COMMON)


class TestQwen3_5MoeConformance(ModelArchitectureConformance):
    distribution = "tallow-model-qwen3-next"
    component = "Qwen3_5MoeForCausalLM"
    prompt: ClassVar[list[int]] = PROMPT
    steps: ClassVar[int] = 32

    def hf_config(self) -> Any:
        import transformers

        return transformers.Qwen3_5MoeTextConfig(**COMMON, **MOE)


def test_text_model_of_a_multimodal_checkpoint(tmp_path):
    transformers = pytest.importorskip("transformers", reason="transformers is the oracle")
    pytest.importorskip(
        "tallow_format_safetensors", reason="the saved model is read by tallow-format-safetensors"
    )
    from tallow_format_safetensors.format import SafetensorsFormat

    from tallow.plugin.testing.model_parity import assert_greedy_parity, load_saved
    from tallow.plugin.testing.paged_runner import randomize_
    from tallow_model_qwen3_next.qwen3_5 import Qwen3_5MoeForConditionalGeneration

    vision = dict(
        depth=1,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        out_hidden_size=64,
        patch_size=4,
        temporal_patch_size=2,
        spatial_merge_size=2,
        num_position_embeddings=16,
    )
    config = transformers.Qwen3_5MoeConfig(text_config=dict(COMMON, **MOE), vision_config=vision)
    torch.manual_seed(4)
    hf = transformers.Qwen3_5MoeForConditionalGeneration._from_config(
        config, attn_implementation="eager", dtype=torch.float32
    )
    randomize_(hf, 4)
    hf.eval()
    names = list(hf.state_dict())
    assert any(n.startswith("model.language_model.") for n in names)
    assert any(n.startswith("model.visual.") for n in names)
    model = load_saved(hf, tmp_path, Qwen3_5MoeForConditionalGeneration, SafetensorsFormat().load)
    assert_greedy_parity(model, hf, PROMPT, 32, what="qwen3.5-moe multimodal checkpoint")
