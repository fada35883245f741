"""The draft speculator on the real default model (Qwen2.5-Coder-0.5B-Instruct GGUF, CPU), with
itself as the draft model: greedy outputs are the same token for token with and without the
draft, on code-editing requests and a constrained JSON one, and nearly every guess is kept
(the draft computes what the target does)."""

from __future__ import annotations

import pytest

from tallow import LLM, SamplingParams, StructuredOutputsParams
from tallow.default_model import default_model_path

pytestmark = pytest.mark.slow

MAX_TOKENS = 24
SCHEMA = {
    "type": "object",
    "properties": {
        "function": {"type": "string"},
        "arguments": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["function", "arguments"],
    "additionalProperties": False,
}
REQUESTS = [
    "Rename the variable x to total in: def f(x):\n    return x + 1",
    "Add a docstring to: def area(w, h):\n    return w * h",
]
JSON_REQUEST = "Describe def find_user(users, name) as JSON with keys function and arguments."


def test_greedy_outputs_identical_with_the_model_as_its_own_draft():
    llm = LLM(
        dtype="float32",
        device="cpu",
        max_model_len=512,
        num_blocks=96,
        speculative={
            "method": "draft",
            "draft_model": str(default_model_path()),
            "num_speculative_tokens": 4,
            "draft_kv_cache_mb": 64,
        },
    )
    core = llm.engine.core
    spec = core.spec
    assert spec is not None and type(spec.speculator).__name__ == "DraftSpeculator"
    tok = llm.get_tokenizer()
    prompts = [
        tok.encode(
            tok.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True
            ),
            add_special_tokens=False,
        )
        for text in [*REQUESTS, JSON_REQUEST]
    ]
    plain = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    constrained = SamplingParams(
        temperature=0.0,
        max_tokens=MAX_TOKENS,
        structured_outputs=StructuredOutputsParams(json=SCHEMA),
    )
    core.enable_speculation(None)
    want = [o.outputs[0].token_ids for o in llm.generate(prompts[:-1], plain)]
    want_json = llm.generate(prompts[-1:], constrained)[0].outputs[0].token_ids
    core.enable_speculation(spec)
    outs = llm.generate(prompts[:-1], plain)
    assert [o.outputs[0].token_ids for o in outs] == want
    assert spec.num_proposals >= 2 * 3
    assert spec.acceptance_rate > 0.9
    # a constrained output: guesses the grammar refuses are dropped, the output is the same
    got_json = llm.generate(prompts[-1:], constrained)[0].outputs[0]
    assert got_json.token_ids == want_json
    assert got_json.text.lstrip().startswith("{")
    bm = core.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_total_blocks
    draft = spec.speculator.draft
    assert draft.num_sequences == 0
    assert draft.blocks.num_free_blocks == draft.blocks.num_total_blocks
