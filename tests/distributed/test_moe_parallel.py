"""Mixture-of-experts models over two ranks (CPU, float32, gloo) through ``LLM`` give the
tokens and log-probabilities of one rank: tensor parallelism (every expert split along its
intermediate size) and expert parallelism (``enable_expert_parallel``: whole experts per rank,
tokens exchanged by all-to-all). Families: Qwen3-MoE, Qwen2-MoE (a shared expert behind a
sigmoid gate) and Mixtral; the tight budgets of ``tp_cases.TIGHT`` force chunked prefill,
prefix-cache hits and preemption on every rank."""

from __future__ import annotations

from typing import Any

import pytest
from tiny_models import save_tiny
from tp_cases import TIGHT, assert_same, one_thread, run_case, standard_waves
from tp_processes import run_driver

pytestmark = pytest.mark.slow

MOE_PLUGINS = ["tallow-model-qwen-moe", "tallow-model-mixtral"]
#: 8 experts, top-2: over two ranks each holds 4 under expert parallelism
FAMILIES = {
    "qwen3_moe": dict(
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        norm_topk_prob=True,
        head_dim=16,
    ),
    "qwen2_moe": dict(
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
    ),
    "mixtral": dict(num_local_experts=8, num_experts_per_tok=2, intermediate_size=64),
}


@pytest.fixture(scope="module")
def moe_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("moe-models")
    return {
        family: str(save_tiny(root / family, family, **overrides))
        for family, overrides in FAMILIES.items()
    }


def _waves() -> list[list[dict[str, Any]]]:
    """The standard waves with the top-5 log-probabilities of every greedy token: the logits
    compared within float32 tolerance, beside the tokens themselves."""
    waves = standard_waves()
    for wave in waves:
        for request in wave:
            if request["params"].get("temperature") == 0.0 and "logprobs" not in request["params"]:
                request["params"] = {**request["params"], "logprobs": 5}
    return waves


def assert_parallel_equals_one_rank(
    checkpoints: dict[str, str],
    plugins: list[str],
    tmp_path: Any,
    sessions: list[int],
    modes: dict[str, tuple[str, ...]] | None = None,
) -> None:
    """Each family of ``checkpoints`` over two ranks, tensor parallel ("tp") and expert
    parallel ("ep") — or the modes ``modes`` names for the family —, gives one rank's tokens
    and log-probabilities, with preemption and prefix-cache hits on the way."""
    modes = {family: (modes or {}).get(family, ("tp", "ep")) for family in checkpoints}
    cases = []
    for family, path in checkpoints.items():
        for mode in modes[family]:
            expert_parallel = mode == "ep"
            cases.append(
                {
                    "name": f"{family}-{mode}",
                    "model": path,
                    "plugins": plugins,
                    "waves": _waves(),
                    "settings": {**TIGHT, "enable_expert_parallel": expert_parallel},
                }
            )
    with one_thread():
        references = {
            family: run_case({**cases[0], "name": family, "model": path, "settings": TIGHT}, 1)
            for family, path in checkpoints.items()
        }
    results = run_driver(cases, 2, tmp_path, sessions, timeout=400)
    for family in checkpoints:
        for mode in modes[family]:
            name = f"{family}-{mode}"
            compared = assert_same(results[name], references[family], f"{name} over 2 ranks")
            assert compared > 100, f"{name}: only {compared} log-probabilities compared"
            stats = results[name]["stats"]
            assert stats["num_preemptions"] > 0 and stats["prefix_cache_hit_rate"] > 0, stats


def test_tensor_and_expert_parallel_equal_one_rank(moe_checkpoints, tmp_path, sessions):
    assert_parallel_equals_one_rank(moe_checkpoints, MOE_PLUGINS, tmp_path, sessions)
