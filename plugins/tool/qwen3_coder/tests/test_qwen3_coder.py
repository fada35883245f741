"""The Qwen3-Coder XML parser: tables, schema typing, streaming splits, generated responses."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tallow_tool_qwen3_coder.plugin
from tallow.plugin.testing import (
    assert_streaming_matches_parse,
    isolated_plugin_manager,
    parse_summary,
)
from tallow.plugin.tool_parsing import ParseResult, compact_json
from tallow_tool_qwen3_coder.parser import Qwen3CoderToolParser
from tallow_tool_qwen3_coder.values import convert_value, schema_types

SCHEMA = {
    "type": "object",
    "properties": {
        "path": {"type": "string"},
        "count": {"type": "integer"},
        "ratio": {"type": "number"},
        "force": {"type": "boolean"},
        "options": {"type": "object"},
        "lines": {"type": "array", "items": {"type": "integer"}},
        "maybe": {"type": ["integer", "null"]},
        "either": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
    },
}
TOOLS = [
    {"type": "function", "function": {"name": "write_file", "parameters": SCHEMA}},
    {"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}},
]


def render_value(value) -> str:
    """As the Qwen3-Coder chat template renders a value: strings raw, containers as JSON,
    scalars through Jinja's ``string`` filter (Python spelling: True, None)."""
    if isinstance(value, str):
        return value
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def call(name: str, args: dict, *, wrap: bool = True) -> str:
    params = "".join(f"<parameter={k}>\n{render_value(v)}\n</parameter>\n" for k, v in args.items())
    body = f"<function={name}>\n{params}</function>"
    return f"<tool_call>\n{body}\n</tool_call>" if wrap else body


summary = parse_summary


def check_all_splits(text: str, tools=TOOLS, tries: int = 40) -> ParseResult:
    """parse() equals the assembled stream for one-character and random chunks."""
    return assert_streaming_matches_parse(Qwen3CoderToolParser(), text, tools, tries)


TYPED = {
    "path": "src/a b.py",
    "count": 3,
    "ratio": 0.25,
    "force": True,
    "options": {"mode": "w", "tags": ["x"]},
    "lines": [1, 2],
    "maybe": None,
    "either": 7,
}
CODE = 'def f(x):\n    if x < 3 and y > 2:\n        return "<tool_call>"\n'
CASES = [
    ("plain text", "No tools needed.", "No tools needed.", []),
    ("one call, typed by the schema", call("write_file", TYPED), None, [("write_file", TYPED)]),
    (
        "several calls",
        call("ls", {"dir": "."}) + "\n" + call("ls", {"dir": "/"}),
        None,
        [("ls", {"dir": "."}), ("ls", {"dir": "/"})],
    ),
    (
        "content before",
        "I'll write it.\n\n" + call("write_file", {"path": "a"}),
        "I'll write it.",
        [("write_file", {"path": "a"})],
    ),
    (
        "code as a string value",
        call("write_file", {"path": "f.py", "content": CODE}),
        None,
        [("write_file", {"path": "f.py", "content": CODE})],
    ),
    (
        "value with its own edge newlines",
        call("ls", {"dir": "\n x \n"}),
        None,
        [("ls", {"dir": "\n x \n"})],
    ),
    (
        "in a code fence",
        "```xml\n" + call("ls", {}) + "\n```",
        "```xml\n" + call("ls", {}) + "\n```",
        [],
    ),
    (
        "in think",
        "<think>" + call("ls", {}) + "</think>",
        "<think>" + call("ls", {}) + "</think>",
        [],
    ),
    ("unknown function", call("rm", {"path": "/"}), call("rm", {"path": "/"}), []),
    (
        "unclosed parameter at end",
        "<tool_call>\n<function=ls>\n<parameter=dir>\n/tm",
        "<tool_call>\n<function=ls>\n<parameter=dir>\n/tm",
        [],
    ),
    (
        "garbage inside",
        "<tool_call>\n<function=ls>\nhello\n</function>\n</tool_call>",
        "<tool_call>\n<function=ls>\nhello\n</function>\n</tool_call>",
        [],
    ),
    (
        "name with a space",
        "<tool_call>\n<function=l s>\n</function>\n</tool_call>",
        "<tool_call>\n<function=l s>\n</function>\n</tool_call>",
        [],
    ),
    ("no wrapper", "Run: " + call("ls", {"dir": "x"}, wrap=False), "Run:", [("ls", {"dir": "x"})]),
    ("closing wrapper cut off by the end", call("ls", {})[:-4], None, [("ls", {})]),
    (
        "text after function inside the wrapper",
        "<tool_call>\n<function=ls>\n</function>\nmore\n</tool_call>",
        "<tool_call>\n<function=ls>\n</function>\nmore\n</tool_call>",
        [],
    ),
    (
        "unicode",
        call("write_file", {"path": "ünï/東京.txt", "content": "😀\n"}),
        None,
        [("write_file", {"path": "ünï/東京.txt", "content": "😀\n"})],
    ),
    (
        "nested json value",
        call("write_file", {"options": {"a": {"b": [1, {"c": None}]}}}),
        None,
        [("write_file", {"options": {"a": {"b": [1, {"c": None}]}}})],
    ),
    (
        "value that does not fit its type stays text",
        call("write_file", {"count": "many"}),
        None,
        [("write_file", {"count": "many"})],
    ),
]


