"""The GLM parser: calls rendered by GLM-4.5/4.6 and GLM-4.7 style chat templates read back,
schema typing, malformed markup kept exactly, every split of the stream, automatic choice."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from tallow.plugin.testing import assert_every_split_matches_parse, parse_summary
from tallow.plugin.tool_parsing import compact_json
from tallow_tool_glm.parser import GlmToolParser

# A trimmed GLM-4.5 / 4.6 chat template: the tool instructions, how an assistant turn with
# calls and a tool result are written, and the generation prompt.
GLM45_TEMPLATE = """[gMASK]<sop>
{%- if tools -%}
<|system|>
# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{% for tool in tools %}
{{ tool | tojson(ensure_ascii=False) }}
{% endfor %}
</tools>

For each function call, output the function name and arguments within the following XML format:
<tool_call>{function-name}
<arg_key>{arg-key-1}</arg_key>
<arg_value>{arg-value-1}</arg_value>
...
</tool_call>{%- endif -%}
{% for m in messages %}
{%- if m.role == 'user' -%}<|user|>
{{ m.content }}
{%- elif m.role == 'assistant' -%}
<|assistant|>
{{ '\\n<think></think>' }}
{%- if m.content -%}
{{ '\\n' + m.content.strip() }}
{%- endif -%}
{% if m.tool_calls %}
{% for tc in m.tool_calls %}
{%- if tc.function %}
    {%- set tc = tc.function %}
{%- endif %}
{{ '\\n<tool_call>' + tc.name }}
{% set _args = tc.arguments or {} %}
{% for k, v in _args.items() %}
<arg_key>{{ k }}</arg_key>
<arg_value>{{ v | tojson(ensure_ascii=False) if v is not string else v }}</arg_value>
{% endfor %}
</tool_call>{% endfor %}
{% endif %}
{%- elif m.role == 'tool' -%}
<|observation|>
<tool_response>
{{ m.content }}
</tool_response>
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    <|assistant|>{{- '\\n<think></think>' if (enable_thinking is defined and not enable_thinking) else '' -}}
{%- endif -%}
"""

# A trimmed GLM-4.7 chat template: the same markup without newlines, and a generation prompt
# that opens the reasoning block.
GLM47_TEMPLATE = """[gMASK]<sop>
{%- if tools -%}
<|system|>
# Tools

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{% for tool in tools %}
{{ tool | tojson(ensure_ascii=False) }}
{% endfor %}
</tools>

For each function call, output the function name and arguments within the following XML format:
<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>{arg-value-1}</arg_value>...</tool_call>{%- endif -%}
{%- for m in messages -%}
{%- if m.role == 'user' -%}<|user|>{{ m.content }}
{%- elif m.role == 'assistant' -%}
<|assistant|></think>{{ m.content.strip() if m.content else '' }}
{%- if m.tool_calls -%}
{%- for tc in m.tool_calls -%}
{%- set tc = tc.function if tc.function else tc -%}
{{- '<tool_call>' + tc.name -}}
{%- for k, v in (tc.arguments or {}).items() -%}
<arg_key>{{ k }}</arg_key><arg_value>{{ v | tojson(ensure_ascii=False) if v is not string else v }}</arg_value>
{%- endfor -%}
</tool_call>
{%- endfor -%}
{%- endif -%}
{%- elif m.role == 'tool' -%}<|observation|><tool_response>{{ m.content }}</tool_response>
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    <|assistant|>{{- '</think>' if (enable_thinking is defined and not enable_thinking) else '<think>' -}}
{%- endif -%}
"""

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer"},
        "ratio": {"type": "number"},
        "metric": {"type": "boolean"},
        # types are tried in the schema's order: "null" reads as null only if null comes first
        "note": {"type": ["null", "string"]},
        "options": {"type": "object"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "code": {"type": "string"},
        "zip": {"type": "string"},
    },
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}},
    {"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}},
]
TYPED = {
    "city": "Zürich 東京",
    "days": 3,
    "ratio": -0.25,
    "metric": False,
    "note": None,
    "options": {"depth": 2, "flags": [True, None], "name": "x"},
    "tags": ["a", "b c"],
    "code": 'if a < b:\n    print("<tool_call>x</tool_call> <arg_key>k</arg_key>")\n',
    "zip": "8001",
}


def render(template: str, content: str | None, calls: list[tuple[str, dict[str, Any]]]) -> str:
    """The assistant reply as ``template`` writes it (the reasoning block and the newlines
    after it left out), rendered
    the way Hugging Face renders chat templates."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda v, ensure_ascii=False: json.dumps(v, ensure_ascii=ensure_ascii)
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
    prompt = env.from_string(template).render(messages=messages, tools=TOOLS)
    reply = prompt.split("<|assistant|>", 1)[1]
    return reply.split("</think>", 1)[1].lstrip("\n")


