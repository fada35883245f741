"""Tiny random checkpoints, and parity through the engine for what the conformance suite
(test_conformance.py) does not cover: configs written as the hub writes them, the engine's own
scheduling of chunked prefills, and the GPU.

``save_tiny`` writes what transformers writes plus a tokenizer, so the engine loads the
directory like any model; ``hf_reference`` and ``engine_greedy`` give the two sides of a
comparison, ``assert_logprobs_close`` compares them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from tallow.plugin.testing import offline_llm, save_tokenizer
from tallow.plugin.testing.model import hf_greedy
from tallow.plugin.testing.paged_runner import randomize_

STEPS = 20
TOP = 20  # alternatives per position (the engine's limit): the logits compared at each step
PROMPT = [3, 17, 250, 9, 64, 128, 5, 77, 31, 200, 1, 42]
PLUGINS = ["tallow-model-gptneox", "tallow-format-safetensors"]

#: small shapes per model type; tests override single fields
TINY = {
    "gpt_neox": dict(
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        vocab_size=256,
        rotary_pct=0.5,
        max_position_embeddings=128,
    ),
    "stablelm": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        partial_rotary_factor=0.5,
        max_position_embeddings=128,
    ),
}


def save_tiny(
    path: Path, seed: int = 0, std: float = 0.3, model_type: str = "gpt_neox", **overrides: Any
) -> Any:
    """A transformers model of ``model_type`` with random weights of ``std`` (large enough
    that greedy output is not one repeated token), saved with a tokenizer at ``path``."""
    import transformers

    settings = dict(TINY[model_type], bos_token_id=None, eos_token_id=None, pad_token_id=None)
    config = transformers.AutoConfig.for_model(model_type, **{**settings, **overrides})
    model = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation="eager", dtype=torch.float32
    )
    randomize_(model, seed, std)
    if config.tie_word_embeddings:
        model.tie_weights()
    model.eval()
    model.save_pretrained(str(path))
    save_tokenizer(path)
    return model


def hf_reference(
    model: Any, prompt: list[int], steps: int = STEPS
) -> tuple[list[int], torch.Tensor]:
    """transformers' greedy tokens, and its log-probabilities predicting ``prompt[1:]``
    followed by those of each greedy step (``len(prompt) - 1 + steps`` rows)."""
    tokens, step_logits, prompt_logits = hf_greedy(model, prompt, steps)
    rows = torch.cat([prompt_logits[:-1], torch.stack(step_logits)]).float()
    return tokens, torch.log_softmax(rows, dim=-1)


@dataclass
class Run:
    """tallow's greedy decoding of one prompt."""

    tokens: list[int]
    steps: list[dict[int, float]]  # per generated token: token id -> logprob
    prompt: list[dict[int, float]]  # per prompt position after the first


def engine(path: Path, **config: Any) -> Any:
    """``tallow.LLM`` over the checkpoint at ``path`` with exactly this plugin and
    tallow-format-safetensors; ``config`` holds settings by section (``model={"dtype": ...}``)."""
    settings = {"model": {"max_model_len": 128}, **config}
    return offline_llm(str(path), plugins=PLUGINS, config=settings)


def engine_greedy(llm: Any, prompt: list[int], steps: int = STEPS) -> Run:
    """``llm``'s greedy tokens with the top-``TOP`` logprobs of every step and prompt position."""
    from tallow import SamplingParams

    params = SamplingParams(
        temperature=0, max_tokens=steps, ignore_eos=True, logprobs=TOP, prompt_logprobs=TOP
    )
    out = llm.generate([prompt], params)[0]

    def plain(position: dict[int, Any] | None) -> dict[int, float]:
        return {tok: lp.logprob for tok, lp in (position or {}).items()}

    completion = out.outputs[0]
    return Run(
        list(completion.token_ids),
        [plain(p) for p in completion.logprobs],
        [plain(p) for p in out.prompt_logprobs[1:]],
    )


def assert_logprobs_close(
    ours: list[dict[int, float]], ref: torch.Tensor, what: str, atol: float = 2e-4
) -> None:
    """Each position's reported logprobs equal the reference row's at the same tokens, and
    the top ``TOP`` tokens are the reference's (so the head of the distribution agrees)."""
    assert len(ours) == ref.shape[0], f"{what}: {len(ours)} positions, expected {ref.shape[0]}"
    for i, (position, row) in enumerate(zip(ours, ref)):
        tokens = torch.tensor(list(position))
        err = float((torch.tensor(list(position.values())) - row[tokens]).abs().max())
        assert err <= atol, f"{what}, position {i}: max |logprob diff| {err:.2e} > {atol:.0e}"
        top = set(row.topk(TOP).indices.tolist())
        assert top <= set(position), f"{what}, position {i}: top-{TOP} tokens differ"


@pytest.fixture
def neox() -> SimpleNamespace:
    """The helpers above, for test modules (which cannot import conftest by name)."""
    return SimpleNamespace(
        save_tiny=save_tiny,
        hf_reference=hf_reference,
        engine=engine,
        engine_greedy=engine_greedy,
        assert_logprobs_close=assert_logprobs_close,
        PROMPT=PROMPT,
        STEPS=STEPS,
    )
