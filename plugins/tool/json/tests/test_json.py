"""The json fallback parser: a whole response of call objects; tables, splits, generated."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tallow_tool_json.plugin
from tallow.plugin.testing import (
    assert_streaming_matches_parse,
    isolated_plugin_manager,
    parse_summary,
)
from tallow.plugin.tool_parsing import ParseResult, compact_json
from tallow_tool_json.parser import JsonToolParser

TOOLS = [
    {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
    for n in ("get_weather", "search")
]


def call(name: str, args, key: str = "arguments") -> dict:
    return {"name": name, key: args}


summary = parse_summary


def check_all_splits(text: str, tools=TOOLS, tries: int = 40) -> ParseResult:
    """parse() equals the assembled stream for one-character and random chunks."""
    return assert_streaming_matches_parse(JsonToolParser(), text, tools, tries)


P = {"city": "Paris"}
J = json.dumps
CASES = [
    ("plain text", "Just text.", "Just text.", []),
    ("one call", J(call("get_weather", P)), None, [("get_weather", P)]),
    (
        "a list of calls",
        J([call("get_weather", P), call("search", {"q": 1}, "parameters")]),
        None,
        [("get_weather", P), ("search", {"q": 1})],
    ),
    ("whitespace around", "\n  " + J(call("search", {})) + " \n", None, [("search", {})]),
    (
        "after think",
        "<think>ok</think>" + J(call("search", {})),
        "<think>ok</think>",
        [("search", {})],
    ),
    (
        "content before is not a call",
        "Result: " + J(call("search", {})),
        "Result: " + J(call("search", {})),
        [],
    ),
    ("text after is not a call", J(call("search", {})) + " ok", J(call("search", {})) + " ok", []),
    # what small models write (issue 46): a call per line, or calls in a code fence
    ("in a code fence", "```json\n" + J(call("search", {})) + "\n```", None, [("search", {})]),
    (
        "in a bare fence",
        "```\n" + J([call("search", {}), call("search", P)]) + "\n```\n",
        None,
        [("search", {}), ("search", P)],
    ),
    (
        "two in a fence",
        "```json\n" + J(call("search", {})) + "\n" + J(call("search", P)) + "\n```",
        None,
        [("search", {}), ("search", P)],
    ),
    (
        "a call per line",
        J(call("search", P)) + "\n" + J(call("search", P)) + "\n" + J(call("search", {})),
        None,
        [("search", P), ("search", P), ("search", {})],
    ),
    (
        "calls then a non-call",
        J(call("search", {})) + "\n" + '{"a": 1}',
        J(call("search", {})) + "\n" + '{"a": 1}',
        [],
    ),
    ("calls then prose", J(call("search", {})) + "\nDone.", J(call("search", {})) + "\nDone.", []),
    ("a python fence", "```python\nprint(1)\n```", "```python\nprint(1)\n```", []),
    (
        "a fence then prose",
        "```json\n" + J(call("search", {})) + "\n```\nok",
        "```json\n" + J(call("search", {})) + "\n```\nok",
        [],
    ),
    (
        "a fence of a non-call",
        "```json\n" + '{"a": 1}' + "\n```",
        "```json\n" + '{"a": 1}' + "\n```",
        [],
    ),
    ("json answer", J({"name": "Ada", "born": 1815}), J({"name": "Ada", "born": 1815}), []),
    ("empty list", "[]", "[]", []),
    ("list with a non-call", J([call("search", {}), 3]), J([call("search", {}), 3]), []),
    ("bad json", '{"name": "search", "arguments": }', '{"name": "search", "arguments": }', []),
    ("unknown tool", J(call("launch", {})), J(call("launch", {})), []),
    ("unclosed at end", J(call("search", P))[:-1], J(call("search", P))[:-1], []),
    (
        "unicode",
        J(call("get_weather", {"city": "Zürich 東京 😀"}), ensure_ascii=False),
        None,
        [("get_weather", {"city": "Zürich 東京 😀"})],
    ),
    (
        "escaped unicode",
        J(call("get_weather", {"city": "東京"})),
        None,
        [("get_weather", {"city": "東京"})],
    ),
    (
        "nested json",
        J(call("search", {"q": {"all": [{"x": "]}"}, [1, None]]}}), indent=2),
        None,
        [("search", {"q": {"all": [{"x": "]}"}, [1, None]]}})],
    ),
]


@pytest.mark.parametrize("label,text,content,calls", CASES, ids=[c[0] for c in CASES])
def test_table(label, text, content, calls):
    result = check_all_splits(text)
    assert result.content == content
    assert [(c.name, json.loads(c.arguments)) for c in result.tool_calls] == calls
    for c in result.tool_calls:
        assert c.arguments == compact_json(json.loads(c.arguments))


def test_forced_output_of_the_server_parses():
    """What a forced call looks like once the steering prefix and the continuation are joined."""
    text = '{"name": "search", "arguments": {"q": "tallow"}}'
    assert summary(JsonToolParser().parse(text, TOOLS)) == (None, [("search", '{"q":"tallow"}')])


def test_bracketed_prose_is_not_held_back():
    sp = JsonToolParser().stream(TOOLS)
    assert sp.feed("[Note: this").content == "[Note: this"
    sp = JsonToolParser().stream(TOOLS)
    assert sp.feed("{").content == ""  # might open a call
    assert sp.feed(" 1, 2} is a set").content == "{ 1, 2} is a set"
    sp = JsonToolParser().stream(TOOLS)
    assert sp.feed('{"x": 1} and then a long answer').content == '{"x": 1} and then a long answer'


ARGS = st.dictionaries(
    st.text(max_size=4),
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=5),
        lambda inner: st.lists(inner, max_size=2),
        max_leaves=4,
    ),
    max_size=3,
)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["get_weather", "search"]),
            ARGS,
            st.sampled_from(["arguments", "parameters"]),
        ),
        min_size=1,
        max_size=3,
    ),
    st.booleans(),
    st.sampled_from([None, 1]),
    st.booleans(),
)
def test_generated_responses(calls, as_list, indent, ascii_only):
    objs = [call(n, a, k) for n, a, k in calls]
    value = objs if as_list or len(objs) > 1 else objs[0]
    text = json.dumps(value, indent=indent, ensure_ascii=ascii_only)
    result = check_all_splits(text, tries=4)
    assert [(c.name, json.loads(c.arguments)) for c in result.tool_calls] == [
        (n, a) for n, a, _ in calls
    ]
    assert result.content is None


def test_matches_everything():
    assert JsonToolParser.matches("any-model", None) is True
    assert JsonToolParser.matches("any-model", "{{ messages }}") is True


def test_registered_at_the_class_priority():
    """(Entry point, lazy target and light registration: tests/test_conformance.py.)"""
    pm = isolated_plugin_manager(("tallow-tool-json", tallow_tool_json.plugin))
    entry = pm.registries.tool_parsers.entry("json")
    assert entry.load() is JsonToolParser and entry.priority == JsonToolParser.priority
