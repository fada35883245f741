"""GLM-4.7 with thinking on and off through the app: the server renders the model's own chat
template (GLM-4.7-Flash's, plugins/reasoning/think/tests/data), tells the reasoning parser the
prompt, and a reply to a prompt whose template closed the ``<think>`` block is content, not
reasoning. The parser is chosen from the template (``deepseek_r1``); whole responses, SSE
streams and the official ``openai`` client agree."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from server_fakes import FakeEngine
from server_helpers import TOOLS, openai_client
from test_reasoning import MSG, streamed, whole

ROOT = Path(__file__).resolve().parents[2]
GLM47 = (ROOT / "plugins/reasoning/think/tests/data/glm47_chat_template.jinja").read_text()
ON = "The tower is in Paris.\n</think>In Paris, café 😀."
OFF = "In Paris, café 😀. 1 < 2 </b>"


def glm47(plugin_manager: Any, reply: str) -> FakeEngine:
    fake = FakeEngine(lambda prompt, params, i: reply, plugin_manager=plugin_manager)
    fake.tokenizer.tokenizer_config["chat_template"] = GLM47
    return fake


def test_the_glm47_template_selects_deepseek_r1(serve, plugin_manager) -> None:
    client = serve(glm47(plugin_manager, ON))
    selected = client.get("/v1/plugins").json()["selected"]
    assert selected["reasoning_parser"] == "deepseek_r1"
    assert selected["tool_parser"] == "glm45"


def test_thinking_on_is_read_as_reasoning(serve, plugin_manager) -> None:
    fake = glm47(plugin_manager, ON)
    client = serve(fake)
    message = whole(client)["message"]
    assert fake.requests[-1]["prompt"].endswith("<|assistant|><think>")
    want = ("The tower is in Paris.\n", "In Paris, café 😀.")
    assert (message["reasoning_content"], message["content"]) == want
    assert streamed(client)[:2] == want


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_thinking_off_is_all_content(serve, plugin_manager, stream: bool) -> None:
    fake = glm47(plugin_manager, OFF)
    client = serve(fake)
    body = {"chat_template_kwargs": {"enable_thinking": False}}
    if stream:
        reasoning, content, _ = streamed(client, **body)
    else:
        message = whole(client, **body)["message"]
        reasoning, content = message["reasoning_content"], message["content"]
    assert fake.requests[-1]["prompt"].endswith("<|assistant|></think>")
    assert (reasoning, content) == (None, OFF)


def test_thinking_off_with_tool_calls(serve, plugin_manager) -> None:
    reply = (
        "I'll check.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
        "</tool_call>"
    )
    client = serve(glm47(plugin_manager, reply))
    body = {"tools": TOOLS, "chat_template_kwargs": {"enable_thinking": False}}
    choice = whole(client, **body)
    message = choice["message"]
    assert choice["finish_reason"] == "tool_calls"
    assert (message["reasoning_content"], message["content"]) == (None, "I'll check.")
    (call,) = message["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    reasoning, content, calls = streamed(client, **body)
    assert (reasoning, content) == (None, "I'll check.")
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"city": "Paris"}]


def test_official_client_with_thinking_on_and_off(serve, plugin_manager) -> None:
    oai = openai_client(serve(glm47(plugin_manager, OFF)))
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    reply = oai.chat.completions.create(model="fake-model", messages=MSG, extra_body=off)
    message = reply.choices[0].message
    assert (getattr(message, "reasoning_content", None), message.content) == (None, OFF)
    chunks = list(
        oai.chat.completions.create(model="fake-model", messages=MSG, stream=True, extra_body=off)
    )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == OFF
    assert not any(getattr(d, "reasoning_content", None) for d in deltas)
    on = openai_client(serve(glm47(plugin_manager, ON)))
    message = on.chat.completions.create(model="fake-model", messages=MSG).choices[0].message
    assert (message.reasoning_content, message.content) == (
        "The tower is in Paris.\n",
        "In Paris, café 😀.",
    )
