"""Structured outputs in the engine, on a tiny random model whose byte-level BPE vocabulary
makes it write anything: whatever it prefers, constrained outputs parse and validate, end
where their grammar ends, and come out the same in sync and async scheduling, after
preemptions and in any batch."""

from __future__ import annotations

import json

import pytest

from tallow import LLM, SamplingParams, StructuredOutputsParams
from tallow.engine.errors import InvalidParameter

SCHEMAS = [
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "age": {"type": "integer", "minimum": 0, "maximum": 99},
            "color": {"enum": ["red", "green", "blue"]},
        },
        "required": ["name", "age", "color"],
        "additionalProperties": False,
    },
    {
        "type": "array",
        "items": {"type": "integer", "minimum": -9, "maximum": 9},
        "minItems": 2,
        "maxItems": 4,
    },
    {"anyOf": [{"type": "boolean"}, {"type": "null"}, {"type": "string", "enum": ["yes", "no"]}]},
    {
        "$defs": {
            "p": {
                "type": "object",
                "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 50}},
                "required": ["x"],
                "additionalProperties": False,
            }
        },
        "type": "object",
        "properties": {
            "points": {
                "type": "array",
                "items": {"$ref": "#/$defs/p"},
                "minItems": 1,
                "maxItems": 2,
            }
        },
        "required": ["points"],
        "additionalProperties": False,
    },
]
PROMPTS = ["The quick brown fox", "def add(a, b):", "日本語", "Paged attention"]


def engine(tiny_llama, **kw) -> LLM:
    settings = dict(
        model=str(tiny_llama), dtype="float32", device="cpu", num_blocks=256, block_size=4
    )
    settings.update(kw)
    return LLM(**settings)


def constrained(schema, **kw) -> SamplingParams:
    return SamplingParams(
        temperature=0.0,
        max_tokens=60,
        structured_outputs=StructuredOutputsParams(json=schema),
        **kw,
    )


@pytest.fixture(scope="module", params=[True, False], ids=["async-scheduling", "sync"])
def llm(tiny_llama, request):
    return engine(tiny_llama, async_scheduling=request.param)


def _valid(text: str, schema) -> None:
    import jsonschema

    jsonschema.validate(json.loads(text), schema)


