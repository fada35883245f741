"""The tool-parser suite: whole parse of sample responses, streaming = whole parse under
seeded random chunkings, plain text stays content, unknown tools are content, malformed input
never raises out of the parser.

::

    class TestMyParser(ToolParserConformance):
        distribution = "tallow-tool-mine"
        component = "mine"
        examples = [
            ('Sure.\\nCALL get_weather {"city": "Paris"}\\n', [("get_weather", {"city": "Paris"})]),
        ]

:attr:`ToolParserConformance.examples` are responses written the way the parser's models
write calls, each with the calls it holds (name, arguments). Malformed variants are derived
from them: every truncation, and seeded random deletions, insertions and repeats.
"""

from __future__ import annotations

import json
import random
import zlib
from typing import Any, ClassVar

import pytest

from ..tool_parsing import ParseResult, ToolParser, assemble
from . import assert_streaming_matches_parse
from .component import ComponentConformance

#: a model output and the calls (name, arguments) a parser must find in it
Example = tuple[str, list[tuple[str, dict[str, Any]]]]

#: text without any tool call markup that every parser must leave as content, exactly
PLAIN_TEXTS = [
    "The weather in Paris is mild today.",
    "Here is the code:\n```python\ndef add(a, b):\n    return a + b\n```\n",
    "Steps:\n1. open the file\n2. read {it} [carefully]\n",
    'A JSON answer would be {"temperature": 21} but I am not sure.',
    "Unicode: café, 東京, 😀 — and <b>bold</b> text.",
    "",
    "   \n",
]
_NOISE = ["<", ">", "{", "}", "[", "]", '"', "\\", ":", ",", "\n", " ", "é", "😀", "</", "/"]


class ToolParserConformance(ComponentConformance):
    registry_kind = "tool_parsers"
    base_class = ToolParser

    #: (response, [(tool name, arguments), ...]) as the parser's models write them
    examples: ClassVar[list[Example]] = []
    #: texts that must stay content (default: :data:`PLAIN_TEXTS`)
    plain_texts: ClassVar[list[str]] = PLAIN_TEXTS
    #: seeded random chunkings per text
    chunkings: ClassVar[int] = 20
    #: seeded random mutations per example
    mutations: ClassVar[int] = 40
    #: False for a format that cannot tell a known tool from an unknown one
    refuses_unknown_tools: ClassVar[bool] = True

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "example" in metafunc.fixturenames:
            if not self.examples:
                raise AssertionError(
                    f"{type(self).__name__}: set 'examples' to responses "
                    "holding tool calls in the parser's format"
                )
            metafunc.parametrize(
                "example", self.examples, ids=[f"example{i}" for i in range(len(self.examples))]
            )
        if "plain" in metafunc.fixturenames:
            metafunc.parametrize(
                "plain", self.plain_texts, ids=[f"plain{i}" for i in range(len(self.plain_texts))]
            )

    @pytest.fixture(scope="class")
    def parser(self, component_class: type[ToolParser]) -> ToolParser:
        return component_class()

    def tools(self) -> list[dict[str, Any]]:
        """OpenAI tool definitions of every name the examples call."""
        names = sorted({name for _, calls in self.examples for name, _ in calls})
        return [
            {
                "type": "function",
                "function": {
                    "name": n,
                    "description": f"the {n} tool",
                    "parameters": {"type": "object"},
                },
            }
            for n in names
        ]

    def test_examples_parse_to_their_calls(self, parser: ToolParser, example: Example) -> None:
        text, calls = example
        for tools in (self.tools(), None):
            result = parser.parse(text, tools)
            assert isinstance(result, ParseResult)
            got = [(c.name, _arguments(c.arguments)) for c in result.tool_calls]
            assert got == [(n, a) for n, a in calls], f"parsing {text!r} with tools={tools}"
            assert len({c.id for c in result.tool_calls}) == len(result.tool_calls)

    def test_streaming_equals_whole_parse(self, parser: ToolParser, example: Example) -> None:
        _check_streaming(parser, example[0], self.tools(), self.chunkings)

    def test_plain_text_is_content(self, parser: ToolParser, plain: str) -> None:
        for tools in (self.tools(), None):
            result = parser.parse(plain, tools)
            assert result.tool_calls == [] and result.content == plain, (
                f"plain text {plain!r} parsed as {result!r}"
            )
        _check_streaming(parser, plain, self.tools(), self.chunkings)

    def test_unknown_tool_is_not_a_call(self, parser: ToolParser, example: Example) -> None:
        if not self.refuses_unknown_tools:
            pytest.skip("this format cannot tell a known tool from an unknown one")
        text, calls = example
        other = [
            {
                "type": "function",
                "function": {"name": "some_other_tool", "parameters": {"type": "object"}},
            }
        ]
        result = parser.parse(text, other)
        assert result.tool_calls == [], f"a call to a tool not offered was taken: {result!r}"

    def test_malformed_input_never_raises(self, parser: ToolParser, example: Example) -> None:
        text = example[0]
        rng = random.Random(zlib.crc32(text.encode()))
        variants = [text[:i] for i in range(len(text))]
        for _ in range(self.mutations):
            variants.append(_mutate(text, rng))
        tools = self.tools()
        for variant in variants:
            try:
                result = parser.parse(variant, tools)
                stream = parser.stream(tools)
                deltas = [stream.feed(c) for c in _chunks(variant, rng)] + [stream.finish()]
                assemble(deltas)
            except Exception as exc:
                raise AssertionError(
                    f"the parser raised {type(exc).__name__}: {exc} on {variant!r}"
                ) from exc
            for call in result.tool_calls:
                _arguments(call.arguments)

    def test_matches_answers_a_bool(self, component_class: type[ToolParser]) -> None:
        for name, template in (("some-model", None), ("some-model", "{{ messages }}")):
            assert isinstance(component_class.matches(name, template), bool)


def _arguments(text: str) -> dict[str, Any]:
    value = json.loads(text)
    assert isinstance(value, dict), f"arguments {text!r} are not a JSON object"
    return value


def _chunks(text: str, rng: random.Random) -> list[str]:
    out, i = [], 0
    while i < len(text):
        n = rng.randint(1, 9)
        out.append(text[i : i + n])
        i += n
    return out


def _mutate(text: str, rng: random.Random) -> str:
    chars = list(text)
    for _ in range(rng.randint(1, 3)):
        where = rng.randrange(len(chars) + 1)
        action = rng.choice(("delete", "insert", "repeat"))
        if action == "delete" and chars:
            del chars[min(where, len(chars) - 1)]
        elif action == "insert":
            chars.insert(where, rng.choice(_NOISE))
        elif chars:
            start = rng.randrange(len(chars))
            chars[start:start] = chars[start : start + rng.randint(1, 12)]
    return "".join(chars)


def _check_streaming(
    parser: ToolParser, text: str, tools: list[dict[str, Any]] | None, tries: int
) -> None:
    assert_streaming_matches_parse(parser, text, tools, tries)
