"""The hermes / Qwen2.5 ``<tool_call>`` parser: tables, streaming splits, generated responses."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tallow_tool_hermes.plugin
from tallow.plugin.testing import (
    assert_streaming_matches_parse,
    isolated_plugin_manager,
    parse_summary,
)
from tallow.plugin.tool_parsing import ParseResult, compact_json
from tallow_tool_hermes.parser import HermesToolParser

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    },
    {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}},
]


def call(name: str, args, *, indent=None, key: str = "arguments") -> str:
    """A call as Qwen2.5's chat template writes it."""
    body = json.dumps({"name": name, key: args}, ensure_ascii=False, indent=indent)
    return f"<tool_call>\n{body}\n</tool_call>"


summary = parse_summary


def check_all_splits(text: str, tools=TOOLS, tries: int = 40) -> ParseResult:
    """parse() equals the assembled stream for one-character and random chunks."""
    return assert_streaming_matches_parse(HermesToolParser(), text, tools, tries)


W = {"city": "Paris"}
CASES = [
    ("plain text", "The weather is fine.\n", "The weather is fine.\n", []),
    ("one call", call("get_weather", W), None, [("get_weather", W)]),
    (
        "several calls",
        call("get_weather", W) + "\n" + call("search", {"q": "x"}) + "\n",
        None,
        [("get_weather", W), ("search", {"q": "x"})],
    ),
    (
        "content before",
        "Let me look that up.\n\n" + call("get_weather", W),
        "Let me look that up.",
        [("get_weather", W)],
    ),
    (
        "content between and after",
        "A " + call("search", {}) + " B " + call("search", {}) + " C",
        "A  B  C",
        [("search", {}), ("search", {})],
    ),
    (
        "in a code fence",
        "Use:\n```\n" + call("get_weather", W) + "\n```\n",
        "Use:\n```\n" + call("get_weather", W) + "\n```\n",
        [],
    ),
    (
        "in think",
        "<think>I could " + call("search", {}) + "</think>No call.",
        "<think>I could " + call("search", {}) + "</think>No call.",
        [],
    ),
    (
        "after think",
        "<think>need weather</think>\n" + call("get_weather", W),
        "<think>need weather</think>",
        [("get_weather", W)],
    ),
    (
        "bad json",
        '<tool_call>\n{"name": "search", "arguments": {q: 1}}\n</tool_call>',
        '<tool_call>\n{"name": "search", "arguments": {q: 1}}\n</tool_call>',
        [],
    ),
    (
        "not an object",
        "<tool_call>\nsearch(q=1)\n</tool_call>",
        "<tool_call>\nsearch(q=1)\n</tool_call>",
        [],
    ),
    ("arguments not an object", call("search", [1, 2]), call("search", [1, 2]), []),
    (
        "text after the object",
        '<tool_call>\n{"name": "search"} x</tool_call>',
        '<tool_call>\n{"name": "search"} x</tool_call>',
        [],
    ),
    ("unknown tool", call("launch", {}), call("launch", {}), []),
    (
        "unclosed at end",
        "Sure " + call("get_weather", W)[:-5],
        "Sure " + call("get_weather", W)[:-5],
        [],
    ),
    ("opener only", "<tool_call>", "<tool_call>", []),
    ("partial opener at end", "see <tool_ca", "see <tool_ca", []),
    (
        "stray opener, then a call",
        "<tool_call> oops " + call("search", {}),
        "<tool_call> oops",
        [("search", {})],
    ),
    (
        "unicode",
        call("get_weather", {"city": "Zürich 東京 😀", "note": '\u00e9\n\t"q"'}),
        None,
        [("get_weather", {"city": "Zürich 東京 😀", "note": 'é\n\t"q"'})],
    ),
    (
        "escaped unicode",
        '<tool_call>{"name": "search", "arguments": {"q": "\\u6771\\ud83d\\ude00"}}</tool_call>',
        None,
        [("search", {"q": "東😀"})],
    ),
    (
        "nested json",
        call("search", {"filter": {"and": [{"tag": "</tool_call>"}, {"n": [1.5, None, True]}]}}),
        None,
        [("search", {"filter": {"and": [{"tag": "</tool_call>"}, {"n": [1.5, None, True]}]}})],
    ),
    (
        "pretty-printed",
        call("search", {"a": {"b": 1}}, indent=2),
        None,
        [("search", {"a": {"b": 1}})],
    ),
    ("parameters key", call("search", {"q": 1}, key="parameters"), None, [("search", {"q": 1})]),
    ("arguments as a string", call("search", '{"q": "s"}'), None, [("search", {"q": "s"})]),
    ("no arguments", '<tool_call>{"name": "search"}</tool_call>', None, [("search", {})]),
]


