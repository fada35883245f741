"""The MiniMax M2 parser: calls rendered by a MiniMax-M2 style chat template read back, schema
typing, malformed markup kept exactly, every split of the stream, automatic choice."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from tallow.plugin.testing import assert_every_split_matches_parse, parse_summary
from tallow.plugin.tool_parsing import compact_json
from tallow_tool_minimax.parser import MiniMaxM2ToolParser

# A trimmed MiniMax-M2 chat template: the tool instructions, how an assistant turn with calls
# and a tool result are written, and the generation prompt (which opens the reasoning block).
MINIMAX_TEMPLATE = """{%- set toolcall_begin_token = '<minimax:tool_call>' -%}
{%- set toolcall_end_token = '</minimax:tool_call>' -%}
{{- ']~!b[' ~ ']~b]system' ~ '\\n' }}You are a helpful assistant.
{%- if tools -%}
{{- '\\n\\n# Tools\\nHere are the tools available in JSONSchema format:\\n<tools>\\n' }}
{%- for tool in tools -%}
<tool>{{ tool.function | tojson }}</tool>
{% endfor -%}
{{- '</tools>\\n\\nWhen making tool calls, use XML format to invoke tools and pass parameters:\\n' }}
{{- '\\n' ~ toolcall_begin_token }}
<invoke name="tool-name-1">
<parameter name="param-key-1">param-value-1</parameter>
...
</invoke>
{{- '\\n' ~ toolcall_end_token }}
{%- endif -%}
{{- '[e~[\\n' }}
{%- for message in messages -%}
{%- if message.role == 'assistant' -%}
{{- ']~b]ai' ~ '\\n' }}
{%- if message.content -%}{{ message.content }}{%- endif -%}
{%- if message.tool_calls -%}
{{- '\\n' ~ toolcall_begin_token ~ '\\n' }}
{%- for tool_call in message.tool_calls -%}
{%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '<invoke name="' + tool_call.name + '">\\n' }}
{%- for k, v in tool_call.arguments.items() %}
{{- '<parameter name="' + k + '">' }}
{{- v | tojson if v is not string else v }}
{{- '</parameter>' }}
{% endfor %}
{{- '</invoke>' ~ '\\n' }}
{%- endfor -%}
{{- toolcall_end_token }}
{%- endif -%}
{{- '[e~[' ~ '\\n' }}
{%- elif message.role == 'tool' -%}
{{- ']~b]tool' ~ '\\n<response>' ~ message.content ~ '</response>' ~ '[e~[\\n' }}
{%- elif message.role == 'user' -%}
{{- ']~b]user' ~ '\\n' ~ message.content ~ '[e~[' ~ '\\n' }}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- ']~b]ai' ~ '\\n' ~ '<think>' ~ '\\n' }}
{%- endif -%}
"""

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer"},
        "ratio": {"type": "number"},
        "metric": {"type": "boolean"},
        "note": {"type": ["integer", "null"]},
        "options": {"type": "object"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "html": {"type": "string"},
        "id": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
    },
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}},
    {"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}},
]
TYPED = {
    "city": "São Paulo 東京",
    "days": 14,
    "ratio": 2.5e-3,
    "metric": True,
    "note": None,
    "options": {"depth": 2, "flags": [False, None], "name": 'q"x'},
    "tags": ["a", "b c"],
    # any markup but the value's own closing tag
    "html": '<invoke name="x"><parameter name="y">z</invoke>\n</minimax:tool_call> <b>b</b>',
    "id": "0042",
}


def render(content: str | None, calls: list[tuple[str, dict[str, Any]]]) -> str:
    """The assistant reply as the template writes it, rendered the way Hugging Face renders
    chat templates."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda v: json.dumps(v, ensure_ascii=False)
    messages = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": content,
            "tool_calls": [
                {"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls
            ],
        },
    ]
    prompt = env.from_string(MINIMAX_TEMPLATE).render(messages=messages, tools=TOOLS)
    return prompt.split("]~b]ai\n", 1)[1].split("[e~[", 1)[0]


def check(text: str, tools: list[dict[str, Any]] | None = TOOLS):
    return assert_every_split_matches_parse(MiniMaxM2ToolParser(), text, tools)


def test_template_rendered_calls_read_back() -> None:
    calls = [("get_weather", TYPED), ("ls", {}), ("ls", {"dir": "/tmp"})]
    reply = render("Checking both.", calls)
    assert reply.startswith('Checking both.\n<minimax:tool_call>\n<invoke name="get_weather">\n')
    result = check(reply)
    assert result.content == "Checking both."
    assert [(c.name, json.loads(c.arguments)) for c in result.tool_calls] == calls
    assert result.tool_calls[0].arguments == compact_json(TYPED)


