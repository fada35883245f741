"""GLM-4.7, MiniMax M2 and Llama 4 replies through the app: the tool and reasoning parsers
are chosen from the model's chat template, and a reply written in the family's format comes
back as reasoning, content and tool calls, whole and streamed."""

from __future__ import annotations

import json
from typing import Any

import pytest
from server_fakes import FakeEngine
from server_helpers import TOOLS
from test_tools import post, streamed

# Trimmed chat templates that keep what tells the families apart: the call markup each asks
# for and, for GLM-4.7 and MiniMax M2, a generation prompt that opens the reasoning block.
GLM47 = (
    "[gMASK]<sop>{%- if tools -%}<|system|>\n# Tools\n<tools>{% for t in tools %}"
    "{{ t | tojson }}{% endfor %}</tools>\nFor each function call, output the function name and "
    "arguments within the following XML format:\n<tool_call>{function-name}<arg_key>{arg-key-1}"
    "</arg_key><arg_value>{arg-value-1}</arg_value>...</tool_call>{%- endif -%}"
    "{%- for m in messages -%}<|{{ m.role }}|>{{ m.content }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{{- '</think>' if (enable_thinking is "
    "defined and not enable_thinking) else '<think>' -}}{%- endif -%}"
)
MINIMAX_M2 = (
    "]~!b[]~b]system\n{%- if tools -%}<tools>{% for t in tools %}<tool>{{ t.function | tojson }}"
    '</tool>{% endfor %}</tools>\n<minimax:tool_call>\n<invoke name="tool-name-1">\n'
    '<parameter name="param-key-1">param-value-1</parameter>\n</invoke>\n'
    "</minimax:tool_call>{%- endif -%}[e~[\n{%- for m in messages -%}]~b]{{ m.role }}\n"
    "{{ m.content }}[e~[\n{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- ']~b]ai' ~ '\\n' ~ '<think>' ~ '\\n' }}{%- endif -%}"
)
LLAMA4 = (
    "{{- bos_token }}{%- for m in messages %}{{- '<|header_start|>' + m.role + "
    "'<|header_end|>\\n\\n' + m.content + '<|eot|>' }}{%- endfor %}{%- if tools %}"
    "{{- 'If you decide to invoke any of the function(s), you MUST put it in the format of "
    "[func_name1(params_name1=params_value1, params_name2=params_value2...)]' }}{%- endif %}"
    "{%- if add_generation_prompt %}{{- '<|header_start|>assistant<|header_end|>\\n\\n' }}"
    "{%- endif %}"
)

CASES = [
    (
        GLM47,
        "Paris, then add.</think>I'll check.<tool_call>get_weather<arg_key>city</arg_key>"
        "<arg_value>Paris</arg_value><arg_key>unit</arg_key><arg_value>C</arg_value></tool_call>"
        "<tool_call>add<arg_key>a</arg_key><arg_value>2</arg_value><arg_key>b</arg_key>"
        "<arg_value>-3</arg_value></tool_call>",
        ("glm45", "deepseek_r1"),
        "Paris, then add.",
        "I'll check.",
    ),
    (
        MINIMAX_M2,
        "Paris, then add.\n</think>\n\nI'll check.\n<minimax:tool_call>\n"
        '<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n'
        '<parameter name="unit">C</parameter>\n</invoke>\n<invoke name="add">\n'
        '<parameter name="a">2</parameter>\n<parameter name="b">-3</parameter>\n</invoke>\n'
        "</minimax:tool_call>",
        ("minimax_m2", "deepseek_r1"),
        "Paris, then add.\n",
        "\n\nI'll check.",
    ),
    (
        LLAMA4,
        "[get_weather(city='Paris', unit='C'), add(a=2, b=-3)]",
        ("pythonic", None),
        None,
        None,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=["glm47", "minimax_m2", "llama4"])
def test_family_replies_become_calls(serve, case: tuple[Any, ...]) -> None:
    template, reply, parsers, reasoning, content = case
    engine = FakeEngine(lambda prompt, params, i: reply)
    engine.tokenizer.tokenizer_config["chat_template"] = template
    client = serve(engine)
    selected = client.get("/v1/plugins").json()["selected"]
    assert (selected["tool_parser"], selected.get("reasoning_parser")) == parsers
    body = post(client, tools=TOOLS)
    (choice,) = body["choices"]
    message = choice["message"]
    assert choice["finish_reason"] == "tool_calls"
    assert (message.get("reasoning_content"), message["content"]) == (reasoning, content)
    expected = [("get_weather", {"city": "Paris", "unit": "C"}), ("add", {"a": 2, "b": -3})]
    got = [
        (c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in message["tool_calls"]
    ]
    assert got == expected
    streamed_content, calls, finish = streamed(client, tools=TOOLS)
    assert finish == "tool_calls" and streamed_content == (content or "")
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == expected


def test_llama4_json_calls_are_read_by_the_json_fallback(serve) -> None:
    # Llama 4's own template writes earlier calls as JSON objects: a reply in that form is read
    # by the json parser, the fallback that matches every model.
    reply = '{"name": "add", "parameters": {"a": 2, "b": -3}}'
    engine = FakeEngine(lambda prompt, params, i: reply)
    engine.tokenizer.tokenizer_config["chat_template"] = LLAMA4
    client = serve(engine)
    selected = client.get("/v1/plugins").json()["selected"]
    assert selected["tool_parser"] == "pythonic" and "json" in selected["fallbacks"]
    message = post(client, tools=TOOLS)["choices"][0]["message"]
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]] == [
        ("add", '{"a":2,"b":-3}')
    ]