def check(text: str, tools: list[dict[str, Any]] | None = TOOLS):
    return assert_every_split_matches_parse(GlmToolParser(), text, tools)


@pytest.mark.parametrize("template", [GLM45_TEMPLATE, GLM47_TEMPLATE], ids=["glm45", "glm47"])
def test_template_rendered_calls_read_back(template: str) -> None:
    calls = [("get_weather", TYPED), ("ls", {}), ("ls", {"dir": "/tmp"})]
    reply = render(template, "Checking both.", calls)
    assert reply.replace("\n", "").startswith("Checking both.<tool_call>get_weather<arg_key>")
    result = check(reply)
    assert result.content == "Checking both."
    assert [(c.name, json.loads(c.arguments)) for c in result.tool_calls] == calls
    assert result.tool_calls[0].arguments == compact_json(TYPED)


def test_values_typed_by_the_schema() -> None:
    text = (
        "<tool_call>get_weather<arg_key>zip</arg_key><arg_value>8001</arg_value>"
        "<arg_key>days</arg_key><arg_value> 4 </arg_value>"
        "<arg_key>metric</arg_key><arg_value>true</arg_value>"
        "<arg_key>note</arg_key><arg_value>null</arg_value>"
        "<arg_key>ratio</arg_key><arg_value>1e-3</arg_value>"
        "<arg_key>city</arg_key><arg_value> [1] </arg_value></tool_call>"
    )
    (call,) = check(text).tool_calls
    # a string parameter keeps its exact text, even when it reads as JSON
    assert json.loads(call.arguments) == {
        "zip": "8001",
        "days": 4,
        "metric": True,
        "note": None,
        "ratio": 0.001,
        "city": " [1] ",
    }
    # without a schema (no tools, or a parameter it does not name) a value is JSON if it
    # parses as JSON (the template writes every non-string that way), else its text
    (call,) = check(text.replace("<arg_key>city", "<arg_key>other"), None).tool_calls
    assert json.loads(call.arguments)["zip"] == 8001
    assert json.loads(call.arguments)["other"] == [1]
    # a value the schema's type cannot read stays the string written, for validation to report
    (call,) = check(
        "<tool_call>get_weather<arg_key>days</arg_key><arg_value>many</arg_value></tool_call>"
    ).tool_calls
    assert json.loads(call.arguments) == {"days": "many"}


CALL = "<tool_call>ls\n<arg_key>dir</arg_key>\n<arg_value>/</arg_value>\n</tool_call>"
MALFORMED = [
    "<tool_call>ls\n<arg_key>dir</arg_key>\n<arg_value>/tm",  # cut off in a value
    "<tool_call>ls<arg_key>dir</arg_key>/tmp</tool_call>",  # no <arg_value>
    "<tool_call>ls<arg_key>dir</arg_value><arg_value>/</arg_value></tool_call>",
    "<tool_call>ls<arg_key></arg_key><arg_value>/</arg_value></tool_call>",  # empty key
    "<tool_call>ls<arg_key>a</arg_key><arg_value>1</arg_value>"
    "<arg_key>a</arg_key><arg_value>2</arg_value></tool_call>",  # a key given twice
    "<tool_call>rm<arg_key>path</arg_key><arg_value>/</arg_value></tool_call>",  # unknown tool
    "<tool_call>get weather</tool_call>",  # a name with a space
    "<tool_call><arg_key>a</arg_key><arg_value>1</arg_value></tool_call>",  # no name
    '<tool_call>\n{"name": "ls", "arguments": {}}\n</tool_call>',  # hermes JSON
    "<tool_call>ls<arg_key>dir</arg_key><arg_value>/</arg_value>",  # never closed
]


