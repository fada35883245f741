"""The llguidance backend beyond the suite: what it refuses (and where), what llguidance
enforces of what it accepts, and the server tests' JSON Schemas walked over the served model's
real vocabulary."""

from __future__ import annotations

import json
import random
from pathlib import Path

import jsonschema
import pytest
import torch

from tallow.plugin import GrammarError, GrammarSpec, TokenizerInfo
from tallow.plugin.testing import make_config
from tallow.plugin.testing.grammar_backend import allowed_ids, closing_tokens, walk_to_end
from tallow_grammar_llguidance.backend import LLGuidanceBackend

ROOT = Path(__file__).resolve().parents[4]
SERVER_SCHEMAS = json.loads((ROOT / "tests/server/data/json_schemas.json").read_text())
EOS = 256


def bytes_backend(**settings) -> LLGuidanceBackend:
    """A vocabulary of the 256 single bytes and an EOS: any text can be fed exactly."""
    pieces = tuple(bytes([b]) for b in range(256)) + (None,)
    config = make_config({"plugins": {"settings": {"tallow-grammar-llguidance": settings}}})
    return LLGuidanceBackend(
        TokenizerInfo(vocab_size=len(pieces), token_bytes=pieces, eos_token_ids=(EOS,)), config
    )


@pytest.fixture(scope="module")
def backend() -> LLGuidanceBackend:
    return bytes_backend()


def completes(backend: LLGuidanceBackend, schema, text: str) -> bool:
    """Whether the grammar of ``schema`` takes ``text`` whole and may end there."""
    matcher = backend.matcher(backend.compile(GrammarSpec.json_schema(schema)))
    if not all(matcher.accept(b) for b in text.encode()):
        return False
    return matcher.is_terminated() or matcher.accept(EOS)


def allowed(backend: LLGuidanceBackend, matcher) -> set[int]:
    mask = torch.full((1, backend.tokenizer.bitmask_words), -1, dtype=torch.int32)
    matcher.fill_bitmask(mask, 0)
    return allowed_ids(mask[0], backend.tokenizer.vocab_size)


def validator(schema) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )


