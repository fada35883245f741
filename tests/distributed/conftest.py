"""Fixtures of the tensor-parallel tests: tiny real checkpoints, and processes started in
sessions of their own, so that every process a test starts (servers, drivers and the workers
they spawn) is found by its process group and none outlives the test."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for folder in (
    HERE,
    ROOT / "tests" / "engine",
    ROOT / "tests" / "server",
    ROOT / "plugins" / "quant" / "gguf" / "tests",
):
    sys.path.insert(0, str(folder))

from tiny_models import save_tiny  # noqa: E402
from tp_processes import kill_group  # noqa: E402

#: GGML types of each layer of the GGUF model: every row-parallel input (attn_output: 256
#: features, ffn_down: 512) splits into whole blocks over 2 ranks; over 4, ffn_down's 128
#: features per rank are half a Q4_K block
TP2_GGUF_LAYER = {
    "attn_q": "Q4_K",
    "attn_k": "Q6_K",
    "attn_v": "Q8_0",
    "attn_output": "Q5_0",
    "ffn_gate": "Q4_K",
    "ffn_up": "Q5_K",
    "ffn_down": "Q4_K",
}


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Tiny random checkpoints: Llama with 4 query and 2 KV heads (fewer KV heads than 4
    ranks), Qwen2 (q/k/v biases), Qwen3 (per-head q/k norms), and a Llama GGUF file of
    k-quant and legacy blocks."""
    from quant_gguf_files import write_llama_gguf

    root = tmp_path_factory.mktemp("tp-models")
    heads = dict(num_attention_heads=4, num_key_value_heads=2)
    return {
        "llama": str(save_tiny(root / "llama", "llama", max_position_embeddings=2048, **heads)),
        "qwen2": str(save_tiny(root / "qwen2", "qwen2", **heads)),
        "qwen3": str(save_tiny(root / "qwen3", "qwen3", head_dim=16, **heads)),
        "gguf": str(
            write_llama_gguf(
                root / "llama-k-quants.gguf", layer_types=[TP2_GGUF_LAYER, TP2_GGUF_LAYER]
            )
        ),
    }


@pytest.fixture
def sessions() -> Iterator[list[int]]:
    """Process groups a test started; whatever is left of them is killed afterwards."""
    started: list[int] = []
    yield started
    for pgid in started:
        kill_group(pgid)


@pytest.fixture(scope="session")
def served_prompts() -> list[str]:
    """Prompts sent to the servers at once: with the tight budgets they are prefilled in
    chunks, share a cached prefix and preempt one another."""
    from tp_cases import standard_waves

    waves = standard_waves()
    return [r["prompt"] for r in waves[0][:4] + waves[1]]


@pytest.fixture(scope="session")
def served_reference(checkpoints: dict[str, str], served_prompts: list[str]) -> list[str]:
    """The TP=1 greedy completions of ``served_prompts`` (32 tokens each), as text."""
    from tallow import LLM, SamplingParams
    from tp_cases import PLUGINS, TIGHT, one_thread

    with one_thread():
        llm = LLM(model=checkpoints["llama"], plugins=PLUGINS, **TIGHT)
        outputs = llm.generate(served_prompts, SamplingParams(max_tokens=32, temperature=0.0))
    return [o.outputs[0].text for o in outputs]
