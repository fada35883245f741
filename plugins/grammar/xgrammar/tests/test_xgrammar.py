"""The xgrammar backend beyond the suite: what it refuses (and where), what xgrammar enforces
of what it accepts, and walks over the served model's real vocabulary."""

from __future__ import annotations

import json
import random

import pytest
import torch

from tallow.plugin import GrammarError, GrammarSpec, TokenizerInfo
from tallow.plugin.testing.grammar_backend import allowed_ids, closing_tokens, walk_to_end
from tallow_grammar_xgrammar.backend import XGrammarBackend


@pytest.fixture(scope="module")
def bytes_backend() -> XGrammarBackend:
    """A vocabulary of the 256 single bytes and an EOS: any text can be fed exactly."""
    pieces = tuple(bytes([b]) for b in range(256)) + (None,)
    return XGrammarBackend(
        TokenizerInfo(vocab_size=len(pieces), token_bytes=pieces, eos_token_ids=(256,))
    )


def completes(backend: XGrammarBackend, schema: dict, text: str) -> bool:
    """Whether the grammar of ``schema`` takes ``text`` whole and may end there."""
    matcher = backend.matcher(backend.compile(GrammarSpec.json_schema(schema)))
    if not all(matcher.accept(b) for b in text.encode()):
        return False
    return matcher.is_terminated() or matcher.accept(256)


# Schemas whose keyword xgrammar 0.2.9 would skip, with a text the schema rejects that the
# grammar would let through; the backend must refuse each, naming the keyword.
SKIPPED = [
    ({"minimum": 5}, "1", "minimum"),
    ({"maxLength": 2}, '"abcd"', "maxLength"),
    (
        {"type": "object", "properties": {"p": {"pattern": "^a$"}}},
        '{"p":"b"}',
        "properties.p.pattern",
    ),
    ({"maxItems": 1}, "[1,2]", "maxItems"),
    ({"required": ["x"]}, "{}", "required"),
    ({"enum": [1, 2], "minimum": 2}, "1", "minimum"),
    ({"const": "a", "maxLength": 0}, '"a"', "maxLength"),
    ({"type": "integer", "enum": [1, "a"]}, '"a"', "type"),
    ({"anyOf": [{"type": "integer"}], "minimum": 3}, "1", "minimum"),
    ({"$defs": {"a": {"type": "integer"}}, "$ref": "#/$defs/a", "minimum": 3}, "1", "minimum"),
    ({"type": "number", "multipleOf": 0.5}, "0.3", "multipleOf"),
    ({"type": "string", "format": "email", "maxLength": 3}, '"a@bcdefg.com"', "maxLength"),
    ({"type": "string", "pattern": "^a+$", "maxLength": 2}, '"aaaa"', "maxLength"),
    (
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "b"]},
        '{"a":1}',
        "required",
    ),
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "[1,1]", "uniqueItems"),
    ({"anyOf": [{"type": "string", "pattern": "(?=x)y"}]}, '"y"', "anyOf[0].pattern"),
    ({"type": "string", "format": "idn-email"}, '"x"', "format"),
]


@pytest.mark.parametrize("schema,text,path", SKIPPED, ids=[p for _, _, p in SKIPPED])
def test_skipped_keywords_are_refused_with_their_path(bytes_backend, schema, text, path):
    import jsonschema

    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    validator = jsonschema.Draft202012Validator(schema, format_checker=checker)
    assert list(validator.iter_errors(json.loads(text))) or path == "format", (
        "the example must be invalid"
    )
    with pytest.raises(GrammarError) as info:
        bytes_backend.compile(GrammarSpec.json_schema(schema))
    assert info.value.path == path
    assert "xgrammar" in info.value.problem


