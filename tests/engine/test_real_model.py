"""The real Qwen2.5-Coder-0.5B-Instruct GGUF: tallow and transformers on the same file."""

from __future__ import annotations

import pytest
import torch

from tallow import LLM, SamplingParams

pytestmark = pytest.mark.slow

CONVERSATIONS = [
    [{"role": "user", "content": "Write a Python function that reverses a string."}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is a linked list?"},
    ],
    [{"role": "user", "content": "用一句话解释递归。"}],
]


@pytest.fixture(scope="module")
def hf_model(qwen_gguf):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        str(qwen_gguf.parent), gguf_file=qwen_gguf.name, dtype=torch.float32
    )


@pytest.fixture(scope="module")
def llm():
    return LLM(dtype="float32", device="cpu", max_model_len=2048)


def test_greedy_24_tokens_identical_to_transformers(llm, hf_model):
    tok = llm.get_tokenizer()
    prompts = [
        tok.encode(tok.apply_chat_template(c, add_generation_prompt=True), add_special_tokens=False)
        for c in CONVERSATIONS
    ]
    prompts.append(tok.encode("def fibonacci(n):"))
    # Both stop at the end-of-turn token, which each includes as its last token.
    params = SamplingParams(temperature=0.0, max_tokens=24)
    outs = llm.generate(prompts, params)
    for ids, out in zip(prompts, outs):
        ref = hf_model.generate(
            torch.tensor([ids]), max_new_tokens=24, do_sample=False, pad_token_id=0
        )[0, len(ids) :].tolist()
        assert out.outputs[0].token_ids == ref
        assert len(ref) == 24 or ref[-1] in llm.get_tokenizer().eos_token_ids


def test_chat_answers_in_text(llm):
    out = llm.chat(CONVERSATIONS[0], SamplingParams(temperature=0.0, max_tokens=40))[0]
    text = out.outputs[0].text
    assert "def " in text