def test_json_outputs_validate_and_stop_where_the_grammar_ends(llm):
    prompts, params = [], []
    for schema in SCHEMAS:
        for prompt in PROMPTS:
            prompts.append(prompt)
            params.append(constrained(schema))
    outs = llm.generate(prompts, params)
    for i, out in enumerate(outs):
        schema = SCHEMAS[i // len(PROMPTS)]
        done = out.outputs[0]
        assert done.finish_reason == "stop", (done.text, schema)
        _valid(done.text, schema)
    free = llm.engine.core
    assert free.scheduler.num_constrained == 0
    assert free.stats()["grammar_mask_steps_total"] > 0


def test_the_batch_does_not_change_a_constrained_output(tiny_llama, llm):
    """Alone or beside other constrained and free requests, greedy tokens are the same, in
    both scheduling modes (the module's engine runs each)."""
    alone = [llm.generate(p, constrained(SCHEMAS[0]))[0].outputs[0].token_ids for p in PROMPTS[:2]]
    free = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    mixed = llm.generate(
        [PROMPTS[0], PROMPTS[2], PROMPTS[1], PROMPTS[3]],
        [constrained(SCHEMAS[0]), free, constrained(SCHEMAS[0]), constrained(SCHEMAS[1])],
    )
    assert [mixed[0].outputs[0].token_ids, mixed[2].outputs[0].token_ids] == alone
    unconstrained = llm.generate(PROMPTS[2], free)[0].outputs[0].token_ids
    assert mixed[1].outputs[0].token_ids == unconstrained


def test_preempted_sequences_resume_their_grammar(tiny_llama):
    """With a KV cache too small for the batch, sequences are preempted and recomputed; their
    grammars carry on from the tokens they have, so outputs equal those of a roomy cache."""
    roomy = engine(tiny_llama)
    params = [constrained(SCHEMAS[i % 2]) for i in range(8)]
    prompts = [PROMPTS[i % 4] * 3 for i in range(8)]
    expected = [o.outputs[0].token_ids for o in roomy.generate(prompts, params)]
    tight = engine(tiny_llama, num_blocks=40, max_model_len=120)
    outs = tight.generate(prompts, params)
    assert tight.engine.core.scheduler.num_preemptions > 0
    assert [o.outputs[0].token_ids for o in outs] == expected
    for i, out in enumerate(outs):
        _valid(out.outputs[0].text, SCHEMAS[i % 2])


def test_seeded_sampling_and_n_completions_stay_in_the_grammar(llm):
    schema = SCHEMAS[1]
    params = SamplingParams(
        temperature=1.5, top_k=50, seed=7, n=3, max_tokens=60, structured_outputs={"json": schema}
    )
    first = llm.generate(PROMPTS[0], params)[0]
    again = llm.generate(PROMPTS[0], params)[0]
    assert [o.token_ids for o in first.outputs] == [o.token_ids for o in again.outputs]
    for out in first.outputs:
        assert out.finish_reason == "stop"
        _valid(out.text, schema)


def test_regex_choice_and_grammar(llm):
    specs = [
        ({"regex": r"[a-c]{2,3}-[0-9]{2}"}, r"[a-c]{2,3}-[0-9]{2}"),
        ({"choice": ["alpha", "beta", "gamma delta"]}, None),
        ({"grammar": 'root ::= "(" [0-9] ("," [0-9])* ")"'}, r"\([0-9](,[0-9])*\)"),
    ]
    import re

    for spec, pattern in specs:
        outs = llm.generate(
            PROMPTS, SamplingParams(temperature=0.0, max_tokens=40, structured_outputs=spec)
        )
        for out in outs:
            text = out.outputs[0].text
            if pattern is None:
                assert text in spec["choice"]
            else:
                assert re.fullmatch(pattern, text), text
            assert out.outputs[0].finish_reason == "stop"


def test_a_schema_the_backend_cannot_enforce_is_refused(llm):
    params = constrained({"type": "array", "items": {"type": "integer"}, "uniqueItems": True})
    with pytest.raises(InvalidParameter, match="uniqueItems") as info:
        llm.generate(PROMPTS[0], params)
    assert info.value.field == "structured_outputs"


def test_without_a_grammar_backend_the_request_names_the_plugin(tiny_llama):
    bare = engine(
        tiny_llama, plugins={"disable": ["tallow-grammar-xgrammar", "tallow-grammar-llguidance"]}
    )
    with pytest.raises(InvalidParameter, match="tallow-grammar-xgrammar") as info:
        bare.generate(PROMPTS[0], constrained(SCHEMAS[0]))
    assert "plugins.disable" in str(info.value)
    # free requests are unaffected
    assert bare.generate(PROMPTS[0], SamplingParams(max_tokens=3))[0].outputs[0].token_ids


def test_min_tokens_cannot_be_combined():
    with pytest.raises(InvalidParameter, match="min_tokens"):
        SamplingParams(min_tokens=3, structured_outputs={"json_object": True})
    with pytest.raises(InvalidParameter, match="exactly one"):
        SamplingParams(structured_outputs={"regex": "a", "choice": ["a"]})


class Recorder:
    """A matcher that takes every token but negative ones, and remembers them."""

    def __init__(self, tokens=()):
        self.tokens: list[int] = list(tokens)

    def accept(self, token):
        if token < 0:
            return False
        self.tokens.append(token)
        return True

    def rollback(self, n):
        del self.tokens[len(self.tokens) - n :]

    def is_terminated(self):
        return False


def test_grammar_state_follows_the_sequence():
    """GrammarState.sync accepts what its matcher has not seen and rolls back what the
    sequence no longer has."""
    from tallow.engine.sampling.grammar import GrammarState

    state = GrammarState(Recorder())
    assert state.sync([5, 6, 7, 8], 3) and state.matcher.tokens == [5, 6, 7]
    assert state.sync([5, 6, 7, 8], 2) and state.matcher.tokens == [5, 6]
    assert state.sync([5, 6, 9], 3) and state.matcher.tokens == [5, 6, 9]
    assert not state.sync([5, 6, 9, -1], 4) and state.refused == -1
    assert not state.sync([5, 6, 9, 1], 4)  # a refused state stays refused


def test_a_steps_tokens_advance_their_grammars_in_one_backend_call():
    """StructuredOutputs.advance leaves every state as GrammarState.sync would; the states
    with exactly one new token go to the backend's accept_tokens together."""
    from tallow.engine.sampling.grammar import GrammarState, StructuredOutputs
    from tallow.plugin import GrammarBackend

    class Backend(GrammarBackend):
        calls: list[list[int]] = []

        def accept_tokens(self, matchers, tokens):
            self.calls.append(list(tokens))
            return super().accept_tokens(matchers, tokens)

    structured = StructuredOutputs(None, lambda: None)
    structured._backend = backend = Backend(None)
    structured.entry = object()  # a backend is loaded: no plugin lookup

    def state(accepted):
        s = GrammarState(Recorder(accepted))
        s.accepted = len(accepted)
        return s

    one, refused, behind, rolled = state([1]), state([1]), state([]), state([1, 2, 3])
    stuck = state([4])
    stuck.refused = -5
    structured.advance(
        [
            (one, [1, 2], 2),
            (refused, [1, -1], 2),
            (behind, [7, 8], 2),
            (rolled, [1, 2, 3], 2),
            (stuck, [4, 6], 2),
        ]
    )
    assert backend.calls == [[2, -1]]  # the others took GrammarState.sync's way
    assert one.matcher.tokens == [1, 2] and one.accepted == 2 and one.refused is None
    assert refused.accepted == 1 and refused.refused == -1
    assert behind.matcher.tokens == [7, 8] and behind.accepted == 2
    assert rolled.matcher.tokens == [1, 2] and rolled.accepted == 2
    assert stuck.matcher.tokens == [4] and stuck.refused == -5


def test_a_backend_takes_only_its_own_matchers_in_a_batched_call():
    """GrammarBackend.own_matchers: the check a batched accept or fill makes before it hands
    native states to its library."""
    from tallow.plugin import GrammarBackend, GrammarMatcher

    class Mine(GrammarMatcher):
        pass

    class Backend(GrammarBackend):
        matcher_type = Mine

    backend = Backend(None)
    mine = [Mine(), Mine()]
    assert backend.own_matchers(mine, "fill_bitmasks") == mine
    with pytest.raises(TypeError, match="fill_bitmasks takes this backend's matchers only"):
        backend.own_matchers([Mine(), GrammarMatcher()], "fill_bitmasks")
