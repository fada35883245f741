"""The Gemma 4 parser: calls rendered by Gemma 4's own chat template read back (every value
type the template writes), malformed markup kept as content, end-of-turn markers dropped, every
split of the stream, automatic choice.

Both fixtures are chat templates of Google's Gemma 4 instruction-tuned models (Apache-2.0), as
llama.cpp ships them (llama-cpp-python 0.3.36's sdist): ``data/chat_template.jinja`` exactly as
its converter embedded it (``tokenizer.chat_template``) in ``models/ggml-vocab-gemma-4.gguf``
(tests/server/test_gemma4_formats.py compares the two), and ``data/chat_template_31b_it.jinja``,
``models/templates/google-gemma-4-31B-it.jinja``, google/gemma-4-31B-it's later revision (it
reads OpenAI ``tool`` messages and ends a turn of calls with ``<|tool_response>``).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tallow_tool_gemma4.parser import Gemma4ToolParser

from tallow.plugin.testing import assert_every_split_matches_parse, parse_summary
from tallow.plugin.tool_parsing import compact_json

DATA = Path(__file__).parent / "data"
TEMPLATE = (DATA / "chat_template.jinja").read_text()
TEMPLATE_31B = (DATA / "chat_template_31b_it.jinja").read_text()
TEMPLATES = pytest.mark.parametrize("template", [TEMPLATE, TEMPLATE_31B], ids=["vocab", "31b-it"])
Q = '<|"|>'
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "description": "The city"},
        "days": {"type": "integer"},
        "ratio": {"type": "number"},
        "metric": {"type": "boolean"},
        "options": {"type": "object"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "code": {"type": "string"},
    },
    "required": ["city"],
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather", "parameters": SCHEMA},
    },
    {"type": "function", "function": {"name": "ls", "description": "List", "parameters": {}}},
]
TYPED = {
    "city": "Zürich 東京, {braces}: [x]",
    "days": 3,
    "ratio": -0.25,
    "metric": False,
    "options": {"depth": 2, "flags": [True, False], "name": "x y", "inner": {"k": "v"}},
    "tags": ["a", "b c"],
    "code": 'if a < b:\n    print("<|tool_call>call:x{}<tool_call|>")\n',
}


def render(template: str, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    """``messages`` as a Gemma 4 template writes them, rendered the way Hugging Face renders
    chat templates."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    compiled = env.from_string(template)
    return compiled.render(messages=messages, bos_token="<bos>", tools=TOOLS, **kwargs)


def reply_of(template: str, content: str | None, calls: list[tuple[str, dict[str, Any]]]) -> str:
    """The model turn ``template`` writes for an assistant message with ``calls`` (up to its
    ``<turn|>``; the later revision ends it with ``<|tool_response>`` instead)."""
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
    prompt = render(template, messages)
    turn = prompt.split("<|turn>model\n", 1)[1]
    return turn.split("<turn|>", 1)[0]


def check(text: str, tools: list[dict[str, Any]] | None = TOOLS):
    return assert_every_split_matches_parse(Gemma4ToolParser(), text, tools)


@TEMPLATES
def test_template_rendered_calls_read_back(template: str) -> None:
    calls = [("get_weather", TYPED), ("ls", {}), ("ls", {"dir": "/tmp"})]
    reply = reply_of(template, "Checking both.", calls)
    assert reply.startswith("<|tool_call>call:get_weather{city:" + Q + "Zürich")
    end = "<|tool_response>" if template is TEMPLATE_31B else ""
    assert reply.endswith("<tool_call|>Checking both." + end)
    result = check(reply)
    assert result.content == "Checking both."
    assert [(c.name, json.loads(c.arguments)) for c in result.tool_calls] == calls
    # the template writes keys sorted (dictsort); the arguments keep the order written
    ordered = json.loads(json.dumps(TYPED, sort_keys=True))
    assert result.tool_calls[0].arguments == compact_json(ordered)


@TEMPLATES
def test_the_generation_prompt_and_declarations(template: str) -> None:
    prompt = render(template, [{"role": "user", "content": "hi"}], add_generation_prompt=True)
    # tools are declared in the system turn; thinking off closes an empty thought channel
    assert "<|tool>declaration:get_weather{description:" + Q + "Weather" + Q in prompt
    assert prompt.endswith("<|turn>model\n<|channel>thought\n<channel|>")
    thinking = render(
        template,
        [{"role": "user", "content": "hi"}],
        add_generation_prompt=True,
        enable_thinking=True,
    )
    assert thinking.startswith("<bos><|turn>system\n<|think|>")
    assert thinking.endswith("<|turn>model\n")


