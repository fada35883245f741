"""GLM-4.7's own chat template with thinking on and off, read by the parser the server picks.

``data/glm47_chat_template.jinja`` is the chat template of zai-org/GLM-4.7-Flash (MIT license),
byte for byte llama.cpp's ``models/templates/GLM-4.7-Flash.jinja`` (llama-cpp-python 0.3.36's
sdist, the copy llama.cpp takes from the model repository). Its generation prompt opens
``<think>``, or writes ``</think>`` when ``enable_thinking`` is false: the response then begins
in the content.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tallow_reasoning_think.parser import OpenThinkReasoningParser, ThinkReasoningParser

from tallow.plugin.testing.reasoning_parser import stream_split

TEMPLATE = (Path(__file__).parent / "data" / "glm47_chat_template.jinja").read_text()
MESSAGES = [
    {"role": "user", "content": "Where is the Eiffel tower?"},
    {"role": "assistant", "content": "<think>Paris.</think>In Paris."},
    {"role": "user", "content": "And Big Ben?"},
]


def render(**kwargs: object) -> str:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda v, ensure_ascii=False: json.dumps(v, ensure_ascii=ensure_ascii)
    template = env.from_string(TEMPLATE)
    return template.render(messages=MESSAGES, add_generation_prompt=True, **kwargs)


def test_the_template_is_claimed_by_deepseek_r1() -> None:
    assert OpenThinkReasoningParser.matches("zai-org/GLM-4.7", TEMPLATE)
    assert ThinkReasoningParser.matches("zai-org/GLM-4.7", TEMPLATE)
    assert OpenThinkReasoningParser.priority > ThinkReasoningParser.priority


@pytest.mark.parametrize(
    "kwargs,reply,reasoning,content",
    [
        ({}, "London, Westminster.</think>In London.", "London, Westminster.", "In London."),
        ({"enable_thinking": True}, "Hmm.</think>London.", "Hmm.", "London."),
        ({"enable_thinking": False}, "In London, 1 < 2.", "", "In London, 1 < 2."),
        # the model may still close an empty block, or write one, with thinking off
        ({"enable_thinking": False}, "</think>In London.", "", "In London."),
        ({"enable_thinking": False}, "<think>x</think>In London.", "x", "In London."),
    ],
    ids=["default", "on", "off", "off-closing", "off-block"],
)
def test_thinking_on_and_off(
    kwargs: dict[str, object], reply: str, reasoning: str, content: str
) -> None:
    prompt = render(**kwargs)
    closed = kwargs.get("enable_thinking") is False
    assert prompt.endswith("<|assistant|></think>" if closed else "<|assistant|><think>")
    # the earlier turn's reasoning was dropped from the history: the last tag is the prompt's
    assert "<think>Paris." not in prompt
    reader = OpenThinkReasoningParser().for_prompt(prompt)
    assert reader.parse(reply) == (reasoning, content)
    for i in range(len(reply) + 1):
        assert stream_split(reader, [reply[:i], reply[i:]]) == (reasoning, content)
    assert stream_split(reader, list(reply)) == (reasoning, content)


def test_without_the_prompt_the_reply_is_read_as_before() -> None:
    # a caller that never tells the prompt keeps the old reading: all reasoning
    assert OpenThinkReasoningParser().parse("In London.") == ("In London.", "")
