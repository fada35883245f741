"""Tool calling end to end through the app: the real tool-parser plugins (chosen from the real
Qwen2.5 chat template), every ``tool_choice``, validation, streaming deltas."""

from __future__ import annotations

import json
from typing import Any, Callable

import pytest
from server_fakes import FakeEngine
from server_helpers import TOOLS, chunks_of, openai_client

MSG = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}\n'
    "</tool_call>"
)


def scripted(text: str | Callable[[str], str]) -> FakeEngine:
    return FakeEngine(lambda prompt, params, i: text(prompt) if callable(text) else text)


def post(client: Any, **body: Any) -> dict[str, Any]:
    resp = client.post("/v1/chat/completions", json={"messages": MSG, **body})
    assert resp.status_code == 200, resp.text
    return resp.json()


def streamed(client: Any, **body: Any) -> tuple[str, list[dict[str, Any]], str]:
    """(content, calls, finish_reason) assembled from a stream, checking each delta's shape."""
    chunks = chunks_of(
        client.post("/v1/chat/completions", json={"messages": MSG, "stream": True, **body})
    )
    content, calls, finish = "", {}, None
    for chunk in chunks:
        (choice,) = chunk["choices"]
        delta = choice["delta"]
        content += delta.get("content") or ""
        for part in delta.get("tool_calls", []):
            if part["index"] not in calls:
                # the first delta of a call carries its id, type and name
                assert part["id"].startswith("call_") and part["type"] == "function"
                assert part["function"]["name"]
                calls[part["index"]] = {
                    "id": part["id"],
                    "name": part["function"]["name"],
                    "arguments": "",
                }
            else:
                assert "id" not in part and "name" not in part["function"]
            calls[part["index"]]["arguments"] += part["function"].get("arguments", "")
        finish = choice["finish_reason"] or finish
    assert "<tool_call>" not in content or not calls
    return content, [calls[i] for i in sorted(calls)], finish


def message_calls(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
        for c in body["choices"][0]["message"].get("tool_calls") or []
    ]


def test_auto_call_whole_and_streamed_agree(serve) -> None:
    client = serve(scripted("Let me check.\n" + CALL))
    body = post(client, tools=TOOLS)
    (choice,) = body["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"].strip() == "Let me check."
    calls = message_calls(body)
    assert calls == [{"name": "get_weather", "arguments": '{"city":"Paris","unit":"C"}'}]
    assert choice["message"]["tool_calls"][0]["type"] == "function"
    content, scalls, finish = streamed(client, tools=TOOLS)
    assert finish == "tool_calls" and content == choice["message"]["content"]
    assert [{"name": c["name"], "arguments": c["arguments"]} for c in scalls] == calls
    # the tools were rendered into the prompt by the template
    assert '"name": "get_weather"' in client.engine.requests[-1]["prompt"]


def test_several_calls_and_parallel_tool_calls_false(serve) -> None:
    add = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    client = serve(scripted(CALL + "\n" + add))
    assert [c["name"] for c in message_calls(post(client, tools=TOOLS))] == ["get_weather", "add"]
    _, calls, _ = streamed(client, tools=TOOLS)
    assert [c["name"] for c in calls] == ["get_weather", "add"]
    assert len({c["id"] for c in calls}) == 2
    assert [
        c["name"] for c in message_calls(post(client, tools=TOOLS, parallel_tool_calls=False))
    ] == ["get_weather"]
    _, calls, _ = streamed(client, tools=TOOLS, parallel_tool_calls=False)
    assert [c["name"] for c in calls] == ["get_weather"]


