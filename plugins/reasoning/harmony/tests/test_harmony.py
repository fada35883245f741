"""The harmony message reader, and the two parsers working together as the server chains them
(reasoning parser first, tool parser on its content), streamed token by token."""

from __future__ import annotations

import json
import random

import pytest
from tallow_reasoning_harmony.messages import (
    Body,
    Close,
    HarmonyReader,
    Header,
    Markup,
    Open,
    Text,
    parse_header,
)
from tallow_reasoning_harmony.reasoning import HarmonyReasoningParser
from tallow_reasoning_harmony.tools import HarmonyToolParser

from tallow.plugin import assemble

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
# gpt-oss's tokens: every special token is one token, text comes in short pieces
RESPONSE = [
    "<|channel|>",
    "analysis",
    "<|message|>",
    "Need the ",
    "weather.",
    "<|end|>",
    "<|start|>",
    "assistant",
    "<|channel|>",
    "commentary",
    " to",
    "=functions",
    ".get_weather",
    " ",
    "<|constrain|>",
    "json",
    "<|message|>",
    '{"city"',
    ':"',
    "Paris",
    '"}',
    "<|call|>",
]


def raw_of(events: list) -> str:
    out = []
    for e in events:
        out.append(e.raw if isinstance(e, Open) else e.token if isinstance(e, Close) else e.text)
    return "".join(out)


@pytest.mark.parametrize(
    "raw, header",
    [
        ("<|channel|>analysis<|message|>", Header("assistant", "analysis")),
        (
            "<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>",
            Header("assistant", "commentary", "functions.f", "json"),
        ),
        (
            "<|start|>assistant to=functions.f<|channel|>commentary json<|message|>",
            Header("assistant", "commentary", "functions.f", "json"),
        ),
        (
            " to=functions.f<|channel|>commentary<|message|>",
            Header("assistant", "commentary", "functions.f"),
        ),
        (
            "<|start|>functions.f to=assistant<|channel|>commentary<|message|>",
            Header("functions.f", "commentary", "assistant"),
        ),
    ],
)
def test_headers(raw: str, header: Header) -> None:
    assert parse_header(raw) == header


def test_function_needs_a_name() -> None:
    assert Header("assistant", recipient="functions.").function is None
    assert Header("assistant", recipient="python").function is None
    assert Header("assistant", recipient="functions.get_weather").function == "get_weather"


@pytest.mark.parametrize(
    "text",
    [
        "".join(RESPONSE),
        "plain <| not | a token <|end",
        "\n<|start|>assistant<|end|> stray <|return|><|channel|>final<|message|>ok",
        "<|channel|>analysis<|message|>a<|channel|>final<|message|>b<|start|>assistant<|chan",
    ],
)
def test_reader_events_cover_the_text_exactly(text: str) -> None:
    rng = random.Random(7)
    for _ in range(20):
        reader, events, i = HarmonyReader(), [], 0
        while i < len(text):
            n = rng.randint(1, 6)
            events += reader.feed(text[i : i + n])
            i += n
        events += reader.finish()
        assert raw_of(events) == text


def test_reader_events() -> None:
    reader = HarmonyReader()
    events = [e for piece in RESPONSE for e in reader.feed(piece)] + reader.finish()
    kinds = [type(e) for e in events]
    assert kinds[0] is Open and events[0].header.channel == "analysis"
    assert Close("<|end|>") in events and Close("<|call|>") in events
    opened = [e for e in events if isinstance(e, Open)]
    assert opened[1].header.function == "get_weather"
    assert opened[0].markup == "<|start|>assistant<|channel|>analysis<|message|>"
    assert "".join(e.text for e in events if isinstance(e, Body)) == (
        'Need the weather.{"city":"Paris"}'
    )
    assert not [e for e in events if isinstance(e, (Text, Markup))]


def chain(pieces: list[str], tools=TOOLS) -> tuple[str, str, list[tuple[str, dict]]]:
    """Reasoning, content and calls when the pieces stream through both parsers in turn."""
    rs, ts = HarmonyReasoningParser().stream(), HarmonyToolParser().stream(tools)
    reasoning, deltas = "", []
    for piece in [*pieces, None]:
        split = rs.feed(piece) if piece is not None else rs.finish()
        reasoning += split.reasoning
        deltas.append(ts.feed(split.content))
    deltas.append(ts.finish())
    result = assemble(deltas)
    return reasoning, result.content, [(c.name, json.loads(c.arguments)) for c in result.tool_calls]


def test_chain_token_by_token_and_whole() -> None:
    want = ("Need the weather.", None, [("get_weather", {"city": "Paris"})])
    assert chain(RESPONSE) == want
    assert chain(["".join(RESPONSE)]) == want
    assert chain(list("".join(RESPONSE))) == want


def test_call_without_its_stop_token() -> None:
    # the engine ends the generation on <|call|> and leaves it out of the text
    assert chain(RESPONSE[:-1])[2] == [("get_weather", {"city": "Paris"})]


def test_cut_off_arguments_are_content() -> None:
    reasoning, content, calls = chain(RESPONSE[:-3])
    assert calls == [] and content.endswith('<|message|>{"city":"')
    assert reasoning == "Need the weather."


def test_unknown_tool_is_content_as_written() -> None:
    other = [{"type": "function", "function": {"name": "other"}}]
    text = "".join(RESPONSE)
    _, content, calls = chain(RESPONSE, other)
    assert calls == []
    assert content == text[text.index("<|start|>") :]


def test_final_answer_after_reasoning() -> None:
    pieces = [
        "<|channel|>",
        "analysis",
        "<|message|>",
        "2+2.",
        "<|end|>",
        "<|start|>",
        "assistant",
        "<|channel|>",
        "final",
        "<|message|>",
        "4",
        "<|return|>",
    ]
    assert chain(pieces) == ("2+2.", "4", [])


def test_matches_the_harmony_template_only() -> None:
    template = "{{- '<|start|>assistant<|channel|>final<|message|>' }}"
    for cls in (HarmonyReasoningParser, HarmonyToolParser):
        assert cls.matches("anything", template)
        assert not cls.matches("openai/gpt-oss-20b", "<tool_call>{{ x }}")
        assert cls.matches("openai/gpt-oss-20b", None)
        assert not cls.matches("Qwen/Qwen3-8B", None)
        assert cls.reads_special_tokens
