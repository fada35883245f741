"""DeepSeek models (latent attention, MLA) over two ranks (CPU, float32, gloo) through
``LLM`` give the tokens and log-probabilities of one rank: the heads of the latent attention
split over the ranks, the latent cache whole on each; the experts split along their
intermediate size (tensor parallel) or placed whole (expert parallel). The tight budgets of
``tp_cases.TIGHT`` force chunked prefill, prefix-cache hits and preemption on every rank."""

from __future__ import annotations

import pytest
from test_moe_parallel import assert_parallel_equals_one_rank
from tiny_models import save_tiny

pytestmark = pytest.mark.slow

PLUGINS = ["tallow-model-deepseek"]
MLA = dict(
    num_attention_heads=4,
    num_key_value_heads=4,
    kv_lora_rank=32,
    qk_nope_head_dim=16,
    qk_rope_head_dim=16,
    v_head_dim=16,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_shared_experts=1,
    moe_intermediate_size=32,
    first_k_dense_replace=1,
    num_hidden_layers=3,
)
FAMILIES = {
    "deepseek_v3": dict(MLA, q_lora_rank=32, n_group=4, topk_group=2, routed_scaling_factor=2.5),
    "deepseek_v2": dict(
        MLA, q_lora_rank=None, n_group=4, topk_group=2, topk_method="group_limited_greedy"
    ),
}


@pytest.fixture(scope="module")
def mla_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("mla-models")
    return {
        family: str(save_tiny(root / family, family, **overrides))
        for family, overrides in FAMILIES.items()
    }


def test_latent_attention_over_two_ranks_equals_one(mla_checkpoints, tmp_path, sessions):
    assert_parallel_equals_one_rank(mla_checkpoints, PLUGINS, tmp_path, sessions)
