"""The server-side tool loop, with a scripted model (the fake engine over the real Qwen2.5 chat
template and the real hermes parser) and a tool provider written against the public contract.

The script decides what the model writes from the prompt it is given, so each round sees the
tool results of the rounds before it exactly as the chat template rendered them.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any, Callable, Iterator

import pytest
from server_fakes import FakeEngine
from server_helpers import TOOLS, LiveServer, chunks_of, httpx, make_config, openai_client

from tallow.plugin import ToolProvider, ToolResult
from tallow.server.tool_loop import ANSWER_NOW, EXTENSION_FIELD
from tallow.server.tool_providers import ToolProviders

MSG = [{"role": "user", "content": "What time is it in Paris?"}]


def call(name: str, **arguments: Any) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'


def responses(prompt: str) -> list[str]:
    """The tool results the prompt shows the model, in order."""
    return re.findall(r"<tool_response>\n(.*?)\n</tool_response>", prompt, re.S)


class Clock(ToolProvider):
    """A provider of a few tools with visible side effects."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.cancelled: list[str] = []
        self.started = self.stopped = False
        self.changed: list[Callable[[], None]] = []
        self.extra: list[dict[str, Any]] = []

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.stopped = True

    def on_tools_changed(self, callback: Callable[[], None]) -> None:
        self.changed.append(callback)

    async def list_tools(self) -> list[dict[str, Any]]:
        def tool(name: str, props: dict[str, Any]) -> dict[str, Any]:
            return {
                "type": "function",
                "function": {
                    "name": name,
                    "description": f"the {name} tool",
                    "parameters": {"type": "object", "properties": props},
                },
            }

        return [
            tool("get_time", {"zone": {"type": "string"}}),
            tool("slow", {"seconds": {"type": "number"}}),
            tool("boom", {}),
            tool("get_weather", {"city": {"type": "string"}}),
            *self.extra,
        ]

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        self.calls.append((name, arguments))
        if name == "get_time":
            return ToolResult(f"12:{len(arguments['zone']):02d} in {arguments['zone']}")
        if name == "slow":
            try:
                await asyncio.sleep(arguments["seconds"])
            except asyncio.CancelledError:
                self.cancelled.append(name)
                raise
            return ToolResult("done sleeping")
        if name == "boom":
            raise RuntimeError("the clock broke")
        return ToolResult(f"provider weather for {arguments}")

    def status(self) -> dict[str, Any]:
        return {"sources": [{"name": "clock", "state": "up", "tools": 4}]}


@pytest.fixture
def app(plugin_manager: Any) -> Iterator[Callable[..., Any]]:
    """``app(script, **server) -> (TestClient, engine, provider)`` with a :class:`Clock`."""
    from starlette.testclient import TestClient

    from tallow.server.app import build_app

    clients: list[Any] = []

    def make(script: Callable[[str], str], *, step_delay: float = 0.0, **server: Any) -> Any:
        engine = FakeEngine(
            lambda prompt, params, i: script(prompt),
            step_delay=step_delay,
            plugin_manager=plugin_manager,
        )
        provider = Clock()
        client = TestClient(
            build_app(
                engine, make_config(**server), tool_providers=ToolProviders.of({"clock": provider})
            ),
            raise_server_exceptions=False,
        )
        client.__enter__()
        clients.append(client)
        assert provider.started
        return client, engine, provider

    yield make
    for client in clients:
        client.__exit__(None, None, None)


def one_call_then_answer(prompt: str) -> str:
    seen = responses(prompt)
    if not seen:
        return "Let me check. " + call("get_time", zone="Europe/Paris")
    return f"It is {seen[0].split(' in ')[0]}."


def whole(client: Any, **body: Any) -> dict[str, Any]:
    resp = client.post("/v1/chat/completions", json={"messages": MSG, **body})
    assert resp.status_code == 200, resp.text
    return resp.json()