# Schemas llguidance cannot enforce: each is refused, naming the keyword's place.
REFUSED = [
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "uniqueItems"),
    ({"type": "object", "properties": {"not": {"not": {"type": "string"}}}}, "properties.not.not"),
    ({"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}}, "if"),
    (
        {"anyOf": [{"type": "null"}, {"oneOf": [{"type": "integer"}, {"type": "number"}]}]},
        "anyOf[1].oneOf",
    ),
    ({"type": "array", "items": {"contains": {"const": 1}}}, "items.contains"),
    ({"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}}, "propertyNames"),
    ({"type": "object", "dependentRequired": {"a": ["b"]}}, "dependentRequired"),
    (
        {"$defs": {"o": {"type": "object", "unevaluatedProperties": False}}, "$ref": "#/$defs/o"},
        "$defs.o.unevaluatedProperties",
    ),
    (
        {"type": "object", "properties": {"e": {"type": "string", "format": "idn-email"}}},
        "properties.e.format",
    ),
    (
        {"type": "object", "patternProperties": {"(?=x)y": {"type": "integer"}}},
        "patternProperties.(?=x)y",
    ),
    ({"type": "string", "pattern": "(a)\\1"}, "pattern"),
    (
        {"type": "array", "prefixItems": [{"type": "integer"}], "additionalItems": False},
        "additionalItems",
    ),
    (
        {"type": "object", "properties": {"t": {"type": "array", "items": [{"type": "integer"}]}}},
        "properties.t.items",
    ),
    ({"$ref": "https://example.com/schema.json"}, "$ref"),
    (
        {
            "x-guidance": {"lenient": True, "coerce_one_of": True},
            "oneOf": [{"type": "integer"}, {"type": "number"}],
        },
        "oneOf",
    ),
]


@pytest.mark.parametrize("schema,path", REFUSED, ids=[p for _, p in REFUSED])
def test_unenforceable_schemas_are_refused_with_their_path(backend, schema, path):
    with pytest.raises(GrammarError) as info:
        backend.compile(GrammarSpec.json_schema(schema))
    assert info.value.path == path, str(info.value)
    assert "llguidance" in info.value.problem


# Texts each schema rejects, which the grammar must not let through: what llguidance enforces
# of the keywords it accepts (xgrammar's plugin refuses several of these).
ENFORCED = [
    ({"minimum": 5}, "1"),
    ({"maxLength": 2}, '"abcd"'),
    ({"required": ["x"]}, "{}"),
    ({"enum": [1, 2], "minimum": 2}, "1"),
    ({"type": "integer", "enum": [1, "a"]}, '"a"'),
    ({"anyOf": [{"type": "integer"}], "minimum": 3}, "1"),
    ({"$defs": {"a": {"type": "integer"}}, "$ref": "#/$defs/a", "minimum": 3}, "1"),
    ({"allOf": [{"type": "integer"}, {"minimum": 3}]}, "1"),
    ({"type": "number", "multipleOf": 0.5}, "0.3"),
    ({"type": "string", "format": "email", "maxLength": 3}, '"a@bcdefg.com"'),
    ({"type": "string", "pattern": "^a+$", "maxLength": 2}, '"aaaa"'),
    (
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "b"]},
        '{"a":1}',
    ),
    ({"type": "string", "format": "date"}, '"2024-02-30"'),
    ({"type": "string", "format": "uuid"}, '"x"'),
    ({"type": "number", "exclusiveMinimum": 1.5}, "1.5"),
    ({"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}, '"AB-12"'),
    ({"enum": [{"a": 1}, [1, 2]]}, '{"a":2}'),
    (
        {"type": "object", "minProperties": 2, "additionalProperties": {"type": "integer"}},
        '{"a":1}',
    ),
    (
        {
            "type": "object",
            "patternProperties": {"^x": {"type": "integer"}},
            "additionalProperties": False,
        },
        '{"xa":"s"}',
    ),
    ({"type": "array", "prefixItems": [{"type": "integer"}], "items": False}, "[1,2]"),
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
    ({"x-guidance": {"lenient": True}, "type": "integer", "maximum": 3}, "4"),
    # oneOf of alternatives no value can match both of: llguidance takes it as anyOf, exactly
    ({"oneOf": [{"type": "integer"}, {"type": "string"}]}, "true"),
]


@pytest.mark.parametrize("schema,text", ENFORCED)
def test_accepted_keywords_are_enforced(backend, schema, text):
    assert list(validator(schema).iter_errors(json.loads(text))), "the example must be invalid"
    assert not completes(backend, schema, text)
    assert completes(backend, {"type": "integer"}, "12")  # the helper does accept


def test_json_is_compact_unless_any_whitespace():
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "x-guidance": {"whitespace_flexible": True},
    }  # the schema cannot switch it on
    whitespace = set(b" \t\n\r")
    for settings, spaced in (({}, False), ({"any_whitespace": True}, True)):
        backend = bytes_backend(**settings)
        matcher = backend.matcher(backend.compile(GrammarSpec.json_schema(schema)))
        assert matcher.accept(ord("{"))
        assert bool(allowed(backend, matcher) & whitespace) == spaced
        assert completes(backend, schema, '{"a":1}')
        assert completes(backend, schema, '{ "a": 1 }') == spaced


def test_json_strings_hold_no_control_characters_nor_surrogates():
    pieces = tuple(bytes([b]) for b in range(256)) + (None, b"\xed\xa0\x80", b"\xed\x9f\xbf")
    backend = LLGuidanceBackend(
        TokenizerInfo(vocab_size=len(pieces), token_bytes=pieces, eos_token_ids=(EOS,))
    )
    matcher = backend.matcher(
        backend.compile(GrammarSpec.json_schema({"type": "string", "maxLength": 3}))
    )
    assert matcher.accept(ord('"'))
    first = allowed(backend, matcher)
    assert not first & set(range(32)) and 257 not in first and 258 in first
    assert matcher.accept(0xED)
    after_lead = allowed(backend, matcher)
    assert not after_lead & set(range(0xA0, 0xC0)) and set(range(0x80, 0xA0)) <= after_lead


def test_forced_text_allows_every_token_that_continues_it(backend):
    # llguidance would allow only its own tokenization of bytes the grammar forces
    pieces = tuple(bytes([b]) for b in range(256)) + (None, "é😀".encode(), b"\xf0\x9f")
    split = LLGuidanceBackend(
        TokenizerInfo(vocab_size=len(pieces), token_bytes=pieces, eos_token_ids=(EOS,))
    )
    matcher = split.matcher(split.compile(GrammarSpec("choice", ("é😀",))))
    assert allowed(split, matcher) == {0xC3, 257}
    assert matcher.accept(0xC3) and matcher.accept(0xA9)
    assert allowed(split, matcher) == {0xF0, 258}
    assert matcher.accept(258) and matcher.accept(0x98) and matcher.accept(0x80)
    assert matcher.is_terminated()


def test_every_eos_token_ends_a_complete_text():
    pieces = tuple(bytes([b]) for b in range(256)) + (None, None)
    backend = LLGuidanceBackend(
        TokenizerInfo(vocab_size=len(pieces) + 3, token_bytes=pieces, eos_token_ids=(257, 256))
    )
    compiled = backend.compile(GrammarSpec("regex", "ab+"))
    for eos in (256, 257):
        matcher = backend.matcher(compiled)
        assert not {256, 257} & allowed(backend, matcher)
        assert matcher.accept(ord("a")) and matcher.accept(ord("b"))
        assert allowed(backend, matcher) == {ord("b"), 256, 257}
        assert matcher.accept(eos) and matcher.is_terminated()
        matcher.rollback(1)  # the EOS, and with it the termination, is undone
        assert not matcher.is_terminated() and matcher.accept(ord("b"))


def test_gbnf_grammars_and_their_errors(backend):
    compiled = backend.compile(GrammarSpec("grammar", 'root ::= "a" [0-9]+ ("," "b")?'))
    matcher = backend.matcher(compiled)
    assert all(matcher.accept(b) for b in b"a12,b") and matcher.is_terminated()
    for bad in ('root ::= "a', "root ::= missing", 'other ::= "a"'):
        with pytest.raises(GrammarError):
            backend.compile(GrammarSpec("grammar", bad))


# -- the served model's vocabulary -----------------------------------------------------------


@pytest.fixture(scope="module")
def qwen_backend() -> LLGuidanceBackend:
    from tallow.default_model import default_model_path
    from tallow.engine.token_bytes import tokenizer_info
    from tallow.engine.tokenizer import Tokenizer
    from tallow.plugin.testing import isolated_plugin_manager

    pm = isolated_plugin_manager(("tallow-format-gguf", "tallow_format_gguf.plugin"))
    checkpoint = pm.registries.weight_formats.get("gguf")().load(str(default_model_path()))
    tokenizer = Tokenizer.from_checkpoint(checkpoint)
    return LLGuidanceBackend(tokenizer_info(tokenizer, int(checkpoint.config["vocab_size"])))


@pytest.mark.parametrize("case", SERVER_SCHEMAS, ids=[c["name"] for c in SERVER_SCHEMAS])
def test_server_schemas_walked_over_the_real_vocabulary_validate(qwen_backend, case):
    schema = case["schema"]
    compiled = qwen_backend.compile(GrammarSpec.json_schema(schema))
    closing = closing_tokens(qwen_backend.tokenizer)
    rng = random.Random(case["name"])
    finished = 0
    for _ in range(3):
        text = walk_to_end(qwen_backend, compiled, rng, max_tokens=300, prefer=closing)
        if text is not None:
            validator(schema).validate(json.loads(text.decode("utf-8")))
            finished += 1
    assert finished >= 1, f"{case['name']}: no walk finished"