@pytest.mark.parametrize(
    "text",
    [
        # arguments that break the tool's JSON Schema (unit must be C or F)
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "K"}}\n'
        "</tool_call>",
        # a missing required argument
        '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>',
        # an unknown tool
        '<tool_call>\n{"name": "launch_rockets", "arguments": {}}\n</tool_call>',
        # malformed markup
        '<tool_call>\n{"name": "add", "arguments": {"a": 1, \n</tool_call>',
        # a call inside a code fence is an example, not a call
        "Like this:\n```\n" + CALL + "\n```",
    ],
    ids=["schema", "required", "unknown", "malformed", "fenced"],
)
def test_invalid_calls_are_returned_as_the_exact_text(serve, text) -> None:
    client = serve(scripted(text))
    body = post(client, tools=TOOLS)
    (choice,) = body["choices"]
    assert choice["finish_reason"] == "stop"
    assert "tool_calls" not in choice["message"]
    assert choice["message"]["content"] == text
    content, calls, finish = streamed(client, tools=TOOLS)
    written = text.split("\n")[1]
    if text.startswith("<tool_call>") and "launch_rockets" not in text:
        # a call to an offered tool streams its deltas as it is written, before the whole
        # call can be checked: the stream has the call the model wrote
        (call,) = calls
        assert content == "" and call["name"] == written.split('"')[3]
        if written.endswith("}}"):
            assert finish == "tool_calls"
            assert json.loads(call["arguments"]) == json.loads(written)["arguments"]
        else:  # malformed: the arguments never close, so the streamed call is cut short
            assert finish == "length" and call["arguments"] == '{"a":1,'
    else:
        assert (content, calls, finish) == (text, [], "stop")


def test_plain_answer_with_tools(serve) -> None:
    client = serve(scripted("It is sunny."))
    body = post(client, tools=TOOLS)
    assert body["choices"][0]["message"]["content"] == "It is sunny."
    assert body["choices"][0]["finish_reason"] == "stop"
    assert streamed(client, tools=TOOLS) == ("It is sunny.", [], "stop")


def _forced_script(prompt: str) -> str:
    # The model continues the steering prefix, then rambles on (the server must stop it).
    if prompt.endswith('"arguments": '):
        return '{"a": 20, "b": 22}}\n</tool_call>\nAnd now for something else entirely.'
    if prompt.endswith('{"name": "'):
        return 'get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\nMore text here.'
    return "no call"


def test_required(serve) -> None:
    client = serve(scripted(_forced_script))
    body = post(client, tools=TOOLS, tool_choice="required")
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    assert body["choices"][0]["message"]["content"] is None
    assert message_calls(body) == [{"name": "get_weather", "arguments": '{"city":"Oslo"}'}]
    request = client.engine.requests[-1]
    assert request["prompt"].endswith('<|im_start|>assistant\n<tool_call>\n{"name": "')
    # generation stopped once the call closed: the rambling was never generated
    assert request["request_id"] in client.engine.aborted
    closing = len('get_weather", "arguments": {"city": "Oslo"}')
    assert body["usage"]["completion_tokens"] == closing
    content, calls, finish = streamed(client, tools=TOOLS, tool_choice="required")
    assert (content, finish) == ("", "tool_calls")
    assert [(c["name"], c["arguments"]) for c in calls] == [("get_weather", '{"city":"Oslo"}')]


def test_named_function(serve) -> None:
    client = serve(scripted(_forced_script))
    choice = {"type": "function", "function": {"name": "add"}}
    body = post(client, tools=TOOLS, tool_choice=choice)
    assert message_calls(body) == [{"name": "add", "arguments": '{"a":20,"b":22}'}]
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    assert client.engine.requests[-1]["prompt"].endswith(
        '<tool_call>\n{"name": "add", "arguments": '
    )
    _, calls, finish = streamed(client, tools=TOOLS, tool_choice=choice)
    assert [(c["name"], c["arguments"]) for c in calls] == [("add", '{"a":20,"b":22}')]
    assert finish == "tool_calls"