def assembled(client: Any, **body: Any) -> dict[str, Any]:
    """A stream put back together in the shape of a whole response's choice and usage."""
    chunks = chunks_of(
        client.post(
            "/v1/chat/completions",
            json={
                "messages": MSG,
                "stream": True,
                "stream_options": {"include_usage": True},
                **body,
            },
        )
    )
    content, entries, calls, finish = "", [], {}, None
    for chunk in chunks[:-1]:
        (choice,) = chunk["choices"]
        delta = choice["delta"]
        content += delta.get("content") or ""
        for part in delta.get(EXTENSION_FIELD, []):
            if part["index"] == len(entries):  # a call starts: reported before its result
                assert "result" not in part
                entries.append(dict(part))
            else:
                assert set(part) == {"index", "id", "result"}
                assert entries[part["index"]]["id"] == part["id"]
                entries[part["index"]]["result"] = part["result"]
        for part in delta.get("tool_calls", []):
            calls[part["index"]] = {
                "id": part["id"],
                "type": "function",
                "function": part["function"],
            }
        finish = choice["finish_reason"] or finish
    assert chunks[-1]["choices"] == []
    return {
        "message": {
            "content": content or None if calls else content,
            "tool_calls": [calls[i] for i in sorted(calls)] or None,
            EXTENSION_FIELD: entries,
        },
        "finish_reason": finish,
        "usage": chunks[-1]["usage"],
    }


