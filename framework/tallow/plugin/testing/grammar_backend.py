"""The grammar-backend suite: masks checked token by token against independent oracles.

::

    class TestMyBackend(GrammarBackendConformance):
        distribution = "tallow-grammar-mine"
        component = "mine"
        refused_schemas = [({"type": "array", "uniqueItems": True}, "uniqueItems")]

Every check runs over :func:`tiny_tokenizer_info`, a vocabulary of single ASCII characters,
JSON fragments, whole words and UTF-8 characters split over several tokens, plus tokens with
no bytes (an EOS and a special token, and unused ids past the vocabulary). Matchers are driven
along seeded random walks: at each step the mask is read, a token it allows is accepted, and
the walk goes on until the matcher terminates.

- ``choice``, ``regex`` and ``grammar`` specs: every mask is compared bit for bit with what the
  spec allows (the choices' prefixes; the ``regex`` package's partial matching, for
  ``grammar`` through a regex the grammar is equivalent to), EOS exactly where the text is
  complete, termination exactly where nothing but EOS may follow.
- ``json`` specs: wherever EOS is allowed, the text parses (strict JSON) and validates against
  the schema with ``jsonschema``; walks must finish.
- Specs the backend cannot enforce raise :class:`~tallow.plugin.GrammarError` with the path
  the plugin declares (:attr:`GrammarBackendConformance.refused_schemas`); malformed ones raise
  it too, never another exception.
- ``rollback`` returns to the exact earlier masks; matchers of one compiled grammar are
  independent; ``fill_bitmasks`` equals the matchers' own fills and ``accept_tokens`` their
  own accepts; ``accept`` refuses what the mask forbids and anything after termination.

Only the kinds the backend declares in ``kinds`` are exercised; a spec of another kind must
raise :class:`~tallow.plugin.GrammarError`.
"""

from __future__ import annotations

import json
import random
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, ClassVar

import pytest
import torch

from ..grammar import (
    GRAMMAR_KINDS,
    GrammarBackend,
    GrammarError,
    GrammarMatcher,
    GrammarSpec,
    TokenizerInfo,
)
from . import make_config
from .component import ComponentConformance

if TYPE_CHECKING:
    import numpy as np

_FRAGMENTS = (
    '{"',
    '":',
    '",',
    '"}',
    "},",
    "],",
    '"]',
    '["',
    "true",
    "false",
    "null",
    "name",
    "city",
    "Paris",
    " the",
    "12",
    "3.5",
    "-1",
    "ab",
    "cd",
    "é",
    "😀",
    "\\n",
    '\\"',
    "\\u00e9",
    "AB-",
    "-0",
)
# UTF-8 characters split over tokens: é = C3 A9, 😀 = F0 9F 98 80
_SPLIT_BYTES = (b"\xc3", b"\xa9", b"\xf0\x9f", b"\x98\x80")
EOS = 0
#: ids past the vocabulary's tokens that the logits still have
PADDING_IDS = 5


def tiny_tokenizer_info() -> TokenizerInfo:
    """The suite's vocabulary (see the module docstring): id 0 is EOS, id 1 a special token."""
    pieces: list[bytes | None] = [None, None]
    pieces += [bytes([b]) for b in range(0x20, 0x7F)]
    pieces += [b"\n", b"\t"]
    pieces += [f.encode() for f in _FRAGMENTS]
    pieces += list(_SPLIT_BYTES)
    return TokenizerInfo(
        vocab_size=len(pieces) + PADDING_IDS, token_bytes=tuple(pieces), eos_token_ids=(EOS,)
    )


def allowed_ids(row: torch.Tensor, vocab_size: int) -> set[int]:
    """The token ids whose bits are set in one packed mask row."""
    bits = ((row.to(torch.int64).unsqueeze(-1) >> torch.arange(32)) & 1).flatten()
    return set(bits[:vocab_size].nonzero().flatten().tolist())


def closing_tokens(info: TokenizerInfo) -> "np.ndarray":
    """Per token id (the logits' ids): EOS, or a token under four bytes that closes a string,
    object or array. Walks that favour them (:func:`walk_to_end`) end their strings and
    arrays within a few hundred tokens of a real vocabulary."""
    import numpy as np

    eos = set(info.eos_token_ids)
    pieces = list(info.token_bytes) + [None] * (info.vocab_size - len(info.token_bytes))
    return np.array(
        [
            t in eos or (b is not None and len(b) < 4 and any(c in b for c in b'"}],'))
            for t, b in enumerate(pieces)
        ]
    )


