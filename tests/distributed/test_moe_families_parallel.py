"""The mixture-of-experts families added after the first three — GLM-4.5 MoE, GLM-4.7-Flash
(latent attention), Llama 4 text (chunked local attention, layers without rope, a shared expert)
and MiniMax M2 (sigmoid routing with a correction bias, partial rotary) — over two ranks (CPU,
float32, gloo) through ``LLM``: tensor parallel and expert parallel give the tokens and
log-probabilities of one rank, with chunked prefill, prefix-cache hits and preemption on the way
(``tp_cases.TIGHT``). Llama 4's MoE block refuses expert parallelism (its experts take
router-scaled inputs; tested by the plugin), so it runs tensor parallel only."""

from __future__ import annotations

import pytest
from test_moe_parallel import assert_parallel_equals_one_rank
from tiny_models import save_tiny

pytestmark = pytest.mark.slow

PLUGINS = [
    "tallow-model-glm4-moe",
    "tallow-model-deepseek",
    "tallow-model-llama4",
    "tallow-model-minimax-m2",
]
#: 8 (Llama 4: 4) experts; over two ranks each holds half under expert parallelism
FAMILIES = {
    "glm4_moe": dict(
        num_hidden_layers=3,
        head_dim=16,
        moe_intermediate_size=32,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_shared_experts=1,
        first_k_dense_replace=1,
        n_group=2,
        topk_group=1,
        routed_scaling_factor=1.5,
        norm_topk_prob=True,
        use_qk_norm=True,
    ),
    "glm4_moe_lite": dict(
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=24,
        kv_lora_rank=32,
        qk_nope_head_dim=16,
        qk_rope_head_dim=16,
        v_head_dim=16,
        moe_intermediate_size=32,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_shared_experts=1,
        first_k_dense_replace=1,
        n_group=2,
        topk_group=1,
    ),
    # layers 0-2 chunked with rope, layer 3 global without rope; MoE on layers 1 and 3
    "llama4_text": dict(
        num_hidden_layers=4,
        head_dim=16,
        intermediate_size=48,
        intermediate_size_mlp=96,
        num_local_experts=4,
        num_experts_per_tok=1,
        interleave_moe_layer_step=2,
        attention_chunk_size=8,
        floor_scale=4,
        attn_scale=0.5,
    ),
    "minimax_m2": dict(
        head_dim=16,
        rotary_dim=8,
        intermediate_size=32,
        num_local_experts=8,
        num_experts_per_tok=2,
        use_qk_norm=True,
        qk_norm_type="per_layer",
    ),
}


@pytest.fixture(scope="module")
def family_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("moe-family-models")
    return {
        family: str(save_tiny(root / family, family, **overrides))
        for family, overrides in FAMILIES.items()
    }


def test_new_moe_families_over_two_ranks_equal_one(family_checkpoints, tmp_path, sessions):
    assert_parallel_equals_one_rank(
        family_checkpoints, PLUGINS, tmp_path, sessions, modes={"llama4_text": ("tp",)}
    )
