"""Prompt lookup on the real default model (Qwen2.5-Coder-0.5B-Instruct GGUF, CPU): greedy
outputs are the same token for token with and without the ``ngram`` speculator, on 19
code-editing requests and a constrained JSON one, and the speculator's guesses are kept often
enough to matter."""

from __future__ import annotations

import pytest

from tallow import LLM, SamplingParams, StructuredOutputsParams
from tallow_speculator_ngram.workload import code_edit_conversations

pytestmark = pytest.mark.slow

MAX_TOKENS = 16
SCHEMA = {
    "type": "object",
    "properties": {
        "function": {"type": "string"},
        "arguments": {"type": "array", "items": {"type": "string"}},
        "returns_none": {"type": "boolean"},
    },
    "required": ["function", "arguments", "returns_none"],
    "additionalProperties": False,
}


def prompts(llm: LLM) -> list[list[int]]:
    tok = llm.get_tokenizer()
    convs = code_edit_conversations()[:19]
    convs.append(
        [
            {
                "role": "user",
                "content": "Describe def find_user(users, name) as JSON "
                "with keys function, arguments and returns_none.",
            }
        ]
    )
    return [
        tok.encode(tok.apply_chat_template(c, add_generation_prompt=True), add_special_tokens=False)
        for c in convs
    ]


def params() -> list[SamplingParams]:
    plain = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    json_params = SamplingParams(
        temperature=0.0,
        max_tokens=MAX_TOKENS,
        structured_outputs=StructuredOutputsParams(json=SCHEMA),
    )
    return [plain] * 19 + [json_params]


def test_greedy_outputs_identical_with_prompt_lookup():
    # one engine (loading the model twice would double the test's time): first without its
    # speculator, then with it
    llm = LLM(
        dtype="float32",
        device="cpu",
        max_model_len=1024,
        num_blocks=512,
        speculative={"method": "ngram", "num_speculative_tokens": 4},
    )
    core = llm.engine.core
    spec = core.spec
    assert spec is not None and type(spec.speculator).__name__ == "NgramSpeculator"
    ids = prompts(llm)
    core.enable_speculation(None)
    want = [o.outputs[0].token_ids for o in llm.generate(ids, params())]
    assert core.stats().get("spec_num_proposals") is None
    core.enable_speculation(spec)
    outs = llm.generate(ids, params())
    assert [o.outputs[0].token_ids for o in outs] == want
    stats = core.stats()
    assert stats["spec_num_proposals"] > 30
    assert stats["spec_acceptance_rate"] > 0.3
    assert stats["spec_mean_accepted_length"] > 1.5
    constrained = outs[-1].outputs[0]
    assert constrained.text and constrained.text.lstrip().startswith("{")
    bm = core.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_total_blocks
