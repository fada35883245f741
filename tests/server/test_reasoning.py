"""Reasoning output of chat completions: a scripted model writing ``<think>`` blocks, served
with the ``think`` / ``deepseek_r1`` reasoning parsers (tallow-reasoning-think). The fake engine
streams one byte per token, so every tag reaches the server split across deltas."""

from __future__ import annotations

import json
from typing import Any

import pytest
from server_fakes import FakeEngine
from server_helpers import TOOLS, chunks_of, openai_client

MSG = [{"role": "user", "content": "Where is the Eiffel tower?"}]
THOUGHT = "The user asks <b>where</b>; 1 < 2.\n"
ANSWER = "\n\nIn Paris, café 😀."


def engine(plugin_manager: Any, text: str) -> FakeEngine:
    return FakeEngine(lambda prompt, params, i: text, plugin_manager=plugin_manager)


def whole(client: Any, **body: Any) -> dict[str, Any]:
    resp = client.post("/v1/chat/completions", json={"messages": MSG, **body})
    assert resp.status_code == 200, resp.text
    (choice,) = resp.json()["choices"]
    return choice


def streamed(client: Any, **body: Any) -> tuple[str | None, str, list[dict[str, Any]]]:
    """Reasoning (None if no delta carried it), content and tool calls of a stream."""
    chunks = chunks_of(
        client.post("/v1/chat/completions", json={"messages": MSG, "stream": True, **body})
    )
    reasoning: str | None = None
    content, calls = "", []
    for chunk in chunks:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            if "reasoning_content" in delta:
                assert "content" not in delta  # reasoning and content come in separate deltas
                reasoning = (reasoning or "") + delta["reasoning_content"]
            content += delta.get("content") or ""
            for part in delta.get("tool_calls", []):  # a call's arguments come in pieces
                if part["index"] == len(calls):
                    calls.append({**part, "function": {**part["function"], "arguments": ""}})
                calls[part["index"]]["function"]["arguments"] += part["function"].get(
                    "arguments", ""
                )
    return reasoning, content, calls


def test_whole_and_streamed_reasoning(serve, plugin_manager) -> None:
    client = serve(
        engine(plugin_manager, f"<think>{THOUGHT}</think>{ANSWER}"), reasoning_parser="think"
    )
    message = whole(client)["message"]
    assert message["reasoning_content"] == THOUGHT
    assert message["content"] == ANSWER
    assert streamed(client)[:2] == (THOUGHT, ANSWER)


def test_template_opened_think_block(serve, plugin_manager) -> None:
    client = serve(
        engine(plugin_manager, f"{THOUGHT}</think>{ANSWER}"), reasoning_parser="deepseek_r1"
    )
    message = whole(client)["message"]
    assert (message["reasoning_content"], message["content"]) == (THOUGHT, ANSWER)
    assert streamed(client)[:2] == (THOUGHT, ANSWER)


def test_unterminated_reasoning_and_no_reasoning(serve, plugin_manager) -> None:
    client = serve(engine(plugin_manager, f"<think>{THOUGHT}"), reasoning_parser="think")
    message = whole(client)["message"]
    assert (message["reasoning_content"], message["content"]) == (THOUGHT, "")
    assert streamed(client)[:2] == (THOUGHT, "")
    plain = serve(engine(plugin_manager, ANSWER), reasoning_parser="think")
    message = whole(plain)["message"]
    assert message["reasoning_content"] is None and message["content"] == ANSWER
    assert streamed(plain)[:2] == (None, ANSWER)


def test_include_reasoning_false_drops_it(serve, plugin_manager) -> None:
    client = serve(
        engine(plugin_manager, f"<think>{THOUGHT}</think>{ANSWER}"), reasoning_parser="think"
    )
    message = whole(client, include_reasoning=False)["message"]
    assert "reasoning_content" not in message and message["content"] == ANSWER
    assert streamed(client, include_reasoning=False)[:2] == (None, ANSWER)


