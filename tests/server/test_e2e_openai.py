"""The official ``openai`` SDK against a live ``tallow serve`` on the embedded default model
(Qwen2.5-Coder-0.5B-Instruct, GGUF, float32 on CPU), over a real socket.

The model is slow on a CPU, so requests are short and mostly greedy; the oracles are the
server's own invariants (a stream assembles to the whole answer of the same greedy request, a
stop string cuts the greedy text exactly where it occurs, logprobs agree with greedy choices,
a seed reproduces a sampled answer) plus the contract of every error status.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_helpers import DEFAULT_SERVER_KEY, ServeProcess, httpx

pytestmark = pytest.mark.slow

KEY = DEFAULT_SERVER_KEY
MODEL = "Qwen2.5-Coder-0.5B-Instruct"
HELLO = [{"role": "user", "content": "Say hello in one short sentence."}]
WEATHER = [{"role": "user", "content": "What is the weather like in Paris right now?"}]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


@pytest.fixture(scope="module")
def server(default_model_server: ServeProcess) -> ServeProcess:
    """The session's shared server (tests/server/conftest.py): key ``KEY``, 2,048-token
    context, a 256 KiB body limit."""
    return default_model_server


@pytest.fixture(scope="module")
def client(server: ServeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=300)


def _assemble_chat(stream: Any) -> tuple[str, list[dict[str, str]], str | None, Any]:
    content, calls, finish, usage = "", {}, None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for part in choice.delta.tool_calls or []:
                entry = calls.setdefault(part.index, {"name": "", "arguments": ""})
                if part.function and part.function.name:
                    entry["name"] = part.function.name
                if part.function and part.function.arguments:
                    entry["arguments"] += part.function.arguments
            finish = choice.finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish, usage


def test_models_lists_the_embedded_model(client) -> None:
    (card,) = client.models.list().data
    assert card.id == MODEL
    assert client.models.retrieve(MODEL).id == MODEL


def test_chat_whole_and_streamed_agree(client) -> None:
    whole = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=6, temperature=0)
    (choice,) = whole.choices
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert whole.id.startswith("chatcmpl-") and whole.system_fingerprint
    assert 0 < whole.usage.completion_tokens <= 6
    content, calls, finish, usage = _assemble_chat(
        client.chat.completions.create(
            model=MODEL,
            messages=HELLO,
            max_tokens=6,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert (content, calls, finish) == (choice.message.content, [], choice.finish_reason)
    assert usage.completion_tokens == whole.usage.completion_tokens
    assert usage.prompt_tokens == whole.usage.prompt_tokens
    # the second, identical prompt found its full blocks in the prefix cache
    assert usage.prompt_tokens_details.cached_tokens >= 16


def test_completions_whole_and_streamed_agree(client) -> None:
    prompt = "def fibonacci(n):\n"
    whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=5, temperature=0)
    text = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=5, temperature=0, stream=True
        )
        if c.choices
    )
    assert whole.choices[0].text and text == whole.choices[0].text
    echoed = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=2, temperature=0, echo=True, logprobs=2
    )
    lp = echoed.choices[0].logprobs
    assert (
        echoed.choices[0].text
        == prompt + whole.choices[0].text[: len(echoed.choices[0].text) - len(prompt)]
    )
    assert "".join(lp.tokens) == echoed.choices[0].text
    assert lp.token_logprobs[0] is None and all(v <= 0 for v in lp.token_logprobs[1:])
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)


def test_n_and_seed(client) -> None:
    two = client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=4, n=2, temperature=1.0, seed=7
    )
    assert [c.index for c in two.choices] == [0, 1]
    assert all(c.message.content for c in two.choices)
    assert two.usage.completion_tokens <= 8
    again = client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=4, n=2, temperature=1.0, seed=7
    )
    assert [c.message.content for c in again.choices] == [c.message.content for c in two.choices]


def test_stop_cuts_the_greedy_text(client) -> None:
    base = (
        client.completions.create(
            model=MODEL, prompt="The three primary colors are", max_tokens=8, temperature=0
        )
        .choices[0]
        .text
    )
    assert len(base) >= 6
    stop = base[len(base) // 2 : len(base) // 2 + 2]
    cut = client.completions.create(
        model=MODEL, prompt="The three primary colors are", max_tokens=8, temperature=0, stop=[stop]
    )
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == base[: base.index(stop)]


def test_chat_logprobs_follow_the_greedy_choice(client) -> None:
    resp = client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=4, temperature=0, logprobs=True, top_logprobs=3
    )
    content = resp.choices[0].logprobs.content
    assert "".join(t.token for t in content) == resp.choices[0].message.content
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        assert t.top_logprobs[0].token == t.token  # greedy took the most likely token
        values = [alt.logprob for alt in t.top_logprobs]
        assert values == sorted(values, reverse=True)
        assert bytes(t.bytes) == t.token.encode()


@pytest.mark.parametrize("choice", ["auto", "required", "named", "none"])
def test_tools_with_every_tool_choice(client, choice) -> None:
    tools = [WEATHER_TOOL, ADD_TOOL]
    tool_choice: Any = (
        {"type": "function", "function": {"name": "get_weather"}} if choice == "named" else choice
    )
    kwargs = dict(
        model=MODEL,
        messages=WEATHER,
        tools=tools,
        tool_choice=tool_choice,
        temperature=0,
        max_tokens=40 if choice != "none" else 5,
    )
    whole = client.chat.completions.create(**kwargs)
    content, calls, finish, _ = _assemble_chat(
        client.chat.completions.create(**kwargs, stream=True)
    )
    message = whole.choices[0].message
    whole_calls = [
        {"name": c.function.name, "arguments": c.function.arguments}
        for c in message.tool_calls or []
    ]
    assert calls == whole_calls and finish == whole.choices[0].finish_reason
    assert (content or None) == message.content
    if choice == "none":
        assert not whole_calls and message.content
        return
    assert whole.choices[0].finish_reason == "tool_calls"
    (call,) = whole_calls
    assert call["name"] == "get_weather"
    args = json.loads(call["arguments"])
    assert isinstance(args["city"], str) and "paris" in args["city"].lower()
    assert "<tool_call>" not in (message.content or "")
    # the answer goes back through the chat template, and the model answers in text
    follow = [
        *WEATHER,
        message.model_dump(exclude_none=True),
        {
            "role": "tool",
            "tool_call_id": message.tool_calls[0].id,
            "content": json.dumps({"city": "Paris", "temperature_c": 18}),
        },
    ]
    reply = client.chat.completions.create(
        model=MODEL, messages=follow, tools=tools, tool_choice="none", max_tokens=3, temperature=0
    )
    assert reply.choices[0].message.content


def test_error_statuses(server, client) -> None:
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    assert httpx.post(server.url + "/v1/completions", json={"prompt": "x"}).status_code == 401
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="gpt-99", messages=HELLO)
    assert missing.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=HELLO, temperature=5)
    assert info.value.param == "temperature"
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=[{"role": "robot", "content": "x"}])
    assert info.value.param == "messages[0].role"
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=MODEL, messages=HELLO, response_format={"type": "yaml"}
        )
    assert info.value.param == "response_format.type"
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt="hello " * 2100, max_tokens=1)
    assert info.value.code == "context_length_exceeded"
    auth = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    resp = httpx.post(server.url + "/v1/chat/completions", content=b'{"messages": [', headers=auth)
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_json"
    resp = httpx.post(
        server.url + "/v1/chat/completions",
        headers=auth,
        json={"messages": [{"role": "user", "content": "x" * 300_000}]},
    )
    assert resp.status_code == 413 and resp.json()["error"]["code"] == "request_too_large"


async def _leave_mid_stream(url: str, i: int) -> int:
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {
        "model": MODEL,
        "stream": True,
        "max_tokens": 200,
        "messages": [{"role": "user", "content": f"Count from {i} to 500."}],
    }
    async with httpx.AsyncClient(base_url=url, timeout=300, headers=headers) as http:
        async with http.stream("POST", "/v1/chat/completions", json=body) as resp:
            assert resp.status_code == 200
            seen = 0
            async for line in resp.aiter_lines():
                seen += line.startswith("data: ")
                if seen == 2:
                    return seen
    return seen


def test_disconnect_burst_frees_every_kv_block(server) -> None:
    async def burst() -> list[int]:
        return await asyncio.gather(*(_leave_mid_stream(server.url, i) for i in range(4)))

    assert asyncio.run(burst()) == [2] * 4
    import time

    deadline = time.monotonic() + 30
    while True:
        health = httpx.get(server.url + "/health").json()
        if health["num_running"] == 0 and health["num_waiting"] == 0:
            break
        assert time.monotonic() < deadline, health
        time.sleep(0.2)
    assert health["num_free_blocks"] == health["num_total_blocks"]
    assert health["kv_usage"] == 0 and health["server_inflight"] == 0


def _samples(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for s in family.samples:
            key = s.name + (json.dumps(s.labels, sort_keys=True) if s.labels else "")
            out[key] = s.value
    return out


def test_metrics_parse_and_move(server, client) -> None:
    before = _samples(server.url)
    assert before["tallow_kv_cache_total_blocks"] > 0
    health = httpx.get(server.url + "/health").json()
    assert (
        before["tallow_kv_cache_capacity_tokens"]
        == health["kv_capacity_tokens"]
        == before["tallow_kv_cache_total_blocks"] * 16
    )  # the default block size
    client.completions.create(model=MODEL, prompt="1, 2, 3,", max_tokens=2, temperature=0)
    after = _samples(server.url)
    ok = (
        'tallow_http_requests_total{"endpoint": "/v1/completions", "method": "POST", '
        '"status": "200"}'
    )
    assert after[ok] == before.get(ok, 0.0) + 1  # absent before when no test above posted
    assert after["tallow_generation_tokens_total"] >= before["tallow_generation_tokens_total"] + 2
    assert after["tallow_prompt_tokens_total"] > before["tallow_prompt_tokens_total"]
    for name in (
        "tallow_time_to_first_token_seconds_count",
        "tallow_e2e_request_latency_seconds_count",
    ):
        key = name + json.dumps({"model_name": MODEL})
        assert after[key] == before.get(key, 0.0) + 1
    unauthorized = (
        'tallow_http_requests_total{"endpoint": "/v1/completions", '
        '"method": "POST", "status": "401"}'
    )
    httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": "x"})  # no key
    assert _samples(server.url).get(unauthorized, 0) == after.get(unauthorized, 0) + 1