def _without_ids(value: Any) -> Any:
    """``value`` with every call id replaced (ids are fresh in each response)."""
    if isinstance(value, dict):
        return {k: "<id>" if k == "id" else _without_ids(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_ids(v) for v in value]
    return value


def same_as_stream(client: Any, **body: Any) -> dict[str, Any]:
    """The whole response of ``body``, checked equal to its assembled stream."""
    response = whole(client, **body)
    (choice,) = response["choices"]
    streamed = assembled(client, **body)
    message = choice["message"]
    assert _without_ids(streamed["message"]) == _without_ids(
        {
            "content": message["content"],
            "tool_calls": message.get("tool_calls"),
            EXTENSION_FIELD: message[EXTENSION_FIELD],
        }
    )
    assert streamed["finish_reason"] == choice["finish_reason"]
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert streamed["usage"][key] == response["usage"][key]
    return response


def test_one_round(app) -> None:
    from tallow.server.responses import ChatCompletionResponse

    client, engine, clock = app(one_call_then_answer)
    response = same_as_stream(client, server_tools=True)
    # the body is the one the OpenAPI document describes, extension field included
    parsed = ChatCompletionResponse.model_validate(response)
    assert parsed.choices[0].message.server_tool_calls[0].result.content == "12:12 in Europe/Paris"
    (choice,) = response["choices"]
    assert choice["finish_reason"] == "stop"
    message = choice["message"]
    # content streams round after round: the text before the call, then the answer
    # (the parser drops the whitespace before a call)
    assert message["content"] == "Let me check.It is 12:12."
    (entry,) = message[EXTENSION_FIELD]
    assert entry["function"] == {"name": "get_time", "arguments": '{"zone":"Europe/Paris"}'}
    assert entry["provider"] == "clock" and entry["round"] == 1
    assert entry["id"].startswith("call_") and entry["index"] == 0
    assert entry["result"] == {"content": "12:12 in Europe/Paris", "is_error": False}
    assert clock.calls[0] == ("get_time", {"zone": "Europe/Paris"})
    # the second round's prompt has the call and its result in the model's own template
    first, second = engine.requests[:2]
    assert second["prompt"].startswith(first["prompt"])
    assert (
        '<|im_start|>assistant\nLet me check.\n<tool_call>\n{"name": "get_time", '
        '"arguments": {"zone": "Europe/Paris"}}\n</tool_call><|im_end|>\n<|im_start|>user\n'
        "<tool_response>\n12:12 in Europe/Paris\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    ) in second["prompt"]
    assert '"name": "get_time"' in first["prompt"]  # the provided tools were rendered
    usage = response["usage"]
    assert usage["prompt_tokens"] == sum(len(r["prompt_token_ids"]) for r in engine.requests[:2])
    assert usage["completion_tokens"] > len("It is 12:12.")  # both rounds count
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert engine.num_free_blocks == engine.num_total_blocks


def test_several_rounds_and_the_official_client(app) -> None:
    def three_calls(prompt: str) -> str:
        seen = responses(prompt)
        if len(seen) < 3:
            return call("get_time", zone="Z" * (len(seen) + 1))
        return "Times: " + "; ".join(seen)

    client, engine, clock = app(three_calls)
    reply = openai_client(client).chat.completions.create(
        model="fake-model", messages=MSG, extra_body={"server_tools": True}
    )
    message = reply.choices[0].message
    assert message.content == "Times: 12:01 in Z; 12:02 in ZZ; 12:03 in ZZZ"
    entries = getattr(message, EXTENSION_FIELD)
    assert [e["round"] for e in entries] == [1, 2, 3]
    assert [e["result"]["content"] for e in entries] == [
        "12:01 in Z",
        "12:02 in ZZ",
        "12:03 in ZZZ",
    ]
    assert len(engine.requests) == 4
    same_as_stream(client, server_tools=True)


def _answer_without_tools(then: Callable[[str], str]) -> Callable[[str], str]:
    """A model that calls ``then(prompt)`` while tools are offered (the Qwen template renders
    them in a ``<tools>`` block) and answers from the last result once they are withdrawn."""

    def script(prompt: str) -> str:
        if "<tools>" not in prompt:
            return "The answer: " + responses(prompt)[-1].split("\n")[0]
        return then(prompt)

    return script


def test_a_repeated_call_is_not_run_again_and_the_model_must_answer(app) -> None:
    """A small model repeats its call forever: the repeat is answered from the first result,
    and the next round is generated without tools, so the request ends in prose."""
    client, engine, clock = app(_answer_without_tools(lambda prompt: call("get_time", zone="UTC")))
    response = same_as_stream(client, server_tools=True)
    (choice,) = response["choices"]
    assert choice["finish_reason"] == "stop"
    first, again = choice["message"][EXTENSION_FIELD]
    assert [first["round"], again["round"]] == [1, 2]
    assert again["result"] == {**first["result"], "repeated": True}
    assert choice["message"]["content"] == "The answer: " + first["result"]["content"]
    assert len(clock.calls) == 2  # once in each of the two requests
    assert len(engine.requests) == 6  # three rounds each: call, repeat, answer
    last = engine.requests[2]["prompt"]
    assert "<tools>" not in last and "already made" in last
    assert last.rstrip().endswith(
        "<|im_start|>user\n" + ANSWER_NOW + "<|im_end|>\n<|im_start|>assistant"
    )


def test_after_max_tool_rounds_the_last_round_has_no_tools(app) -> None:
    client, engine, clock = app(
        _answer_without_tools(
            lambda prompt: call("get_time", zone="Z" * (len(responses(prompt)) + 1))
        ),
        max_tool_rounds=2,
    )
    response = same_as_stream(client, server_tools=True)
    (choice,) = response["choices"]
    assert choice["finish_reason"] == "stop"
    entries = choice["message"][EXTENSION_FIELD]
    assert [e["round"] for e in entries] == [1, 2]
    assert not any(e["result"]["is_error"] or e["result"].get("repeated") for e in entries)
    assert choice["message"]["content"] == "The answer: " + entries[1]["result"]["content"]
    assert len(clock.calls) == 4 and len(engine.requests) == 6


def test_identical_calls_in_one_round_run_once(app) -> None:
    twice = call("get_time", zone="UTC") + "\n" + call("get_time", zone="UTC")
    client, engine, clock = app(_answer_without_tools(lambda prompt: twice))
    response = same_as_stream(client, server_tools=True)
    entries = response["choices"][0]["message"][EXTENSION_FIELD]
    assert [e.get("result", {}).get("repeated", False) for e in entries] == [False, True]
    assert len(clock.calls) == 2  # once per request


def test_mixed_client_and_server_tools(app) -> None:
    def both(prompt: str) -> str:
        return call("get_time", zone="Asia/Tokyo") + "\n" + call("add", a=1, b=2)

    client, engine, clock = app(both)
    response = same_as_stream(client, server_tools=True, tools=TOOLS)
    (choice,) = response["choices"]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    (theirs,) = message["tool_calls"]
    assert theirs["function"] == {"name": "add", "arguments": '{"a":1,"b":2}'}
    (mine,) = message[EXTENSION_FIELD]
    assert mine["function"]["name"] == "get_time" and not mine["result"]["is_error"]
    assert len(engine.requests) == 2  # one round per request: client calls end the loop
    # a client's tool shadows the provider's tool of the same name
    client2, engine2, clock2 = app(lambda p: call("get_weather", city="Paris"))
    response = whole(client2, server_tools=True, tools=TOOLS)
    (choice,) = response["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"][EXTENSION_FIELD] == [] and not clock2.calls


def test_failures_are_results_the_model_sees(app) -> None:
    def breaks(prompt: str) -> str:
        seen = responses(prompt)
        if not seen:
            return call("boom")
        return f"The tool said: {seen[0]}"

    client, engine, clock = app(breaks)
    response = same_as_stream(client, server_tools=True)
    (choice,) = response["choices"]
    (entry,) = choice["message"][EXTENSION_FIELD]
    assert entry["result"] == {
        "content": "the tool failed: RuntimeError: the clock broke",
        "is_error": True,
    }
    assert (
        choice["message"]["content"]
        == "The tool said: Error: the tool failed: RuntimeError: the clock broke"
    )


def test_when_the_loop_runs(app) -> None:
    client, engine, clock = app(one_call_then_answer)
    # off by default: the provided tools are not offered and nothing is run
    plain = whole(client)
    assert EXTENSION_FIELD not in plain["choices"][0]["message"]
    assert '"get_time"' not in engine.requests[-1]["prompt"] and not clock.calls
    # explicit requests that cannot loop are refused, naming the field
    for body, param in [
        ({"n": 2}, "n"),
        ({"logprobs": True}, "logprobs"),
        ({"tool_choice": "required", "tools": TOOLS}, "tool_choice"),
    ]:
        resp = client.post(
            "/v1/chat/completions", json={"messages": MSG, "server_tools": True, **body}
        )
        assert resp.status_code == 400 and resp.json()["error"]["param"] == param
    resp = client.post("/v1/chat/completions", json={"messages": MSG, "server_tools": "yes"})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "server_tools"

    always, engine2, clock2 = app(one_call_then_answer, server_tools="always")
    assert whole(always)["choices"][0]["message"][EXTENSION_FIELD]
    assert EXTENSION_FIELD not in whole(always, server_tools=False)["choices"][0]["message"]
    # the server default leaves out a request it cannot serve instead of refusing it
    assert len(whole(always, n=2)["choices"]) == 2


def test_a_server_without_providers(serve) -> None:
    client = serve()
    resp = client.post("/v1/chat/completions", json={"messages": MSG, "server_tools": True})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "server_tools"
    body = client.get("/v1/tools").json()
    assert body["providers"] == [] and body["server_tools"] == "off"


def test_tools_endpoint_and_plugin_status(app) -> None:
    from tallow.server.responses import ToolsResponse

    client, engine, clock = app(one_call_then_answer, api_keys=["k"])
    assert client.get("/v1/tools").status_code == 401
    auth = {"Authorization": "Bearer k"}
    body = client.get("/v1/tools", headers=auth).json()
    ToolsResponse.model_validate(body)
    assert body["max_tool_rounds"] == 8
    document = client.get("/openapi.json").json()
    assert "/v1/tools" in document["paths"]
    (provider,) = body["providers"]
    assert provider["name"] == "clock" and provider["running"]
    assert provider["status"]["sources"][0]["state"] == "up"
    names = [t["function"]["name"] for t in provider["tools"]]
    assert names == ["get_time", "slow", "boom", "get_weather"]
    (status,) = client.get("/v1/plugins", headers=auth).json()["tool_providers"]
    assert status["name"] == "clock" and "tools" not in status
    # a change notification rebuilds the catalog; an invalid tool is left out
    clock.extra = [
        {"type": "function", "function": {"name": "later"}},
        {"type": "function", "function": {"name": "bad name!"}},
    ]
    names = [
        t["function"]["name"]
        for t in client.get("/v1/tools", headers=auth).json()["providers"][0]["tools"]
    ]
    assert "later" not in names  # not announced yet
    for callback in clock.changed:
        callback()
    names = [
        t["function"]["name"]
        for t in client.get("/v1/tools", headers=auth).json()["providers"][0]["tools"]
    ]
    assert names[-1] == "later" and "bad name!" not in names


def test_providers_clash_and_fail_in_isolation() -> None:
    first, second = Clock(), Clock()

    class Broken(Clock):
        async def list_tools(self) -> list[dict[str, Any]]:
            raise OSError("unreachable")

    providers = ToolProviders.of({"a": first, "b": second, "c": Broken()})

    async def run() -> Any:
        await providers.start()
        tools = await providers.tools()
        result = await providers.call(tools["b__get_time"], {"zone": "UTC"})
        await providers.stop()
        return tools, result

    tools, result = asyncio.run(run())
    assert sorted(tools) == sorted(
        [
            "get_time",
            "slow",
            "boom",
            "get_weather",
            "b__get_time",
            "b__slow",
            "b__boom",
            "b__get_weather",
        ]
    )
    assert tools["b__get_time"].original == "get_time" and tools["get_time"].provider == "a"
    assert result == ToolResult("12:03 in UTC") and second.calls and not first.calls
    assert first.stopped and second.stopped


# ---------------------------------------------------------------------------------------------
# Disconnects, on a real socket
# ---------------------------------------------------------------------------------------------
def _wait(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


async def _leave_after(url: str, body: dict[str, Any], marker: str) -> None:
    """Stream ``body`` and drop the connection once a chunk contains ``marker``."""
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
            assert resp.status_code == 200
            async for line in resp.aiter_lines():
                if marker in line:
                    return


@pytest.fixture
def live_loop(plugin_manager: Any) -> Iterator[Callable[..., Any]]:
    from tallow.server.app import build_app

    servers: list[LiveServer] = []

    def make(script: Callable[[str], str]) -> Any:
        engine = FakeEngine(
            lambda prompt, params, i: script(prompt), step_delay=0.01, plugin_manager=plugin_manager
        )
        clock = Clock()
        srv = LiveServer(
            build_app(
                engine,
                make_config(server_tools="always"),
                tool_providers=ToolProviders.of({"clock": clock}),
            )
        )
        servers.append(srv.__enter__())
        return srv, engine, clock

    yield make
    for srv in servers:
        srv.__exit__(None, None, None)


def test_disconnect_during_a_call_cancels_it(live_loop) -> None:
    srv, engine, clock = live_loop(lambda prompt: call("slow", seconds=30))
    body = {"messages": MSG, "stream": True}
    asyncio.run(_leave_after(srv.url, body, EXTENSION_FIELD))
    _wait(lambda: clock.cancelled == ["slow"])
    assert engine.num_free_blocks == engine.num_total_blocks and not engine.active
    assert httpx.get(srv.url + "/health").json()["server_inflight"] == 0


def test_disconnect_in_a_later_round_frees_its_blocks(live_loop) -> None:
    def then_long(prompt: str) -> str:
        return "tick " * 300 if responses(prompt) else call("get_time", zone="UTC")

    srv, engine, clock = live_loop(then_long)
    # (the fake model writes a byte per token: "k" ends the first "tick")
    asyncio.run(_leave_after(srv.url, {"messages": MSG, "stream": True}, '"content": "k"'))
    _wait(lambda: not engine.active)
    assert len(engine.requests) == 2 and len(engine.aborted) == 1
    assert engine.num_free_blocks == engine.num_total_blocks
    # a whole response whose client leaves mid-loop is aborted the same way
    try:
        httpx.post(srv.url + "/v1/chat/completions", json={"messages": MSG}, timeout=0.5)
    except httpx.TimeoutException:
        pass
    _wait(lambda: len(engine.aborted) == 2)
    assert engine.num_free_blocks == engine.num_total_blocks