def walk_to_end(
    backend: GrammarBackend,
    compiled: object,
    rng: random.Random,
    *,
    max_tokens: int,
    prefer: "np.ndarray | None" = None,
    prefer_rate: float = 0.7,
) -> bytes | None:
    """Drive a fresh matcher of ``compiled`` along a seeded random walk over the backend's
    vocabulary: at each step the mask must allow some token and only tokens with bytes or
    EOS; the token drawn (one of ``prefer``'s with probability ``prefer_rate`` when the mask
    allows any) must be accepted. Returns the text once an EOS or termination ends it, None
    if ``max_tokens`` ran out first. For plugin tests over a real vocabulary, where
    :class:`GrammarBackendConformance`'s exact oracles would be too slow."""
    import numpy as np

    info = backend.tokenizer
    eos = set(info.eos_token_ids)
    mask = torch.empty(1, info.bitmask_words, dtype=torch.int32)
    matcher = backend.matcher(compiled)
    text = b""
    for _ in range(max_tokens):
        matcher.fill_bitmask(mask, 0)
        bits = np.unpackbits(mask[0].numpy().view(np.uint8), bitorder="little")
        bits = bits[: info.vocab_size].astype(bool)
        choices = np.flatnonzero(bits).tolist()
        assert choices, f"the mask allows no token after {text!r}"
        bare = [t for t in choices if t not in eos and not _bytes_of(info, t)]
        assert not bare, f"the mask allows tokens without bytes after {text!r}: {bare[:8]}"
        preferred = np.flatnonzero(bits & prefer).tolist() if prefer is not None else []
        token = rng.choice(preferred if preferred and rng.random() < prefer_rate else choices)
        assert matcher.accept(token), f"the matcher refused {token} after {text!r}"
        if token not in eos:
            text += _bytes_of(info, token)
        if token in eos or matcher.is_terminated():
            return text
    return None


def _bytes_of(info: TokenizerInfo, token: int) -> bytes:
    return (info.token_bytes[token] or b"") if token < len(info.token_bytes) else b""


def _fill(matcher: GrammarMatcher, words: int) -> torch.Tensor:
    # Start from every bit set: a backend must write the whole row, clear bits included.
    mask = torch.full((1, words), -1, dtype=torch.int32)
    matcher.fill_bitmask(mask, 0)
    return mask[0].clone()


#: (pattern, texts it matches): ASCII-only patterns, so partial matching is exact per byte
REGEXES = [
    (r"[a-z]{2,4}-[0-9]+", ["ab-1", "abcd-007"]),
    (r"(ab|cd)+e?", ["abcd", "cde"]),
    (r"-?(0|[1-9][0-9]{0,2})(\.[0-9]{1,2})?", ["-0", "12", "3.5", "999.99"]),
    (r"(true|false|null)", ["true", "null"]),
    (r"\{\"name\": \"[A-Z][a-z]{1,5}\"\}", ['{"name": "Paris"}']),
]
CHOICES = [
    ["Paris", "London", "Par"],
    ['say "hi"', "tab\there", "é😀", "12", "a\\b"],
]
#: (GBNF grammar, a regex of the same language)
GRAMMARS = [
    (
        'root ::= "(" item ("," item)* ")"\nitem ::= [a-c]+ | "null"',
        r"\((([a-c]+|null)(,([a-c]+|null))*)\)",
    ),
    ('root ::= ("ab" | "cd")+ "!"?', r"(ab|cd)+!?"),
]
JSON_SCHEMAS: list[Any] = [
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    {"type": "array", "items": {"enum": ["red", "green", 1, None]}, "minItems": 1, "maxItems": 3},
    {"anyOf": [{"type": "boolean"}, {"type": "number", "minimum": -5, "maximum": 5}]},
    {
        "$defs": {
            "p": {
                "type": "object",
                "properties": {"x": {"type": "integer"}},
                "required": ["x"],
                "additionalProperties": False,
            }
        },
        "type": "array",
        "items": {"$ref": "#/$defs/p"},
        "maxItems": 2,
    },
    {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{2}$"},
    {
        "type": "object",
        "properties": {
            "city": {"const": "Paris"},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2},
        },
        "required": ["city"],
    },
    {"type": ["string", "null"], "maxLength": 4},
]