def test_lenient_forms() -> None:
    text = (
        f'<|tool_call>call:get_weather{{ {Q}city{Q} : "Paris \\u00e9" , "days":4,'
        "metric:true,note:None,other:null,big:1e+16,neg:-7}<tool_call|>"
    )
    (call,) = check(text).tool_calls
    assert json.loads(call.arguments) == {
        "city": "Paris é",
        "days": 4,
        "metric": True,
        "note": None,
        "other": None,
        "big": 1e16,
        "neg": -7,
    }


CALL = "<|tool_call>call:ls{dir:" + Q + "/" + Q + "}<tool_call|>"
MALFORMED = [
    "<|tool_call>call:ls{dir:" + Q + "/tm",  # cut off in a string
    "<|tool_call>call:ls{dir:/tmp}<tool_call|>",  # an unquoted string
    "<|tool_call>call:ls{dir:" + Q + "a" + Q + ",dir:" + Q + "b" + Q + "}<tool_call|>",
    "<|tool_call>call:rm{path:" + Q + "/" + Q + "}<tool_call|>",  # unknown tool
    "<|tool_call>call:get weather{}<tool_call|>",  # a name with a space
    "<|tool_call>call:{}<tool_call|>",  # no name
    "<|tool_call>ls{}<tool_call|>",  # no call:
    '<|tool_call>{"name": "ls", "arguments": {}}<tool_call|>',  # JSON
    "<|tool_call>call:ls{a:1} extra<tool_call|>",  # text after the arguments
    "<|tool_call>call:ls{a:1,}<tool_call|>",  # a trailing comma
    "<|tool_call>call:ls{a:nan}<tool_call|>",  # not a number of the format
    "<|tool_call>call:ls{a:1}",  # never closed
]


@pytest.mark.parametrize("text", MALFORMED)
def test_malformed_markup_is_content_exactly(text: str) -> None:
    assert parse_summary(check(text)) == (text, [])
    if text.endswith("/tm"):
        return  # a string runs to the next quote token: the call after it would be its text
    result = check(text + "\n" + CALL)
    assert result.content == text.rstrip()
    assert [c.name for c in result.tool_calls] == ["ls"]


@pytest.mark.parametrize(
    "text,content,names",
    [
        ("Sure.\n\n" + CALL + "\nAnything else?", "Sure.\n\n\nAnything else?", ["ls"]),
        (CALL + CALL + "<|tool_response>", None, ["ls", "ls"]),
        ("Paris.<turn|>", "Paris.", []),
        ("Paris.<eos>", "Paris.", []),
        ("```\n" + CALL + "\n```", "```\n" + CALL + "\n```", []),
        ("Use <|tool_call>call:name{...", "Use <|tool_call>call:name{...", []),
        ("plain answer", "plain answer", []),
    ],
)
def test_content_around_calls(text: str, content: str | None, names: list[str]) -> None:
    result = check(text)
    assert (result.content, [c.name for c in result.tool_calls]) == (content, names)


def test_partial_markup_is_held_until_it_decides() -> None:
    stream = Gemma4ToolParser().stream(TOOLS)
    assert stream.feed("Done. <|tool_ca").content == "Done."
    assert stream.feed("ll>call:ls{dir:" + Q + "/" + Q + "}<tool_").content == ""
    out = stream.feed("call|>")
    assert [(c.name, c.arguments) for c in out.tool_calls] == [("ls", '{"dir":"/"}')]
    assert not stream.finish()


def test_matches_gemma4_templates_and_names() -> None:
    assert Gemma4ToolParser.matches("any", TEMPLATE)
    assert Gemma4ToolParser.matches("any", TEMPLATE_31B)
    assert Gemma4ToolParser.reads_special_tokens
    assert not Gemma4ToolParser.matches("google/gemma-4-31b-it", "{{ '<tool_call>' }}")
    for name in ("google/gemma-4-31b-it", "google/gemma-4-E4B-it", "gemma4"):
        assert Gemma4ToolParser.matches(name, None), name
    assert not Gemma4ToolParser.matches("google/gemma-3-27b-it", None)


def test_server_picks_gemma4_for_the_gemma4_template() -> None:
    from tallow.plugin.manager import load_plugins
    from tallow.server.parsers import choose_tool_parser

    engine = SimpleNamespace(
        model_name="google/gemma-4-31b-it",
        tokenizer=SimpleNamespace(chat_template=TEMPLATE),
        plugin_manager=load_plugins(None),
    )
    chosen = choose_tool_parser(engine)
    assert chosen.name == "gemma4" and chosen.parser is Gemma4ToolParser
    assert "hermes" not in [name for name, _ in chosen.fallbacks]