def test_values_typed_by_the_schema() -> None:
    text = (
        '<minimax:tool_call><invoke name="get_weather">'
        '<parameter name="id">0042</parameter><parameter name="days"> 4 </parameter>'
        '<parameter name="metric">false</parameter><parameter name="note">7</parameter>'
        '<parameter name="city">[1]</parameter><parameter name="days2">{"a": 1}</parameter>'
        '<parameter name="free">two words</parameter>'
        "</invoke></minimax:tool_call>"
    )
    (call,) = check(text).tool_calls
    # a string parameter keeps its exact text even when it reads as JSON; a parameter the
    # schema does not name is JSON if it parses as JSON, else its text
    assert json.loads(call.arguments) == {
        "id": "0042",
        "days": 4,
        "metric": False,
        "note": 7,
        "city": "[1]",
        "days2": {"a": 1},
        "free": "two words",
    }
    # a value its type cannot read stays the string written, for validation to report
    bad = text.replace("> 4 <", ">four<")
    assert json.loads(check(bad).tool_calls[0].arguments)["days"] == "four"


BLOCK = '<minimax:tool_call>\n<invoke name="ls">\n</invoke>\n</minimax:tool_call>'
MALFORMED = [
    '<minimax:tool_call>\n<invoke name="ls">\n<parameter name="dir">/tm',  # cut off
    '<minimax:tool_call>\n<invoke name="ls">\n</invoke>\n',  # never closed
    "<minimax:tool_call>\n</minimax:tool_call>",  # no invoke
    '<minimax:tool_call><invoke name="ls"></minimax:tool_call>',  # invoke not closed
    '<minimax:tool_call><invoke name="rm"></invoke></minimax:tool_call>',  # unknown tool
    # one unknown tool makes the whole block content
    '<minimax:tool_call><invoke name="ls"></invoke><invoke name="rm"></invoke></minimax:tool_call>',
    "<minimax:tool_call><invoke name=ls></invoke></minimax:tool_call>",  # unquoted name
    '<minimax:tool_call><invoke name=""></invoke></minimax:tool_call>',  # empty name
    '<minimax:tool_call><invoke name="ls"><parameter name="a">1</parameter>'
    '<parameter name="a">2</parameter></invoke></minimax:tool_call>',  # a key given twice
    '<minimax:tool_call><invoke name="ls">text</invoke></minimax:tool_call>',
    '<minimax:tool_call>{"name": "ls"}</minimax:tool_call>',
]


@pytest.mark.parametrize("text", MALFORMED)
def test_malformed_markup_is_content_exactly(text: str) -> None:
    assert parse_summary(check(text)) == (text, [])
    if text.endswith("/tm"):
        return  # a value runs to the first </parameter>: the block after it would be its text
    # a good block after it is still read; the malformed text stays content (less the
    # trailing whitespace, as before any call)
    result = check(text + "\n" + BLOCK)
    assert result.content == text.rstrip()
    assert [c.name for c in result.tool_calls] == ["ls"]


@pytest.mark.parametrize(
    "text,content,names",
    [
        ("Sure.\n\n" + BLOCK + "\nAnything else?", "Sure.\n\n\nAnything else?", ["ls"]),
        (BLOCK + BLOCK + "\n", None, ["ls", "ls"]),
        ("```\n" + BLOCK + "\n```", "```\n" + BLOCK + "\n```", []),
        ("<think>" + BLOCK + "</think>", "<think>" + BLOCK + "</think>", []),
        ("Write <minimax:tool_call> blocks", "Write <minimax:tool_call> blocks", []),
        ("plain answer", "plain answer", []),
    ],
)
def test_content_around_calls(text: str, content: str | None, names: list[str]) -> None:
    result = check(text)
    assert (result.content, [c.name for c in result.tool_calls]) == (content, names)


def test_a_block_is_held_until_it_closes() -> None:
    stream = MiniMaxM2ToolParser().stream(TOOLS)
    assert stream.feed("Done. <minimax:tool").content == "Done."
    assert not stream.feed('_call>\n<invoke name="ls">\n</invoke>\n')
    out = stream.feed("</minimax:tool_call>")
    assert [(c.name, c.arguments) for c in out.tool_calls] == [("ls", "{}")]
    assert not stream.finish()


def test_matches_minimax_templates_and_names() -> None:
    assert MiniMaxM2ToolParser.matches("any", MINIMAX_TEMPLATE)
    assert not MiniMaxM2ToolParser.matches("MiniMaxAI/MiniMax-M2", "{{ '<tool_call>' }}")
    for name in ("MiniMaxAI/MiniMax-M2", "MiniMaxAI/MiniMax-M2.1", "minimax_m2"):
        assert MiniMaxM2ToolParser.matches(name, None), name
    assert not MiniMaxM2ToolParser.matches("MiniMaxAI/MiniMax-Text-01", None)


def test_server_picks_minimax_m2_for_the_minimax_template() -> None:
    from tallow.plugin.manager import load_plugins
    from tallow.server.parsers import choose_tool_parser

    engine = SimpleNamespace(
        model_name="MiniMaxAI/MiniMax-M2",
        tokenizer=SimpleNamespace(chat_template=MINIMAX_TEMPLATE),
        plugin_manager=load_plugins(None),
    )
    chosen = choose_tool_parser(engine)
    assert chosen.name == "minimax_m2" and chosen.parser is MiniMaxM2ToolParser