# What the accepted keywords rule out: texts each schema rejects, which the grammar must not
# let through (xgrammar enforcing them is what the refusals above rely on).
ENFORCED = [
    ({"properties": {"x": {"type": "integer"}}, "required": ["x"]}, "{}"),
    ({"type": "integer", "minimum": 0, "maximum": 10}, "11"),
    ({"type": "number", "minimum": 1.5, "maximum": 2.5}, "1.4"),
    ({"type": "number", "exclusiveMaximum": 2.5}, "2.5"),
    ({"type": "integer", "multipleOf": 7}, "8"),
    ({"type": "string", "minLength": 3}, '"ab"'),
    ({"type": ["string", "null"], "maxLength": 2}, '"abc"'),
    ({"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}, '"AB-12"'),
    ({"type": "string", "format": "date"}, '"2024-1-5"'),
    ({"type": "string", "enum": ["a", "b"]}, '"c"'),
    ({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2}, "[]"),
    ({"type": "array", "prefixItems": [{"type": "integer"}], "items": False}, "[1,2]"),
    ({"type": "object", "additionalProperties": {"type": "integer"}}, '{"b":"x"}'),
    (
        {
            "type": "object",
            "patternProperties": {"^x": {"type": "integer"}},
            "additionalProperties": False,
        },
        '{"xa":"s"}',
    ),
    (
        {
            "type": "object",
            "propertyNames": {"pattern": "^[a-z]+$"},
            "additionalProperties": {"type": "integer"},
        },
        '{"A":1}',
    ),
    (
        {"type": "object", "maxProperties": 1, "additionalProperties": {"type": "integer"}},
        '{"a":1,"b":2}',
    ),
    (
        {
            "$defs": {
                "n": {
                    "type": "object",
                    "properties": {"next": {"anyOf": [{"$ref": "#/$defs/n"}, {"type": "null"}]}},
                    "required": ["next"],
                    "additionalProperties": False,
                }
            },
            "$ref": "#/$defs/n",
        },
        '{"next":{"next":1}}',
    ),
]


@pytest.mark.parametrize("schema,text", ENFORCED)
def test_accepted_keywords_are_enforced(bytes_backend, schema, text):
    import jsonschema

    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    validator = jsonschema.Draft202012Validator(schema, format_checker=checker)
    assert list(validator.iter_errors(json.loads(text)))
    assert not completes(bytes_backend, schema, text)


def test_json_masks_never_allow_control_characters(bytes_backend):
    # xgrammar's length-bounded string rule lets raw control characters into a string
    for schema in (
        {"type": "string", "maxLength": 5},
        {"type": "string", "minLength": 1},
        {"type": "object", "additionalProperties": {"type": "string"}},
    ):
        matcher = bytes_backend.matcher(bytes_backend.compile(GrammarSpec.json_schema(schema)))
        for b in b'{"k":"' if schema["type"] == "object" else b'"':
            assert matcher.accept(b)
        mask = torch.full((1, bytes_backend.tokenizer.bitmask_words), -1, dtype=torch.int32)
        matcher.fill_bitmask(mask, 0)
        allowed = allowed_ids(mask[0], 257)
        assert not allowed & set(range(32)), sorted(allowed & set(range(32)))
        assert ord("a") in allowed


def test_json_strings_hold_no_surrogates_within_or_across_tokens():
    # xgrammar's string rule takes ED A0..BF (a UTF-16 surrogate in UTF-8's form, not UTF-8):
    # decoded, its three bytes are three replacement characters, so maxLength would fail
    pieces = tuple(bytes([b]) for b in range(256)) + (b"\xed\xa0\x80", b"\xed\x9f\xbf") + (None,)
    eos = len(pieces) - 1
    backend = XGrammarBackend(
        TokenizerInfo(vocab_size=len(pieces), token_bytes=pieces, eos_token_ids=(eos,))
    )
    words = backend.tokenizer.bitmask_words
    compiled = backend.compile(GrammarSpec.json_schema({"type": "string", "maxLength": 3}))

    def allowed(matcher) -> set[int]:
        mask = torch.full((1, words), -1, dtype=torch.int32)
        matcher.fill_bitmask(mask, 0)
        return allowed_ids(mask[0], len(pieces))

    matcher = backend.matcher(compiled)
    assert matcher.accept(ord('"'))
    assert 256 not in allowed(matcher) and 257 in allowed(matcher)  # within a token
    assert matcher.accept(0xED)
    after_lead = allowed(matcher)
    assert not after_lead & set(range(0xA0, 0xC0))  # across tokens
    assert set(range(0x80, 0xA0)) <= after_lead
    matchers = [backend.matcher(compiled) for _ in range(backend.settings.parallel_rows)]
    for other in matchers:
        assert other.accept(ord('"')) and other.accept(0xED)
    batch = torch.full((len(matchers), words), -1, dtype=torch.int32)
    backend.fill_bitmasks(matchers, batch, range(len(matchers)))
    assert all(allowed_ids(row, len(pieces)) == after_lead for row in batch)
    matcher.rollback(1)  # back to the opening quote: the rule no longer applies
    assert not matcher.after_surrogate_lead
    assert matcher.accept(0xED) and matcher.accept(0x9F) and matcher.accept(0xBF)
    assert matcher.accept(ord('"'))
    assert matcher.is_terminated() or matcher.accept(eos)


def test_batched_fill_clears_control_characters_of_json_rows_only(bytes_backend):
    # enough rows for the batched path; JSON rows in runs and alone, regex rows between them
    json_grammar = bytes_backend.compile(
        GrammarSpec.json_schema({"type": "string", "maxLength": 5})
    )
    regex_grammar = bytes_backend.compile(GrammarSpec("regex", "[\\x00-\\x7f]*"))
    kinds = "jjjrjjrrjrjjj"
    matchers = [bytes_backend.matcher(json_grammar if k == "j" else regex_grammar) for k in kinds]
    for matcher, kind in zip(matchers, kinds):
        if kind == "j":
            assert matcher.accept(ord('"'))
    rows = [3, 4, 5, 0, 7, 8, 1, 2, 10, 9, 12, 13, 14]
    words = bytes_backend.tokenizer.bitmask_words
    batch = torch.full((16, words), -1, dtype=torch.int32)
    assert len(matchers) >= bytes_backend.settings.parallel_rows
    bytes_backend.fill_bitmasks(matchers, batch, rows)
    for matcher, kind, row in zip(matchers, kinds, rows):
        own = torch.full((1, words), -1, dtype=torch.int32)
        matcher.fill_bitmask(own, 0)
        assert torch.equal(batch[row], own[0]), row
        control = allowed_ids(batch[row], 257) & set(range(32))
        assert bool(control) == (kind == "r"), (row, kind)
    assert torch.equal(batch[[6, 11, 15]], torch.full((3, words), -1, dtype=torch.int32))


def test_choice_with_quotes_and_control_characters(bytes_backend):
    choices = ('say "hi"', "back\\slash", "tab\tnew\nline", "é")
    compiled = bytes_backend.compile(GrammarSpec("choice", choices))
    for choice in choices:
        matcher = bytes_backend.matcher(compiled)
        assert all(matcher.accept(b) for b in choice.encode())
        assert matcher.is_terminated()


# -- the served model's vocabulary -----------------------------------------------------------


@pytest.fixture(scope="module")
def qwen_backend() -> XGrammarBackend:
    from tallow.default_model import default_model_path
    from tallow.engine.token_bytes import tokenizer_info
    from tallow.engine.tokenizer import Tokenizer
    from tallow.plugin.testing import isolated_plugin_manager

    pm = isolated_plugin_manager(("tallow-format-gguf", "tallow_format_gguf.plugin"))
    checkpoint = pm.registries.weight_formats.get("gguf")().load(str(default_model_path()))
    tokenizer = Tokenizer.from_checkpoint(checkpoint)
    vocab = int(checkpoint.config["vocab_size"])
    return XGrammarBackend(tokenizer_info(tokenizer, vocab))


REAL_SCHEMAS = [
    {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 12},
            "temperature": {"type": "number", "minimum": -50, "maximum": 60},
            "unit": {"enum": ["C", "F"]},
        },
        "required": ["city", "temperature", "unit"],
        "additionalProperties": False,
    },
    {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {
                "id": {"type": "integer", "minimum": 1, "maximum": 999},
                "tags": {
                    "type": "array",
                    "items": {"type": "string", "maxLength": 6},
                    "maxItems": 2,
                },
            },
            "required": ["id"],
            "additionalProperties": False,
        },
        "minItems": 1,
        "maxItems": 3,
    },
    {"type": "string", "format": "uuid"},
]


