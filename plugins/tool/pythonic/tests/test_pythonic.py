"""The pythonic parser: Python literals as arguments, replies that are not call lists kept
exactly, release of held text as soon as it cannot be a call list, every split of the stream,
automatic choice for Llama 4."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from tallow.plugin.testing import assert_every_split_matches_parse, parse_summary
from tallow_tool_pythonic.parser import PythonicToolParser

# A trimmed Llama 4 chat template: its headers, the instruction that asks for Python-style
# calls, the python_start/python_end markers and the ipython role of tool results.
LLAMA4_TEMPLATE = """{{- bos_token }}
{%- if tools %}
{{- "<|header_start|>system<|header_end|>\\n\\n" }}
{{- "You have access to the following functions. If you decide to invoke any of the function(s), "
    "you MUST put it in the format of [func_name1(params_name1=params_value1, params_name2=params_value2...), func_name2(params)]\\n\\n" }}
{%- for t in tools %}{{- t | tojson(indent=4) }}{{- "\\n\\n" }}{%- endfor %}
{{- "<|eot|>" }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'assistant' and message.tool_calls %}
{{- '<|header_start|>assistant<|header_end|>\\n\\n<|python_start|>' }}
{%- for tool_call in message.tool_calls %}
{{- '{"name": "' + tool_call.function.name + '", "parameters": ' + tool_call.function.arguments | tojson + '}' }}
{%- endfor %}
{{- '<|python_end|><|eot|>' }}
{%- elif message.role == 'tool' or message.role == 'ipython' %}
{{- "<|header_start|>ipython<|header_end|>\\n\\n" + message.content + "<|eot|>" }}
{%- else %}
{{- '<|header_start|>' + message.role + '<|header_end|>\\n\\n' + message.content + '<|eot|>' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|header_start|>assistant<|header_end|>\\n\\n' }}{%- endif %}
"""

TOOLS = [
    {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
    for n in ("get_weather", "ls", "search")
]


def pythonic(calls: list[tuple[str, dict[str, Any]]]) -> str:
    """A call list as the model writes it: keyword arguments as Python literals."""
    return (
        "["
        + ", ".join(
            f"{name}(" + ", ".join(f"{k}={v!r}" for k, v in args.items()) + ")"
            for name, args in calls
        )
        + "]"
    )


def check(text: str, tools: list[dict[str, Any]] | None = TOOLS):
    return assert_every_split_matches_parse(PythonicToolParser(), text, tools)


TYPED = {
    "city": "San Francisco",
    "days": 3,
    "big": 12345678901234567890,
    "ratio": -0.25,
    "metric": True,
    "off": False,
    "note": None,
    "options": {"depth": 2, "flags": [True, None], "nested": {"k": "v"}},
    "tags": ["a", "b c"],
    "markup": "<|python_end|>], x=1) [get_weather(city='x')] \"quoted\" 'single' \\ back",
    "text": "line 1\nline 2\t東京 😀",
}


@pytest.mark.parametrize("wrap", [False, True], ids=["bare", "python_start"])
def test_literals_become_json(wrap: bool) -> None:
    calls = [("get_weather", TYPED), ("ls", {}), ("search", {"q": "x"})]
    text = pythonic(calls)
    if wrap:
        text = "<|python_start|>" + text + "<|python_end|>"
    result = check(text)
    assert result.content is None
    assert [(c.name, json.loads(c.arguments)) for c in result.tool_calls] == calls


def test_python_spellings() -> None:
    text = (
        "\n[search(q='''it's \"triple\"''', r=r'\\d+', t=(1, (2, 3)), e=[], d={}, "
        "n=-1e-3, h=0x10, s='a' 'b', u=u'x',)]\n"
    )
    (call,) = check(text).tool_calls
    assert json.loads(call.arguments) == {
        "q": 'it\'s "triple"',
        "r": "\\d+",
        "t": [1, [2, 3]],
        "e": [],
        "d": {},
        "n": -0.001,
        "h": 16,
        "s": "ab",
        "u": "x",
    }


NOT_CALLS = [
    "[get_weather('Paris')]",  # a positional argument
    "[get_weather(city)]",
    "[get_weather(city=city)]",  # a name as value
    "[get_weather(city=str(1))]",  # a call as value
    "[get_weather(days=1 + 2)]",  # an expression
    "[get_weather(days={1, 2})]",  # a set
    "[get_weather(days=b'x')]",  # bytes
    "[get_weather(days=1e999)]",  # not a finite number
    "[get_weather(days={1: 'a'})]",  # a non-string key
    "[get_weather(**kw)]",
    "[get_weather(a=1, a=2)]",  # a keyword given twice
    "[os.system(cmd='ls')]",  # not a plain name
    "[rm(path='/')]",  # an unknown tool
    "[get_weather(city='Paris')] is what I would call.",  # text after the list
    "I would call [get_weather(city='Paris')]",  # text before it
    "[get_weather(city='Paris') # comment\n]",
    "[get_weather(city='Paris')",  # never closed
    "[get_weather(city='Paris'))]",
    "[get_weather(city=)]",
    "[]",
    "[1, 2, 3]",
    "[Note] see below",
    "[get_weather(city='Paris'); ls()]",
    "<|python_start|>get_weather(city='Paris')<|python_end|>",  # no list
    "<|python_start|>[ls()]<|python_end|> and more",
    "[ls()]<|python_end|>",  # a closing marker without its opening one
    "```\n[ls()]\n```",
]


@pytest.mark.parametrize("text", NOT_CALLS)
def test_anything_else_is_content_exactly(text: str) -> None:
    assert parse_summary(check(text)) == (text, [])


def test_text_is_released_once_it_cannot_be_a_call_list() -> None:
    stream = PythonicToolParser().stream(TOOLS)
    assert stream.feed("[Note").content == ""  # could still be "[Note(...)]"
    assert stream.feed("] see").content == "[Note] see"
    stream = PythonicToolParser().stream(TOOLS)
    assert stream.feed("  [get_weather(city='Paris', days=").content == ""
    assert stream.feed("3)]").content == ""  # a whole call list: held until the reply ends
    assert stream.feed(" and").content == "  [get_weather(city='Paris', days=3)] and"
    stream = PythonicToolParser().stream(TOOLS)
    assert stream.feed("[get_weather(city='Paris')]\n").content == ""
    out = stream.finish()
    assert [(c.name, c.arguments) for c in out.tool_calls] == [("get_weather", '{"city":"Paris"}')]
    stream = PythonicToolParser().stream(TOOLS)
    assert stream.feed("[1").content == "[1"  # a list, but not of calls


def test_matches_llama4_templates_and_names() -> None:
    assert PythonicToolParser.matches("any", LLAMA4_TEMPLATE)
    llama31 = "<|start_header_id|>ipython<|end_header_id|>{{- '<|python_tag|>' }}"
    assert not PythonicToolParser.matches("meta-llama/Llama-4-Scout-17B-16E-Instruct", llama31)
    for name in ("meta-llama/Llama-4-Scout-17B-16E-Instruct", "Llama-4-Maverick", "llama4"):
        assert PythonicToolParser.matches(name, None), name
    assert not PythonicToolParser.matches("meta-llama/Llama-3.1-8B-Instruct", None)


def test_server_picks_pythonic_for_the_llama4_template() -> None:
    from tallow.plugin.manager import load_plugins
    from tallow.server.parsers import choose_tool_parser

    engine = SimpleNamespace(
        model_name="meta-llama/Llama-4-Scout-17B-16E-Instruct",
        tokenizer=SimpleNamespace(chat_template=LLAMA4_TEMPLATE),
        plugin_manager=load_plugins(None),
    )
    chosen = choose_tool_parser(engine)
    assert chosen.name == "pythonic" and chosen.parser is PythonicToolParser
    assert "llama3_json" not in [name for name, _ in chosen.fallbacks]
