"""The mistral ``[TOOL_CALLS]`` parser: both formats, tables, splits, generated responses."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tallow_tool_mistral.plugin
from tallow.plugin.testing import (
    assert_streaming_matches_parse,
    isolated_plugin_manager,
    parse_summary,
)
from tallow.plugin.tool_parsing import ParseResult, compact_json
from tallow_tool_mistral.parser import MistralToolParser

TOOLS = [
    {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
    for n in ("get_weather", "get_time")
]


def v3(*calls) -> str:
    """The JSON-list format (Mistral v3 tokenizers)."""
    return "[TOOL_CALLS]" + json.dumps(
        [{"name": n, "arguments": a} for n, a in calls], ensure_ascii=False
    )


def v11(name: str, args, call_id: str | None = None) -> str:
    """The ``name[ARGS]{...}`` format (v11+), with an optional ``[CALL_ID]``."""
    cid = f"[CALL_ID]{call_id}" if call_id else ""
    return f"[TOOL_CALLS]{name}{cid}[ARGS]{json.dumps(args, ensure_ascii=False)}"


summary = parse_summary


def check_all_splits(text: str, tools=TOOLS, tries: int = 40) -> ParseResult:
    """parse() equals the assembled stream for one-character and random chunks."""
    return assert_streaming_matches_parse(MistralToolParser(), text, tools, tries)


P = {"city": "Paris"}
CASES = [
    ("plain text", "Bonjour.", "Bonjour.", []),
    ("v3 one call", v3(("get_weather", P)), None, [("get_weather", P)]),
    (
        "v3 several calls",
        v3(("get_weather", P), ("get_time", {})),
        None,
        [("get_weather", P), ("get_time", {})],
    ),
    (
        "v3 single object",
        '[TOOL_CALLS] {"name": "get_time", "arguments": {}}',
        None,
        [("get_time", {})],
    ),
    (
        "v11 several calls",
        v11("get_weather", P) + v11("get_time", {"tz": "UTC"}),
        None,
        [("get_weather", P), ("get_time", {"tz": "UTC"})],
    ),
    (
        "content before",
        "Let me check. " + v11("get_weather", P),
        "Let me check.",
        [("get_weather", P)],
    ),
    (
        "in a code fence",
        "```\n" + v3(("get_time", {})) + "\n```",
        "```\n" + v3(("get_time", {})) + "\n```",
        [],
    ),
    (
        "in think",
        "<think>" + v11("get_time", {}) + "</think>",
        "<think>" + v11("get_time", {}) + "</think>",
        [],
    ),
    (
        "v3 bad json",
        '[TOOL_CALLS][{"name": "get_time", "arguments": {]}]',
        '[TOOL_CALLS][{"name": "get_time", "arguments": {]}]',
        [],
    ),
    (
        "v3 item not a call",
        '[TOOL_CALLS][{"name": "get_time", "arguments": {}}, 5]',
        '[TOOL_CALLS][{"name": "get_time", "arguments": {}}, 5]',
        [],
    ),
    (
        "v11 arguments not an object",
        "[TOOL_CALLS]get_time[ARGS][1]",
        "[TOOL_CALLS]get_time[ARGS][1]",
        [],
    ),
    ("v11 name with a space", "[TOOL_CALLS]get time[ARGS]{}", "[TOOL_CALLS]get time[ARGS]{}", []),
    ("v11 missing [ARGS]", "[TOOL_CALLS]get_time{}", "[TOOL_CALLS]get_time{}", []),
    ("unknown tool", v11("launch", {}), v11("launch", {}), []),
    ("unclosed at end", v11("get_weather", P)[:-3], v11("get_weather", P)[:-3], []),
    ("marker alone", "[TOOL_CALLS]", "[TOOL_CALLS]", []),
    ("partial marker", "a [TOOL_CA", "a [TOOL_CA", []),
    ("brackets in text are not markup", "See [1] and [TOOL] docs.", "See [1] and [TOOL] docs.", []),
    (
        "unicode",
        v11("get_weather", {"city": "Zürich 東京 😀"}),
        None,
        [("get_weather", {"city": "Zürich 東京 😀"})],
    ),
    (
        "nested json",
        v3(("get_time", {"a": {"b": [1, {"c": "]}"}]}})),
        None,
        [("get_time", {"a": {"b": [1, {"c": "]}"}]}})],
    ),
    ("content after the calls", v11("get_time", {}) + " done", " done", [("get_time", {})]),
]


@pytest.mark.parametrize("label,text,content,calls", CASES, ids=[c[0] for c in CASES])
def test_table(label, text, content, calls):
    result = check_all_splits(text)
    assert result.content == content
    assert [(c.name, json.loads(c.arguments)) for c in result.tool_calls] == calls
    for c in result.tool_calls:
        assert c.arguments == compact_json(json.loads(c.arguments))


def test_call_id_of_the_model_is_kept():
    result = check_all_splits(v11("get_time", {}, "a1B2c3D4e") + v11("get_time", {}))
    first, second = result.tool_calls
    assert first.id == "a1B2c3D4e" and second.id.startswith("call_")
    assert check_all_splits("[TOOL_CALLS]get_time[CALL_ID][ARGS]{}").tool_calls == []


ARGS = st.dictionaries(
    st.text(max_size=4),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda inner: st.lists(inner, max_size=2),
        max_leaves=4,
    ),
    max_size=3,
)
FILLER = st.lists(st.sampled_from(["ok", " ", "\n", "[", "]", "[TOOL", "{", "é"]), max_size=4).map(
    "".join
)


@settings(max_examples=60, deadline=None)
@given(
    FILLER,
    st.lists(st.tuples(st.sampled_from(["get_weather", "get_time"]), ARGS), min_size=1, max_size=3),
    st.booleans(),
    FILLER,
)
def test_generated_responses(head, calls, list_form, tail):
    body = v3(*calls) if list_form else "".join(v11(n, a) for n, a in calls)
    if "[TOOL_CALLS]" in head + tail or (head + body).count("[TOOL_CALLS]") != (
        1 if list_form else len(calls)
    ):
        return  # the filler spelled the marker itself
    text = head + body + tail
    result = check_all_splits(text, tries=4)
    assert [(c.name, json.loads(c.arguments)) for c in result.tool_calls] == calls
    assert result.content == ((head + tail).rstrip() or None)


@pytest.mark.parametrize(
    "model,template,expected",
    [
        (
            "Mistral-Small-3.2-24B",
            "{{- '[TOOL_CALLS]' + tool_call.function.name + '[ARGS]' }}",
            True,
        ),
        ("Mistral-7B-v0.1", "{{ bos_token }}[INST] {{ m.content }} [/INST]", False),
        ("mistralai/Mistral-7B-Instruct-v0.3", None, True),
        ("Devstral-Small", None, True),
        ("Qwen2.5", None, False),
    ],
)
def test_matches(model, template, expected):
    assert MistralToolParser.matches(model, template) is expected


def test_registered_at_the_class_priority():
    """(Entry point, lazy target and light registration: tests/test_conformance.py.)"""
    pm = isolated_plugin_manager(("tallow-tool-mistral", tallow_tool_mistral.plugin))
    entry = pm.registries.tool_parsers.entry("mistral")
    assert entry.load() is MistralToolParser and entry.priority == MistralToolParser.priority