def test_random_walks_over_the_real_vocabulary_validate(qwen_backend):
    import jsonschema

    closing = closing_tokens(qwen_backend.tokenizer)
    rng = random.Random(0)
    for schema in REAL_SCHEMAS:
        compiled = qwen_backend.compile(GrammarSpec.json_schema(schema))
        finished = 0
        for _ in range(6):
            text = walk_to_end(
                qwen_backend, compiled, rng, max_tokens=400, prefer=closing, prefer_rate=0.6
            )
            if text is not None:
                jsonschema.validate(json.loads(text.decode("utf-8")), schema)
                finished += 1
        assert finished >= 3, f"{schema}: {finished} of 6 walks finished"


def test_the_kits_walk_ends_validates_and_catches_byteless_tokens(bytes_backend):
    """``walk_to_end`` returns the text a grammar ended, None when its tokens run out, and
    fails a mask that allows a token without bytes."""
    choice = bytes_backend.compile(GrammarSpec("choice", ("yes", "no")))
    rng = random.Random(1)
    assert walk_to_end(bytes_backend, choice, rng, max_tokens=10) in (b"yes", b"no")
    assert walk_to_end(bytes_backend, choice, rng, max_tokens=1) is None

    # the backend's idea of the vocabulary loses the bytes of "a" after xgrammar was built
    # with them, so its masks still allow it
    info = bytes_backend.tokenizer
    broken = XGrammarBackend(info)
    broken.tokenizer = TokenizerInfo(
        vocab_size=info.vocab_size,
        eos_token_ids=info.eos_token_ids,
        token_bytes=tuple(None if t == ord("a") else b for t, b in enumerate(info.token_bytes)),
    )
    with pytest.raises(AssertionError, match="without bytes"):
        walk_to_end(broken, broken.compile(GrammarSpec("regex", "a+")), rng, max_tokens=5)