@pytest.mark.parametrize("label,text,content,calls", CASES, ids=[c[0] for c in CASES])
def test_table(label, text, content, calls):
    result = check_all_splits(text)
    assert result.content == content
    assert [(c.name, json.loads(c.arguments)) for c in result.tool_calls] == calls
    for c in result.tool_calls:
        assert c.arguments == compact_json(json.loads(c.arguments))


def test_arguments_are_compact_and_keep_non_ascii():
    [c] = HermesToolParser().parse(call("get_weather", {"city": "Zürich", "n": [1, 2]})).tool_calls
    assert c.arguments == '{"city":"Zürich","n":[1,2]}'


def test_without_tools_any_name_is_a_call():
    assert summary(HermesToolParser().parse(call("launch", {}))) == (None, [("launch", "{}")])


def test_streaming_never_shows_markup():
    sp = HermesToolParser().stream(TOOLS)
    seen = ""
    for ch in "Hi! " + call("search", {"q": 1}) + " bye":
        d = sp.feed(ch)
        seen += d.content
        assert "<" not in seen
    seen += sp.finish().content
    assert seen == "Hi!  bye"  # the spaces on both sides of the call


FILLER = st.lists(
    st.sampled_from(["Hi", " ", "\n", "é", "<", "<tool", "{", "}", "]", "x"]), max_size=5
).map("".join)
ARGS = st.dictionaries(
    st.text(max_size=4),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=6),
        lambda inner: (
            st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=3), inner, max_size=2)
        ),
        max_leaves=5,
    ),
    max_size=3,
)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            FILLER, st.sampled_from(["get_weather", "search"]), ARGS, st.sampled_from([None, 1])
        ),
        max_size=3,
    ),
    FILLER,
)
def test_generated_responses(parts, tail):
    """Any mix of content and calls (args with markup, quotes, unicode) reads back exactly."""
    text, content, calls = "", "", []
    for filler, name, args, indent in parts:
        text += filler + call(name, args, indent=indent)
        content += filler
        calls.append((name, args))
    text += tail
    content += tail
    if "<tool_call>" in content:
        return  # fillers happened to spell the opener ("<tool" + "<tool_call>" cannot)
    result = check_all_splits(text, tries=4)
    assert [(c.name, json.loads(c.arguments)) for c in result.tool_calls] == calls
    assert result.content == ((content.rstrip() or None) if calls else content)


QWEN25_EXCERPT = (
    "For each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\n</tool_call><|im_end|>"
)


@pytest.mark.parametrize(
    "model,template,expected",
    [
        ("Qwen2.5-Coder-0.5B-Instruct", QWEN25_EXCERPT, True),
        ("anything", QWEN25_EXCERPT, True),
        ("Qwen2.5-Coder-0.5B-Instruct", "{{ messages }}", False),  # a template without tools
        ("Qwen2.5-7B-Instruct", None, True),
        ("NousResearch/Hermes-3-Llama-3.1-8B", None, True),
        ("mistral-7b", None, False),
    ],
)
def test_matches(model, template, expected):
    assert HermesToolParser.matches(model, template) is expected


def test_registered_at_the_class_priority():
    """(Entry point, lazy target and light registration: tests/test_conformance.py.)"""
    pm = isolated_plugin_manager(("tallow-tool-hermes", tallow_tool_hermes.plugin))
    entry = pm.registries.tool_parsers.entry("hermes")
    assert entry.load() is HermesToolParser and entry.priority == HermesToolParser.priority
    assert HermesToolParser.call_opening == "<tool_call>\n"
