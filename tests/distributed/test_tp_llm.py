"""TP=2 and TP=4 through ``LLM`` give the tokens of TP=1 (CPU, float32, gloo).

Each tensor-parallel size runs one driver process (``tp_cases.py``) whose spawned workers serve
every case one engine after the other; the references run in this process. The cases force
chunked prefill, prefix-cache hits and preemption (``tp_cases.TIGHT``), and besides greedy
rows hold seeded sampling (rank 0 samples and broadcasts), penalties with logprobs and prompt
logprobs, and an ``n = 2`` fork (copy-on-write of KV blocks on every rank).
"""

from __future__ import annotations

from typing import Any

import pytest
from tp_processes import run_driver
from tp_cases import (
    TIGHT,
    assert_same,
    one_thread,
    run_case,
    standard_waves,
    token_waves,
)

pytestmark = pytest.mark.slow


def _cases(checkpoints: dict[str, str], tp: int) -> list[dict[str, Any]]:
    cases = [
        {"name": family, "model": checkpoints[family], "waves": standard_waves()}
        for family in ("llama", "qwen2", "qwen3")
    ]
    gguf = {
        "name": "gguf",
        "model": checkpoints["gguf"],
        "waves": token_waves(),
        "plugin_settings": {"tallow-quant-gguf": {"cpu": True}},
        "settings": {**TIGHT, "num_blocks": 64},
    }
    if tp == 2:
        # one prompt in one step: the step message outgrows the first broadcast
        long = {
            "name": "long-step",
            "model": checkpoints["llama"],
            "settings": {
                **TIGHT,
                "num_blocks": 520,
                "max_model_len": 2048,
                "max_num_batched_tokens": 2048,
                "prefill_chunk_size": None,
            },
            "waves": [
                [
                    {
                        "prompt": "The quick brown fox jumps over the lazy dog. " * 50,
                        "params": {"max_tokens": 8, "temperature": 0.0},
                    }
                ]
            ],
        }
        # K/V stored as 8-bit floats: each rank's cache holds its heads, encoded alike
        fp8 = {
            "name": "fp8-kv",
            "model": checkpoints["llama"],
            "waves": standard_waves()[:1],
            "settings": {**TIGHT, "kv_codec": "fp8"},
        }
        cases += [gguf, long, fp8]
    else:  # last: its refusal ends the group
        cases.append(gguf)
    return cases


@pytest.fixture(scope="module")
def references(checkpoints: dict[str, str]) -> dict[str, dict[str, Any]]:
    with one_thread():
        return {case["name"]: run_case(case, 1) for case in _cases(checkpoints, 2)}


@pytest.mark.parametrize("tp", [2, 4])
def test_tokens_equal_tp1(tp: int, checkpoints, references, tmp_path, sessions) -> None:
    results = run_driver(_cases(checkpoints, tp), tp, tmp_path, sessions)
    for name in ("llama", "qwen2", "qwen3"):
        assert_same(results[name], references[name], f"{name} TP={tp}")
        stats = results[name]["stats"]
        # the features the cases are built to exercise did happen under tensor parallelism
        assert stats["num_preemptions"] > 0 and stats["prefix_cache_hit_rate"] > 0, stats
    if tp == 2:
        assert_same(results["gguf"], references["gguf"], "GGUF k-quants TP=2")
        assert_same(results["long-step"], references["long-step"], "one long step TP=2")
        assert_same(results["fp8-kv"], references["fp8-kv"], "fp8 KV cache TP=2")
    else:
        # ffn_down's 512 Q4_K columns over 4 ranks are 128 each: half a block
        error = results["gguf"]["error"]
        assert "ffn_down" in error and "256-element block boundaries of Q4_K" in error, error