def test_a_steps_tokens_accepted_at_once_as_one_by_one(bytes_backend):
    """``accept_tokens`` (one xgrammar call) leaves every matcher as ``accept`` would: refused
    tokens, a terminated matcher and the JSON rows' surrogate bookkeeping included."""
    json_grammar = bytes_backend.compile(
        GrammarSpec.json_schema({"type": "string", "maxLength": 3})
    )
    choice = bytes_backend.compile(GrammarSpec("choice", ("ab", "b")))
    eos = bytes_backend.tokenizer.eos_token_ids[0]
    # prefixes and next tokens: allowed, refused, after termination, a surrogate lead
    cases = [
        (json_grammar, b'"', ord("x")),
        (json_grammar, b'"xy"', ord("x")),
        (json_grammar, b'"x', 0xED),
        (choice, b"a", ord("b")),
        (choice, b"b", ord("a")),
        (choice, b"ab", ord("b")),
        (json_grammar, b'"xy"', eos),
        (choice, b"", ord("b")),
    ]

    def prepared():
        out = []
        for grammar, prefix, _ in cases:
            matcher = bytes_backend.matcher(grammar)
            assert all(matcher.accept(b) for b in prefix)
            out.append(matcher)
        return out

    tokens = [token for _, _, token in cases]
    single, batched = prepared(), prepared()
    expected = [m.accept(t) for m, t in zip(single, tokens)]
    assert bytes_backend.accept_tokens(batched, tokens) == expected
    assert expected == [True, False, True, True, False, False, False, True]
    ended = [m for m in prepared() if m.is_terminated()]  # a step of ended matchers only
    assert ended and bytes_backend.accept_tokens(ended, [eos] * len(ended)) == [False] * len(ended)
    words = bytes_backend.tokenizer.bitmask_words
    for one, other in zip(single, batched):
        assert one.is_terminated() == other.is_terminated()
        assert one.after_surrogate_lead == other.after_surrogate_lead
        masks = torch.zeros(2, words, dtype=torch.int32)
        one.fill_bitmask(masks, 0)
        other.fill_bitmask(masks, 1)
        assert torch.equal(masks[0], masks[1])
