"""The llama3_json parser: whole-response JSON calls, tables, splits, generated responses."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tallow_tool_llama3.plugin
from tallow.plugin.testing import (
    assert_streaming_matches_parse,
    isolated_plugin_manager,
    parse_summary,
)
from tallow.plugin.tool_parsing import ParseResult, compact_json
from tallow_tool_llama3.parser import Llama3JsonToolParser

TOOLS = [
    {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
    for n in ("get_weather", "search")
]


def call(name: str, args, key: str = "parameters", indent=None) -> str:
    return json.dumps({"name": name, key: args}, ensure_ascii=False, indent=indent)


summary = parse_summary


def check_all_splits(text: str, tools=TOOLS, tries: int = 40) -> ParseResult:
    """parse() equals the assembled stream for one-character and random chunks."""
    return assert_streaming_matches_parse(Llama3JsonToolParser(), text, tools, tries)


P = {"city": "Paris"}
TAG = "<|python_tag|>"
CASES = [
    ("plain text", "It is sunny.", "It is sunny.", []),
    ("one call", call("get_weather", P), None, [("get_weather", P)]),
    ("surrounded by whitespace", "\n " + call("get_weather", P) + "\n", None, [("get_weather", P)]),
    (
        "several calls",
        call("get_weather", P) + "; " + call("search", {"q": "x"}),
        None,
        [("get_weather", P), ("search", {"q": "x"})],
    ),
    ("trailing semicolon", call("search", {}) + ";", None, [("search", {})]),
    ("python tag", TAG + call("search", {"q": 1}), None, [("search", {"q": 1})]),
    (
        "content before the python tag",
        "Checking.\n" + TAG + call("search", {}),
        "Checking.",
        [("search", {})],
    ),
    (
        "arguments key and type",
        '{"type": "function", "name": "search", "arguments": {"q": 2}}',
        None,
        [("search", {"q": 2})],
    ),
    (
        "in a code fence",
        "```json\n" + call("search", {}) + "\n```",
        "```json\n" + call("search", {}) + "\n```",
        [],
    ),
    (
        "in think, then a call",
        "<think>" + call("search", {}) + "</think>\n" + call("search", {"a": 1}),
        "<think>" + call("search", {}) + "</think>",
        [("search", {"a": 1})],
    ),
    (
        "json answer, not a call",
        '{"temperature": 21, "unit": "C"}',
        '{"temperature": 21, "unit": "C"}',
        [],
    ),
    (
        "call followed by text",
        call("search", {}) + " Let me know.",
        call("search", {}) + " Let me know.",
        [],
    ),
    ("call after text", "Here: " + call("search", {}), "Here: " + call("search", {}), []),
    (
        "second item not a call",
        call("search", {}) + '; {"x": 1}',
        call("search", {}) + '; {"x": 1}',
        [],
    ),
    (
        "bad json",
        '{"name": "search", "parameters": {q}}',
        '{"name": "search", "parameters": {q}}',
        [],
    ),
    ("unknown tool", call("launch", {}), call("launch", {}), []),
    ("unclosed at end", call("search", P)[:-2], call("search", P)[:-2], []),
    ("python tag with code", TAG + "print(1)", TAG + "print(1)", []),
    (
        "unicode",
        call("get_weather", {"city": "Zürich 東京 😀"}),
        None,
        [("get_weather", {"city": "Zürich 東京 😀"})],
    ),
    (
        "nested json",
        call("search", {"f": {"or": [{"t": "};{"}, [None, 1.5]]}}, indent=2),
        None,
        [("search", {"f": {"or": [{"t": "};{"}, [None, 1.5]]}})],
    ),
]


@pytest.mark.parametrize("label,text,content,calls", CASES, ids=[c[0] for c in CASES])
def test_table(label, text, content, calls):
    result = check_all_splits(text)
    assert result.content == content
    assert [(c.name, json.loads(c.arguments)) for c in result.tool_calls] == calls
    for c in result.tool_calls:
        assert c.arguments == compact_json(json.loads(c.arguments))


def test_prose_is_not_held_back():
    sp = Llama3JsonToolParser().stream(TOOLS)
    assert sp.feed("{braces} are").content == "{braces} are"
    sp = Llama3JsonToolParser().stream(TOOLS)
    assert sp.feed('{"answer": 42} is the JSON').content == '{"answer": 42} is the JSON'


ARGS = st.dictionaries(
    st.text(max_size=4),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda inner: (
            st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=2), inner, max_size=2)
        ),
        max_leaves=4,
    ),
    max_size=3,
)
WS = st.sampled_from(["", " ", "\n", "\n\n "])


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["get_weather", "search"]), ARGS), min_size=1, max_size=3),
    WS,
    WS,
    st.booleans(),
    st.sampled_from([None, 2]),
)
def test_generated_responses(calls, lead, trail, tagged, indent):
    text = (
        lead
        + (TAG if tagged else "")
        + f"{lead};{trail}".join(call(n, a, indent=indent) for n, a in calls)
        + trail
    )
    result = check_all_splits(text, tries=4)
    assert [(c.name, json.loads(c.arguments)) for c in result.tool_calls] == calls
    assert result.content is None


@pytest.mark.parametrize(
    "model,template,expected",
    [
        ("Llama-3.1-8B-Instruct", "{{- '<|python_tag|>' + tool_call.name }}", True),
        (
            "Llama-3.2-3B-Instruct",
            "<|start_header_id|>user<|end_header_id|>Respond in the format "
            '{"name": function name, "parameters": dictionary of argument name and its value}',
            True,
        ),
        ("Llama-3-8B", "<|start_header_id|>{{ m.role }}<|end_header_id|>", False),
        ("meta-llama/Meta-Llama-3.1-70B", None, True),
        ("llama3.3", None, True),
        ("Qwen2.5", None, False),
    ],
)
def test_matches(model, template, expected):
    assert Llama3JsonToolParser.matches(model, template) is expected


def test_registered_at_the_class_priority():
    """(Entry point, lazy target and light registration: tests/test_conformance.py.)"""
    pm = isolated_plugin_manager(("tallow-tool-llama3", tallow_tool_llama3.plugin))
    entry = pm.registries.tool_parsers.entry("llama3_json")
    assert entry.load() is Llama3JsonToolParser and entry.priority == Llama3JsonToolParser.priority