def test_forced_call_that_does_not_form_is_content(serve) -> None:
    client = serve(scripted('get_weather", "arguments": {"city": 5}}'))  # schema: a string
    body = post(client, tools=TOOLS, tool_choice="required")
    assert "tool_calls" not in body["choices"][0]["message"]
    assert (
        body["choices"][0]["message"]["content"]
        == '<tool_call>\n{"name": "get_weather", "arguments": {"city": 5}}'
    )
    client = serve(scripted("I would rather not."))
    body = post(client, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "add"}})
    assert body["choices"][0]["message"]["content"].endswith("I would rather not.")
    content, calls, _ = streamed(client, tools=TOOLS, tool_choice="required")
    assert calls == [] and content.endswith("I would rather not.")


def test_tool_choice_none(serve) -> None:
    client = serve(scripted(CALL))
    body = post(client, tools=TOOLS, tool_choice="none")
    assert body["choices"][0]["message"]["content"] == CALL  # nothing is parsed
    assert "# Tools" not in client.engine.requests[-1]["prompt"]  # nor offered


def test_official_client_tool_calls(serve) -> None:
    oc = openai_client(serve(scripted(CALL)))
    resp = oc.chat.completions.create(model="fake-model", messages=MSG, tools=TOOLS)
    call = resp.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "unit": "C"}
    # and the answer goes back through the template as an assistant turn plus a tool turn
    follow = [
        *MSG,
        resp.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "18 C"},
    ]
    oc.chat.completions.create(model="fake-model", messages=follow, tools=TOOLS)


def test_explicit_and_missing_parsers(serve, plugin_manager) -> None:
    from tallow.plugin.manager import load_plugins
    from tallow.server.app import build_app
    from tallow.server.parsers import ToolParserError

    from server_helpers import make_config

    # --tool-parser json: a bare JSON object is the call
    client = serve(scripted('{"name": "add", "arguments": {"a": 1, "b": 1}}'), tool_parser="json")
    assert message_calls(post(client, tools=TOOLS)) == [
        {"name": "add", "arguments": '{"a":1,"b":1}'}
    ]
    with pytest.raises(ToolParserError, match="nonesuch"):
        build_app(FakeEngine(plugin_manager=plugin_manager), make_config(tool_parser="nonesuch"))
    # no tool parser at all: tools cannot be honoured, and the client is told so
    bare = load_plugins(None, entry_points=[])
    client = serve(FakeEngine(plugin_manager=bare))
    resp = client.post("/v1/chat/completions", json={"messages": MSG, "tools": TOOLS})
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "tool_parser_unavailable"
    assert (
        client.post(
            "/v1/chat/completions", json={"messages": MSG, "tools": TOOLS, "tool_choice": "none"}
        ).status_code
        == 200
    )


def test_fallback_parser_reads_a_call_without_markup(serve) -> None:
    # Small Qwen models often drop the <tool_call> tags; the plain-JSON fallback reads the call.
    bare = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    client = serve(scripted(bare))
    selected = client.get("/v1/plugins").json()["selected"]
    assert selected == {"tool_parser": "hermes", "fallbacks": ["json"]}
    body = post(client, tools=TOOLS)
    assert message_calls(body) == [{"name": "get_weather", "arguments": '{"city":"Paris"}'}]
    assert body["choices"][0]["message"]["content"] is None
    content, calls, finish = streamed(client, tools=TOOLS)
    assert (content, finish) == ("", "tool_calls")
    assert [(c["name"], c["arguments"]) for c in calls] == [("get_weather", '{"city":"Paris"}')]
    # JSON that is not a call stays content, exactly
    client = serve(scripted('{"answer": 42}'))
    assert post(client, tools=TOOLS)["choices"][0]["message"]["content"] == '{"answer": 42}'
    assert streamed(client, tools=TOOLS) == ('{"answer": 42}', [], "stop")


def test_plain_content_streams_before_the_end(serve) -> None:
    client = serve(scripted("It is sunny and warm today in Paris."))
    chunks = chunks_of(
        client.post("/v1/chat/completions", json={"messages": MSG, "tools": TOOLS, "stream": True})
    )
    pieces = [c["choices"][0]["delta"].get("content") for c in chunks]
    assert len([p for p in pieces if p]) > 10  # released token by token, not held to the end