@pytest.mark.parametrize("text", MALFORMED)
def test_malformed_markup_is_content_exactly(text: str) -> None:
    assert parse_summary(check(text)) == (text, [])
    if text.endswith("/tm"):
        return  # a value runs to the first </arg_value>: the call after it would be its text
    # a good call after it is still read; the malformed text stays content (less the
    # trailing whitespace, as before any call)
    result = check(text + "\n" + CALL)
    assert result.content == text.rstrip()
    assert [c.name for c in result.tool_calls] == ["ls"]


@pytest.mark.parametrize(
    "text,content,names",
    [
        ("Sure.\n\n" + CALL + "\nAnything else?", "Sure.\n\n\nAnything else?", ["ls"]),
        (CALL + CALL + "\n", None, ["ls", "ls"]),
        ("```\n" + CALL + "\n```", "```\n" + CALL + "\n```", []),
        ("<think>" + CALL + "</think>", "<think>" + CALL + "</think>", []),
        ("Use <tool_call>name<arg_key>...", "Use <tool_call>name<arg_key>...", []),
        ("plain answer", "plain answer", []),
    ],
)
def test_content_around_calls(text: str, content: str | None, names: list[str]) -> None:
    result = check(text)
    assert (result.content, [c.name for c in result.tool_calls]) == (content, names)


def test_partial_markup_is_held_until_it_decides() -> None:
    stream = GlmToolParser().stream(TOOLS)
    assert stream.feed("Done. <tool_ca").content == "Done."
    assert stream.feed("ll>ls<arg_key>dir</arg_key><arg_value>/</arg").content == ""
    out = stream.feed("_value></tool_call>")
    assert [(c.name, c.arguments) for c in out.tool_calls] == [("ls", '{"dir":"/"}')]
    assert not stream.finish()


def test_matches_glm_templates_and_names() -> None:
    assert GlmToolParser.matches("any", GLM45_TEMPLATE)
    assert GlmToolParser.matches("any", GLM47_TEMPLATE)
    assert not GlmToolParser.matches("zai-org/GLM-4.5", "{{ '<tool_call>' }}")
    for name in ("zai-org/GLM-4.5-Air", "THUDM/glm-4.6", "zai-org/GLM-4.7-Flash", "glm4.5"):
        assert GlmToolParser.matches(name, None), name
    assert not GlmToolParser.matches("THUDM/glm-4-9b-chat", None)
    assert not GlmToolParser.matches("Qwen/Qwen3-8B", None)


@pytest.mark.parametrize("template", [GLM45_TEMPLATE, GLM47_TEMPLATE], ids=["glm45", "glm47"])
def test_server_picks_glm45_for_glm_templates(template: str) -> None:
    from tallow.plugin.manager import load_plugins
    from tallow.server.parsers import choose_tool_parser

    engine = SimpleNamespace(
        model_name="zai-org/GLM-4.5-Air",
        tokenizer=SimpleNamespace(chat_template=template),
        plugin_manager=load_plugins(None),
    )
    chosen = choose_tool_parser(engine)
    assert chosen.name == "glm45" and chosen.parser is GlmToolParser
    # hermes also claims the template (it contains "<tool_call>"): it stays a fallback
    assert "hermes" in [name for name, _ in chosen.fallbacks]