def test_without_a_reasoning_parser_nothing_changes(serve, plugin_manager) -> None:
    text = f"<think>{THOUGHT}</think>{ANSWER}"
    client = serve(engine(plugin_manager, text))
    message = whole(client)["message"]
    assert "reasoning_content" not in message and message["content"] == text
    assert streamed(client)[:2] == (None, text)


def test_tool_calls_come_from_the_content_only(serve, plugin_manager) -> None:
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    decoy = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    thought = f"Maybe {decoy}? No: Paris.\n"
    client = serve(
        engine(plugin_manager, f"<think>{thought}</think>\n{call}"), reasoning_parser="think"
    )
    choice = whole(client, tools=TOOLS)
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["reasoning_content"] == thought
    (got,) = choice["message"]["tool_calls"]
    assert (got["function"]["name"], json.loads(got["function"]["arguments"])) == (
        "get_weather",
        {"city": "Paris"},
    )
    reasoning, content, calls = streamed(client, tools=TOOLS)
    assert reasoning == thought
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"city": "Paris"}]


def test_official_client_reads_reasoning_content(serve, plugin_manager) -> None:
    client = serve(
        engine(plugin_manager, f"<think>{THOUGHT}</think>{ANSWER}"), reasoning_parser="think"
    )
    oai = openai_client(client)
    reply = oai.chat.completions.create(model="fake-model", messages=MSG)
    message = reply.choices[0].message
    assert (message.reasoning_content, message.content) == (THOUGHT, ANSWER)
    thought = "".join(
        getattr(c.choices[0].delta, "reasoning_content", None) or ""
        for c in oai.chat.completions.create(model="fake-model", messages=MSG, stream=True)
        if c.choices
    )
    assert thought == THOUGHT


def test_enable_thinking_reaches_the_template(serve, plugin_manager) -> None:
    fake = engine(plugin_manager, ANSWER)
    fake.tokenizer.tokenizer_config["chat_template"] = (
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"
        "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
        "{% endif %}{% if reasoning_effort is defined %}[effort={{ reasoning_effort }}]"
        "{% endif %}"
    )
    client = serve(fake, reasoning_parser="think")
    whole(client, chat_template_kwargs={"enable_thinking": False}, reasoning_effort="low")
    prompt = fake.requests[-1]["prompt"]
    assert prompt.endswith("<think>\n\n</think>\n\n[effort=low]")


def test_reasoning_effort_refused_when_the_template_ignores_it(serve, plugin_manager) -> None:
    client = serve(engine(plugin_manager, ANSWER), reasoning_parser="think")
    resp = client.post("/v1/chat/completions", json={"messages": MSG, "reasoning_effort": "low"})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "reasoning_effort"


def test_unknown_reasoning_parser_fails_at_start_up(plugin_manager) -> None:
    from server_helpers import make_config

    from tallow.server.app import build_app
    from tallow.server.reasoning import ReasoningParserError

    with pytest.raises(ReasoningParserError) as err:
        build_app(engine(plugin_manager, ANSWER), make_config(reasoning_parser="nope"))
    assert "nope" in str(err.value) and "think" in str(err.value)
    assert "deepseek_r1" in str(err.value)


def test_reasoning_parser_chosen_from_the_template(serve, plugin_manager) -> None:
    fake = engine(plugin_manager, f"<think>{THOUGHT}</think>{ANSWER}")
    fake.tokenizer.tokenizer_config["chat_template"] = (
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"
        "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
        "{% endif %}"
    )
    client = serve(fake)
    assert client.get("/v1/plugins").json()["selected"]["reasoning_parser"] == "think"
    message = whole(client)["message"]
    assert (message["reasoning_content"], message["content"]) == (THOUGHT, ANSWER)
    off = serve(fake, reasoning_parser="none")
    assert whole(off)["message"]["content"] == f"<think>{THOUGHT}</think>{ANSWER}"
