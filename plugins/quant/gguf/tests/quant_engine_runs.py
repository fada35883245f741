"""Engines of the plugin's tests: built from a few settings, run greedily to completion."""

from __future__ import annotations

from typing import Any

from tallow.config import config_from_mapping
from tallow.engine.llm_engine import LLMEngine
from tallow import SamplingParams


def engine(
    source: str,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    max_model_len: int = 128,
    num_blocks: int = 32,
    keep_quantized_on_cpu: bool = False,
    disable: tuple[str, ...] = (),
    runner: dict[str, Any] | None = None,
    attention_splits: int | None = None,
    **model: Any,
) -> LLMEngine:
    """An engine serving ``source``; ``model`` adds model settings (``isq``...)."""
    settings: dict[str, dict[str, Any]] = {}
    if keep_quantized_on_cpu:
        settings["tallow-quant-gguf"] = {"cpu": True}
    if attention_splits:  # graph and eager runs then launch the same attention kernels
        settings["tallow-attention-triton"] = {"num_splits": attention_splits}
    return LLMEngine.from_config(
        config_from_mapping(
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
                "plugins": {"disable": list(disable), "settings": settings},
            }
        )
    )


def greedy(eng: LLMEngine, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """The greedy completions of ``prompts``, submitted together, in order."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
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
