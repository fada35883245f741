"""Engines of the plugin's tests: built from a few settings, run greedily to completion."""

from __future__ import annotations

from typing import Any

from tallow.config import config_from_mapping
from tallow.engine.llm_engine import LLMEngine
from tallow import SamplingParams


def settings(
    source: str,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    max_model_len: int = 128,
    num_blocks: int = 32,
    runner: dict[str, Any] | None = None,
    int4: dict[str, Any] | None = None,
    **model: Any,
) -> Any:
    """The configuration of an engine serving ``source``; ``model`` adds model settings,
    ``int4`` the plugin's settings."""
    return config_from_mapping(
        {
            "model": {
                "source": source,
                "device": device,
                "dtype": dtype,
                "max_model_len": max_model_len,
                **model,
            },
            "cache": {"num_blocks": num_blocks},
            "runner": runner or {},
            "plugins": {
                "settings": {
                    "tallow-attention-triton": {"num_splits": 4},
                    "tallow-quant-int4": int4 or {},
                }
            },
        }
    )


def engine(source: str, **kwargs: Any) -> LLMEngine:
    return LLMEngine.from_config(settings(source, **kwargs))


def greedy(eng: LLMEngine, prompts: list[list[int]], steps: int) -> list[list[int]]:
    """The greedy completions of ``prompts``, submitted together, in order."""
    params = SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True)
    ids = []
    for prompt in prompts:
        ids.append(eng.next_request_id())
        eng.add_request(ids[-1], prompt, params)
    done = {}
    while eng.has_unfinished():
        for out in eng.step():
            if out.finished:
                done[out.request_id] = list(out.outputs[0].token_ids)
    return [done[i] for i in ids]
