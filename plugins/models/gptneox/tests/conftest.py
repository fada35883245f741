"""Tiny random GPT-NeoX checkpoints and the two sides of a parity test.

``save_tiny`` writes what transformers writes (config.json, model.safetensors) plus a
word-level tokenizer (token ``i`` is the word ``t<i>``), so tallow's engine can load the
directory like any model; ``hf_greedy`` and ``tallow_greedy`` run the same prompt through
transformers and through ``tallow.LLM`` and return what a parity test compares.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

STEPS = 20
TOP = 20  # alternatives per position (the engine's limit): the logits compared at each step
PROMPT = [3, 17, 250, 9, 64, 128, 5, 77, 31, 200, 1, 42]


def randomize_(model: torch.nn.Module, seed: int, std: float = 0.3) -> None:
    """Random values for every parameter, norms and biases included (transformers initialises
    them to constants, which would hide a bias loaded in the wrong place). ``std`` is large
    enough that the logits depend on the input and greedy output is not one repeated token."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * noise)
            else:
                p.copy_(std * noise)


#: small shapes per model type; tests override single fields
TINY = {
    "gpt_neox": dict(hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                     num_attention_heads=4, vocab_size=256, rotary_pct=0.5,
                     max_position_embeddings=128),
    "stablelm": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                     partial_rotary_factor=0.5, max_position_embeddings=128),
}


def save_tiny(path: Path, seed: int = 0, std: float = 0.3, model_type: str = "gpt_neox",
              **overrides: Any) -> Any:
    """A random transformers model of ``model_type`` saved with a tokenizer at ``path``
    (``overrides`` are config fields; ``std`` as in :func:`randomize_`)."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    settings = dict(TINY[model_type], bos_token_id=None, eos_token_id=None, pad_token_id=None)
    config = transformers.AutoConfig.for_model(model_type, **{**settings, **overrides})
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager",
                                                          dtype=torch.float32)
    randomize_(model, seed, std)
    if config.tie_word_embeddings:
        model.tie_weights()
    model.eval()
    model.save_pretrained(str(path))
    words = {f"t{i}": i for i in range(config.vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(path / "tokenizer.json"))
    return model


def as_hub_config(path: Path) -> dict[str, Any]:
    """Rewrite ``config.json`` with the rotary keys of the GPT-NeoX / Pythia files on the hub
    (``rotary_pct``, ``rotary_emb_base``) in place of newer transformers' ``rope_parameters``."""
    file = path / "config.json"
    config = json.loads(file.read_text())
    rope = config.pop("rope_parameters")
    config["rotary_pct"] = rope["partial_rotary_factor"]
    config["rotary_emb_base"] = rope["rope_theta"]
    file.write_text(json.dumps(config))
    return config


@dataclass
class Run:
    """Greedy decoding of one prompt: the tokens, and log-probabilities per position."""

    tokens: list[int]
    steps: list[dict[int, float]]  # per generated token: token id -> logprob
    prompt: list[dict[int, float]]  # per prompt position after the first


def hf_greedy(model: Any, prompt: list[int], steps: int = STEPS) -> tuple[Run, torch.Tensor]:
    """transformers' greedy tokens, and its log-softmax over the prompt followed by them."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=steps, min_new_tokens=steps, do_sample=False)
        tokens = out[0, len(prompt):].tolist()
        logprobs = torch.log_softmax(model(out).logits[0].float(), dim=-1)
    return Run(tokens, [], []), logprobs


def _plain(position: dict[int, Any] | None) -> dict[int, float]:
    return {tok: lp.logprob for tok, lp in (position or {}).items()}


def tallow_greedy(llm: Any, prompt: list[int], steps: int = STEPS) -> Run:
    """``llm``'s greedy tokens with the top-``TOP`` logprobs of every step and prompt position."""
    from tallow import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True, logprobs=TOP,
                            prompt_logprobs=TOP)
    out = llm.generate(prompt, params)[0]
    completion = out.outputs[0]
    return Run(completion.token_ids, [_plain(p) for p in completion.logprobs],
               [_plain(p) for p in out.prompt_logprobs[1:]])


def assert_logprobs_close(ours: list[dict[int, float]], ref: torch.Tensor, what: str,
                          atol: float = 2e-4) -> None:
    """Each position's reported logprobs equal the reference row's at the same tokens, and
    the top ``TOP`` tokens are the reference's (so the whole distribution's head agrees)."""
    assert len(ours) == ref.shape[0], f"{what}: {len(ours)} positions, expected {ref.shape[0]}"
    for i, (position, row) in enumerate(zip(ours, ref)):
        tokens = torch.tensor(list(position))
        err = float((torch.tensor(list(position.values())) - row[tokens]).abs().max())
        assert err <= atol, f"{what}, position {i}: max |logprob diff| {err:.2e} > {atol:.0e}"
        top = set(row.topk(TOP).indices.tolist())
        assert top <= set(position), f"{what}, position {i}: top-{TOP} tokens differ"


def assert_greedy_parity(path: Path, hf: Any, what: str, prompt: list[int] = PROMPT) -> None:
    """``tallow.LLM`` on the checkpoint at ``path`` decodes ``prompt`` as transformers' ``hf``
    does: the same greedy tokens, not all one token, and log-probabilities that agree at every
    prompt position and every step."""
    from tallow import LLM

    ref, ref_logprobs = hf_greedy(hf, prompt)
    ours = tallow_greedy(LLM(model=str(path), max_model_len=128), prompt)
    assert ours.tokens == ref.tokens, f"{what}: greedy tokens differ"
    # a model that ignores its input predicts one token over and over
    assert len(set(ref.tokens)) > 1, f"{what}: greedy output is constant; weights too small"
    assert_logprobs_close(ours.prompt, ref_logprobs[:len(prompt) - 1], f"{what}: prompt")
    assert_logprobs_close(ours.steps, ref_logprobs[len(prompt) - 1:-1], f"{what}: steps")


@pytest.fixture
def neox() -> SimpleNamespace:
    """The helpers above, for test modules (which cannot import conftest by name)."""
    return SimpleNamespace(save_tiny=save_tiny, as_hub_config=as_hub_config, hf_greedy=hf_greedy,
                           tallow_greedy=tallow_greedy, assert_logprobs_close=assert_logprobs_close,
                           assert_greedy_parity=assert_greedy_parity, PROMPT=PROMPT, STEPS=STEPS)