class GrammarBackendConformance(ComponentConformance):
    registry_kind = "grammar_backends"
    base_class = GrammarBackend

    #: ``plugins.settings`` of the backend's distribution for the instance under test
    settings: ClassVar[dict[str, Any]] = {}
    #: (schema, path of the GrammarError): JSON Schemas the backend cannot enforce
    refused_schemas: ClassVar[list[tuple[Any, str]]] = []
    regexes: ClassVar[list[tuple[str, list[str]]]] = REGEXES
    choices: ClassVar[list[list[str]]] = CHOICES
    grammars: ClassVar[list[tuple[str, str]]] = GRAMMARS
    json_schemas: ClassVar[list[Any]] = JSON_SCHEMAS
    #: random walks per spec, and the most tokens one may take
    walks: ClassVar[int] = 10
    max_walk: ClassVar[int] = 120

    @pytest.fixture(scope="class")
    def info(self) -> TokenizerInfo:
        return tiny_tokenizer_info()

    @pytest.fixture(scope="class")
    def backend(self, component_class: type[GrammarBackend], info: TokenizerInfo) -> GrammarBackend:
        config = make_config(
            {"plugins": {"settings": {self.distribution: self.settings}}} if self.settings else {}
        )
        return component_class(info, config)

    #: a well-formed spec of each kind, for checking that undeclared kinds are refused
    _SAMPLES = {
        "json": GrammarSpec.json_schema({"type": "integer"}),
        "regex": GrammarSpec("regex", "[a-z]+"),
        "choice": GrammarSpec("choice", ("a",)),
        "grammar": GrammarSpec("grammar", 'root ::= "a"'),
    }

    def _compiles(self, backend: GrammarBackend, kind: str) -> bool:
        """Whether the backend declares ``kind``; if it does not, it must refuse such a spec
        with a GrammarError (the engine never asks, but a backend must not pretend)."""
        if kind in backend.kinds:
            return True
        with pytest.raises(GrammarError):
            backend.compile(self._SAMPLES[kind])
        return False

    # -- declarations ---------------------------------------------------------------------
    def test_kinds_are_declared(self, backend: GrammarBackend) -> None:
        assert backend.kinds, "set 'kinds' to the spec kinds the backend compiles"
        unknown = set(backend.kinds) - set(GRAMMAR_KINDS)
        assert not unknown, f"unknown spec kinds {sorted(unknown)} (known: {GRAMMAR_KINDS})"

    def test_exported_grammars_come_back_the_same(
        self, component_class: type[GrammarBackend], backend: GrammarBackend, info: TokenizerInfo
    ) -> None:
        """With ``exports_compiled``, a grammar exported by one instance and imported by
        another (as the engine's compile worker process hands it over) gives the same masks
        along a walk."""
        if not backend.exports_compiled:
            return
        other = component_class(info, backend.config)
        for kind, spec in self._SAMPLES.items():
            if kind not in backend.kinds:
                continue
            data = backend.export_compiled(backend.compile(spec))
            assert isinstance(data, bytes), "export_compiled must return bytes"
            here = backend.matcher(backend.compile(spec))
            there = other.matcher(other.import_compiled(data))
            for _ in range(8):
                masks = torch.zeros(2, info.bitmask_words, dtype=torch.int32)
                here.fill_bitmask(masks, 0)
                there.fill_bitmask(masks, 1)
                assert torch.equal(masks[0], masks[1]), f"the imported {kind} grammar differs"
                allowed = allowed_ids(masks[0], info.vocab_size)
                token = next((t for t in sorted(allowed) if t not in info.eos_token_ids), None)
                if token is None:
                    break
                assert here.accept(token) and there.accept(token)

    # -- exact masks ----------------------------------------------------------------------
    def test_choice_masks_are_exact(self, backend: GrammarBackend, info: TokenizerInfo) -> None:
        if not self._compiles(backend, "choice"):
            return
        for choices in self.choices:
            wanted = [c.encode() for c in choices]
            spec = GrammarSpec("choice", tuple(choices))
            outputs = self._walk_exactly(
                backend,
                info,
                spec,
                viable=lambda b: any(w.startswith(b) for w in wanted),
                complete=lambda b: b in wanted,
            )
            assert set(outputs) <= set(wanted)

    def test_regex_masks_are_exact(self, backend: GrammarBackend, info: TokenizerInfo) -> None:
        if not self._compiles(backend, "regex"):
            return
        for pattern, examples in self.regexes:
            viable, complete = _regex_oracle(pattern)
            for example in examples:
                assert complete(example.encode()), f"bad suite example {example!r}"
            self._walk_exactly(backend, info, GrammarSpec("regex", pattern), viable, complete)

    def test_grammar_masks_are_exact(self, backend: GrammarBackend, info: TokenizerInfo) -> None:
        if not self._compiles(backend, "grammar"):
            return
        for grammar, pattern in self.grammars:
            viable, complete = _regex_oracle(pattern)
            self._walk_exactly(backend, info, GrammarSpec("grammar", grammar), viable, complete)

    def _walk_exactly(
        self,
        backend: GrammarBackend,
        info: TokenizerInfo,
        spec: GrammarSpec,
        viable: Callable[[bytes], bool],
        complete: Callable[[bytes], bool],
    ) -> list[bytes]:
        compiled = backend.compile(spec)
        rng = random.Random(spec.key)
        outputs = []
        for _ in range(self.walks):
            matcher = backend.matcher(compiled)
            text = b""
            for _ in range(self.max_walk):
                expected = {
                    t for t, b in enumerate(info.token_bytes) if b is not None and viable(text + b)
                }
                if complete(text):
                    expected |= set(info.eos_token_ids)
                ends = complete(text) and expected <= set(info.eos_token_ids)
                assert matcher.is_terminated() == ends, (
                    f"{spec.kind} {spec.value!r} after {text!r}: is_terminated() is "
                    f"{matcher.is_terminated()}, but {'nothing' if ends else 'more'} may follow"
                )
                if ends:
                    outputs.append(text)
                    break
                got = allowed_ids(_fill(matcher, info.bitmask_words), info.vocab_size)
                assert got == expected, (
                    f"{spec.kind} {spec.value!r} after {text!r}: the mask allows "
                    f"{_show(got - expected, info)} that it must not and misses "
                    f"{_show(expected - got, info)}"
                )
                token = _pick(rng, got, info)
                assert matcher.accept(token), f"accept({token}) refused a token the mask allows"
                if token in info.eos_token_ids:
                    assert matcher.is_terminated(), "accepting EOS did not terminate"
                    outputs.append(text)
                    break
                text += info.token_bytes[token]  # type: ignore[operator]
        return outputs

    # -- JSON -----------------------------------------------------------------------------
    def test_json_outputs_validate(self, backend: GrammarBackend, info: TokenizerInfo) -> None:
        if not self._compiles(backend, "json"):
            return
        import jsonschema

        for schema in self.json_schemas:
            spec = GrammarSpec.json_schema(schema)
            compiled = backend.compile(spec)
            rng = random.Random(spec.key)
            finished = 0
            for _ in range(self.walks):
                matcher = backend.matcher(compiled)
                text = b""
                for _ in range(self.max_walk * 2):
                    got = allowed_ids(_fill(matcher, info.bitmask_words), info.vocab_size)
                    assert got, f"{schema} after {text!r}: no token allowed"
                    empty = {
                        t for t in got if t >= len(info.token_bytes) or info.token_bytes[t] is None
                    }
                    assert empty <= set(info.eos_token_ids), (
                        f"{schema} after {text!r}: tokens without bytes {sorted(empty)} allowed"
                    )
                    if set(info.eos_token_ids) & got:
                        _assert_valid(text, schema, jsonschema)
                    token = _pick(rng, got, info, structural=True)
                    assert matcher.accept(token)
                    if token not in info.eos_token_ids:
                        text += info.token_bytes[token]  # type: ignore[operator]
                    if matcher.is_terminated():
                        _assert_valid(text, schema, jsonschema)
                        finished += 1
                        break
            assert finished >= self.walks // 2, (
                f"{schema}: only {finished} of {self.walks} walks ended within "
                f"{self.max_walk * 2} tokens"
            )

    def test_refused_schemas_name_their_part(self, backend: GrammarBackend) -> None:
        if not self._compiles(backend, "json"):
            return
        for schema, path in self.refused_schemas:
            with pytest.raises(GrammarError) as info:
                backend.compile(GrammarSpec.json_schema(schema))
            assert info.value.path == path, (
                f"{schema}: refused at {info.value.path!r} ({info.value}), expected {path!r}"
            )
            assert info.value.problem

    def test_malformed_specs_raise_grammar_error(self, backend: GrammarBackend) -> None:
        bad = {
            "regex": ["(ab", "[a-"],
            "grammar": ["root ::= (", 'item ::= "a"'],
            "json": ['{"type": "object", "properties": {"a": {"pattern": "[z"}}}'],
        }
        for kind, values in bad.items():
            if kind not in backend.kinds:
                continue
            for value in values:
                with pytest.raises(GrammarError):
                    backend.compile(GrammarSpec(kind, value))

    # -- matcher state --------------------------------------------------------------------
    def _spec(self, backend: GrammarBackend) -> GrammarSpec:
        if "json" in backend.kinds:
            return GrammarSpec.json_schema(self.json_schemas[0])
        if "regex" in backend.kinds:
            return GrammarSpec("regex", self.regexes[0][0])
        return GrammarSpec("choice", tuple(self.choices[0]))

    def test_rollback_restores_earlier_masks(
        self, backend: GrammarBackend, info: TokenizerInfo
    ) -> None:
        compiled = backend.compile(self._spec(backend))
        rng = random.Random(7)
        for _ in range(self.walks):
            matcher = backend.matcher(compiled)
            masks, tokens = [], []
            for _ in range(12):
                mask = _fill(matcher, info.bitmask_words)
                masks.append(mask)
                token = _pick(rng, allowed_ids(mask, info.vocab_size), info, structural=True)
                if token in info.eos_token_ids:
                    break
                assert matcher.accept(token)
                tokens.append(token)
                if matcher.is_terminated():
                    break
            back = rng.randint(1, len(tokens)) if tokens else 0
            matcher.rollback(back)
            at = len(tokens) - back
            assert torch.equal(_fill(matcher, info.bitmask_words), masks[at]), (
                f"after rolling back {back} of {len(tokens)} tokens the mask differs from the "
                "mask seen at that point"
            )
            assert not matcher.is_terminated() or at == len(tokens)
            for token in tokens[at:]:
                assert matcher.accept(token), "a token accepted before is refused after rollback"

    def test_matchers_of_one_grammar_are_independent(
        self, backend: GrammarBackend, info: TokenizerInfo
    ) -> None:
        compiled = backend.compile(self._spec(backend))
        first, second = backend.matcher(compiled), backend.matcher(compiled)
        start = _fill(second, info.bitmask_words)
        rng = random.Random(3)
        for _ in range(5):
            token = _pick(
                rng,
                allowed_ids(_fill(first, info.bitmask_words), info.vocab_size),
                info,
                structural=True,
            )
            if token in info.eos_token_ids or not first.accept(token) or first.is_terminated():
                break
        assert torch.equal(_fill(second, info.bitmask_words), start)

    def test_fill_bitmasks_equals_each_matchers_fill(
        self, backend: GrammarBackend, info: TokenizerInfo
    ) -> None:
        compiled = backend.compile(self._spec(backend))
        rng = random.Random(11)
        matchers = []
        for i in range(24):  # enough for a backend that fills many rows in parallel
            matcher = backend.matcher(compiled)
            for _ in range(i % 6):
                token = _pick(
                    rng,
                    allowed_ids(_fill(matcher, info.bitmask_words), info.vocab_size),
                    info,
                    structural=True,
                )
                if token in info.eos_token_ids or not matcher.accept(token):
                    break
                if matcher.is_terminated():
                    matcher.rollback(1)
                    break
            matchers.append(matcher)
        rows = list(range(len(matchers) * 2 - 1, -1, -2))  # scattered, descending
        batch = torch.full((len(matchers) * 2, info.bitmask_words), -1, dtype=torch.int32)
        backend.fill_bitmasks(matchers, batch, rows)
        for matcher, row in zip(matchers, rows):
            assert torch.equal(batch[row], _fill(matcher, info.bitmask_words))

    def test_accept_tokens_equals_each_matchers_accept(
        self, backend: GrammarBackend, info: TokenizerInfo
    ) -> None:
        compiled = backend.compile(self._spec(backend))

        def walked(seed: int) -> tuple[list[Any], list[int]]:
            """24 matchers at varied places (terminated ones among them) and a next token
            each: mostly allowed, some forbidden."""
            rng = random.Random(seed)
            matchers, tokens = [], []
            for i in range(24):
                matcher = backend.matcher(compiled)
                for _ in range(i % 7):
                    token = _pick(
                        rng,
                        allowed_ids(_fill(matcher, info.bitmask_words), info.vocab_size),
                        info,
                        structural=True,
                    )
                    if not matcher.accept(token) or matcher.is_terminated():
                        break
                allowed = allowed_ids(_fill(matcher, info.bitmask_words), info.vocab_size)
                if i % 4 == 3 or not allowed:
                    tokens.append(rng.randrange(info.vocab_size))
                else:
                    tokens.append(_pick(rng, allowed, info, structural=True))
                matchers.append(matcher)
            return matchers, tokens

        one_by_one, tokens = walked(13)
        expected = [m.accept(t) for m, t in zip(one_by_one, tokens)]
        batched, same_tokens = walked(13)
        assert same_tokens == tokens
        assert backend.accept_tokens(batched, tokens) == expected
        for alone, together in zip(one_by_one, batched):
            assert alone.is_terminated() == together.is_terminated()
            assert torch.equal(
                _fill(together, info.bitmask_words), _fill(alone, info.bitmask_words)
            )

    def test_accept_refuses_what_the_mask_forbids(
        self, backend: GrammarBackend, info: TokenizerInfo
    ) -> None:
        compiled = backend.compile(self._spec(backend))
        matcher = backend.matcher(compiled)
        mask = _fill(matcher, info.bitmask_words)
        allowed = allowed_ids(mask, info.vocab_size)
        forbidden = [t for t in range(info.vocab_size) if t not in allowed]
        assert forbidden, "the first mask allows every token"
        for token in forbidden[:: max(1, len(forbidden) // 25)]:
            assert not matcher.accept(token), f"accept({token}) took a forbidden token"
        assert torch.equal(_fill(matcher, info.bitmask_words), mask), "a refusal changed state"
        # walk to the end: afterwards nothing is accepted
        rng = random.Random(5)
        for _ in range(self.max_walk * 2):
            token = _pick(
                rng,
                allowed_ids(_fill(matcher, info.bitmask_words), info.vocab_size),
                info,
                structural=True,
            )
            assert matcher.accept(token)
            if matcher.is_terminated():
                break
        assert matcher.is_terminated(), "a walk did not terminate"
        for token in range(info.vocab_size):
            assert not matcher.accept(token), f"accept({token}) after termination"


def _regex_oracle(pattern: str) -> tuple[Callable[[bytes], bool], Callable[[bytes], bool]]:
    import regex

    compiled = regex.compile(pattern)

    def viable(text: bytes) -> bool:
        return text.isascii() and compiled.fullmatch(text.decode(), partial=True) is not None

    def complete(text: bytes) -> bool:
        return text.isascii() and compiled.fullmatch(text.decode()) is not None

    return viable, complete


def _pick(
    rng: random.Random, allowed: set[int], info: TokenizerInfo, structural: bool = False
) -> int:
    """A token the mask allows; ending, closing and short tokens are favoured so that walks
    through open-ended grammars (strings, numbers) finish."""
    choices = sorted(allowed)
    assert choices, "the mask allows no token"
    eos = [t for t in choices if t in info.eos_token_ids]
    if eos and rng.random() < 0.5:
        return eos[0]
    if structural:
        closing = [
            t
            for t in choices
            if t not in info.eos_token_ids and any(c in info.token_bytes[t] for c in b'"}],')  # type: ignore[operator]
        ]
        if closing and rng.random() < 0.5:
            return rng.choice(closing)
    return rng.choice(choices)


def _assert_valid(text: bytes, schema: object, jsonschema: ModuleType) -> None:
    try:
        value = json.loads(text.decode("utf-8"))
    except ValueError as exc:
        raise AssertionError(
            f"{schema}: the grammar allows ending {text!r}, which is not JSON ({exc})"
        ) from None
    errors = list(jsonschema.Draft202012Validator(schema).iter_errors(value))
    assert not errors, f"{schema}: the grammar allows {text!r}: {errors[0].message}"


def _show(ids: set[int], info: TokenizerInfo) -> str:
    shown = [
        repr(info.token_bytes[t]) if t < len(info.token_bytes) else f"#{t}" for t in sorted(ids)[:8]
    ]
    return "{" + ", ".join(shown) + ("..." if len(ids) > 8 else "") + "}"