@pytest.mark.parametrize("label,text,content,calls", CASES, ids=[c[0] for c in CASES])
def test_table(label, text, content, calls):
    result = check_all_splits(text)
    assert result.content == content
    assert [(c.name, json.loads(c.arguments)) for c in result.tool_calls] == calls
    for c in result.tool_calls:
        assert c.arguments == compact_json(json.loads(c.arguments))


@pytest.mark.parametrize(
    "text,schema,expected",
    [
        ("\n42\n", {"type": "integer"}, 42),
        ("\n-7 \n", {"type": "integer"}, -7),
        ("4.5", {"type": "integer"}, "4.5"),
        ("\n1e3\n", {"type": "number"}, 1000.0),
        ("\n3\n", {"type": "number"}, 3),
        ("NaN", {"type": "number"}, "NaN"),
        ("\nTrue\n", {"type": "boolean"}, True),
        ("false", {"type": "boolean"}, False),
        ("yes", {"type": "boolean"}, "yes"),
        ('\n{"a": [1]}\n', {"type": "object"}, {"a": [1]}),
        ("[1, 2]", {"type": "object"}, "[1, 2]"),
        ("\n[1, 2]\n", {"type": "array"}, [1, 2]),
        ("\nNone\n", {"type": ["integer", "null"]}, None),
        ("\n5\n", {"type": ["string", "integer"]}, "5"),
        ("\n5\n", {"type": ["integer", "string"]}, 5),
        ("\n5\n", {"oneOf": [{"type": "integer"}, {"type": "string"}]}, 5),
        ("\n 5 \n", {"type": "string"}, " 5 "),
        ("\n5\n", None, "5"),
        ("\n5\n", {"description": "no type"}, "5"),
    ],
)
def test_convert_value(text, schema, expected):
    got = convert_value(text, schema)
    assert got == expected and type(got) is type(expected)


def test_schema_types():
    assert schema_types({"type": ["integer", "null"]}) == ["integer", "null"]
    assert schema_types({"anyOf": [{"type": "integer"}, {"type": ["string", "integer"]}]}) == [
        "integer",
        "string",
    ]
    assert schema_types("string") == [] and schema_types({}) == []


def test_without_tools_values_stay_text():
    [c] = Qwen3CoderToolParser().parse(call("any", {"n": 5})).tool_calls
    assert (c.name, c.arguments) == ("any", '{"n":"5"}')


VALUES = {
    "path": st.text(st.characters(codec="utf-8", exclude_characters="\r"), max_size=12).filter(
        lambda s: "</parameter>" not in s
    ),
    "count": st.integers(-(10**12), 10**12),
    "ratio": st.floats(allow_nan=False, allow_infinity=False),
    "force": st.booleans(),
    "options": st.dictionaries(
        st.text(max_size=3), st.integers() | st.text(max_size=3), max_size=2
    ),
    "lines": st.lists(st.integers(), max_size=3),
}
FILLER = st.lists(
    st.sampled_from(["ok", " ", "\n", "<", "<function", "é", "=", ">"]), max_size=4
).map("".join)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(FILLER, st.fixed_dictionaries({}, optional=VALUES), st.booleans()), max_size=3
    ),
    FILLER,
)
def test_generated_responses(parts, tail):
    """Calls rendered as the chat template renders them read back to the same values."""
    text, content, calls = "", "", []
    for filler, args, wrap in parts:
        text += filler + call("write_file", args, wrap=wrap) + "\n"
        content += filler + "\n"
        calls.append(("write_file", args))
    text += tail
    content += tail
    if "<function=" in content or "<tool_call>" in content:
        return  # the filler spelled an opener itself
    result = check_all_splits(text, tries=3)
    assert [(c.name, json.loads(c.arguments)) for c in result.tool_calls] == calls
    assert result.content == ((content.rstrip() or None) if calls else content)


QWEN3_CODER_EXCERPT = (
    "{%- for tool_call in message.tool_calls %}{{- '\\n<tool_call>\\n<function=' + "
    "tool_call.name + '>\\n' }}{%- for args_name, args_value in tool_call.arguments|items %}"
    "{{- '<parameter=' + args_name + '>\\n' }}{{- args_value }}{{- '\\n</parameter>\\n' }}"
    "{%- endfor %}{{- '</function>\\n</tool_call>' }}{%- endfor %}"
)


@pytest.mark.parametrize(
    "model,template,expected",
    [
        ("Qwen3-Coder-30B-A3B-Instruct", QWEN3_CODER_EXCERPT, True),
        (
            "Qwen2.5-Coder-0.5B-Instruct",
            '<tool_call>\n{"name": <function-name>}\n</tool_call>',
            False,
        ),
        ("Qwen3-Coder-480B-A35B", None, True),
        ("qwen3_coder_flash", None, True),
        ("Qwen3-8B", None, False),
    ],
)
def test_matches(model, template, expected):
    assert Qwen3CoderToolParser.matches(model, template) is expected


def test_registered_at_the_class_priority():
    """(Entry point, lazy target and light registration: tests/test_conformance.py.)"""
    pm = isolated_plugin_manager(("tallow-tool-qwen3-coder", tallow_tool_qwen3_coder.plugin))
    entry = pm.registries.tool_parsers.entry("qwen3_coder")
    assert entry.load() is Qwen3CoderToolParser and entry.priority == Qwen3CoderToolParser.priority
