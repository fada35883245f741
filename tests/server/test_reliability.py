"""Regressions of defects found by probing the server as an attacker and a flaky client would:
remote ``$ref`` fetches, lone surrogates, deep nesting, unbounded fan-out, a client closing
mid-body, malformed HTTP, cancelled requests missing from the metrics, a request abandoned
before the engine thread took it, and the OpenAPI document."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from typing import Any, Iterator

import pytest
from server_fakes import FakeEngine
from server_helpers import httpx

from tallow.plugin import ToolCall, validate_tool_call

MSG = [{"role": "user", "content": "hi"}]


class Listener:
    """A TCP socket that accepts connections and never answers: a remote ``$ref`` fetched
    from it would hang, and every connection is counted."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/schema.json"
        self.accepted: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.accepted:
            conn.close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    srv = Listener()
    yield srv
    srv.close()


def _tool(parameters: Any, description: str = "f") -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {"name": "f", "description": description, "parameters": parameters},
        }
    ]


def _errors_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


# -- 1. remote $ref: refused, never fetched, never blocking -----------------------------------
@pytest.mark.parametrize("where", ["root", "nested", "dynamic"])
def test_remote_ref_in_a_tool_schema_is_400_and_never_fetched(serve, listener, where) -> None:
    ref = {"$ref": listener.url}
    schema = {
        "root": ref,
        "nested": {"type": "object", "properties": {"a": {"items": ref}}},
        "dynamic": {"$dynamicRef": listener.url},
    }[where]
    client = serve()
    started = time.monotonic()
    resp = client.post("/v1/chat/completions", json={"messages": MSG, "tools": _tool(schema)})
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["param"] == "tools[0].function.parameters"
    assert "only local references" in err["message"]
    assert time.monotonic() - started < 5
    assert listener.accepted == []


def test_a_ref_made_remote_by_an_id_is_not_fetched(listener) -> None:
    # "$id" moves the base URI, so the local-looking "#/$defs/x" resolves to the listener.
    tools = _tool(
        {"$id": listener.url, "type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}
    )
    started = time.monotonic()
    [reason] = validate_tool_call(ToolCall("f", '{"a": 1}'), tools)
    assert "cannot be applied" in reason
    assert time.monotonic() - started < 5
    time.sleep(0.2)
    assert listener.accepted == []


def test_a_catastrophic_pattern_cannot_stall_validation() -> None:
    tools = _tool(
        {
            "type": "object",
            "properties": {"a": {"type": "string", "pattern": "^(a|aa)+$"}},
            "patternProperties": {"^(b|bb)+$": {"type": "string"}},
            "additionalProperties": False,
        }
    )
    args = json.dumps({"a": "a" * 40 + "!", "b" * 40 + "!": "x"})
    started = time.monotonic()
    reasons = validate_tool_call(ToolCall("f", args), tools)
    assert time.monotonic() - started < 2
    assert any("within" in r for r in reasons), reasons
    # a pattern that matches quickly still works
    ok = _tool({"type": "object", "properties": {"a": {"pattern": "^a+$"}}})
    assert validate_tool_call(ToolCall("f", '{"a": "aaa"}'), ok) == []
    assert validate_tool_call(ToolCall("f", '{"a": "aab"}'), ok) != []


# -- 3. lone surrogates: 400 naming the field ---------------------------------------------------
@pytest.mark.parametrize(
    "path,body,param",
    [
        (
            "/v1/chat/completions",
            '{"messages": [{"role": "user", "content": "x\\ud800"}]}',
            "messages[0].content",
        ),
        ("/v1/completions", '{"prompt": "\\udfff"}', "prompt"),
        ("/v1/completions", '{"prompt": ["ok", "a\\ud83d"]}', "prompt[1]"),
        ("/tokenize", '{"prompt": "\\ud800"}', "prompt"),
        (
            "/v1/chat/completions",
            '{"messages": [{"role": "user", "content": "hi"}], "tools": '
            '[{"type": "function", "function": {"name": "f", "description": "\\ud800"}}]}',
            "tools[0].function.description",
        ),
        (
            "/v1/chat/completions",
            '{"messages": [{"role": "user", "content": "hi"}], "metadata": {"\\ud800": 1}}',
            "metadata",
        ),
    ],
)
def test_lone_surrogates_are_400(serve, caplog, path, body, param) -> None:
    client = serve()
    resp = client.post(path, content=body, headers={"content-type": "application/json"})
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["param"] == param and err["code"] == "invalid_unicode"
    assert _errors_logged(caplog) == []


def test_a_proper_surrogate_pair_is_text(serve) -> None:
    client = serve()
    resp = client.post(
        "/tokenize",
        content='{"prompt": "\\ud83d\\ude42"}',
        headers={"content-type": "application/json"},
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["count"] == 4  # the four UTF-8 bytes of U+1F642 in the byte tokenizer


# -- 4. deep nesting: 400, no traceback -------------------------------------------------------
def test_a_deeply_nested_body_is_400_without_a_traceback(serve, caplog) -> None:
    client = serve()
    for depth in (70, 2000, 100_000):
        body = '{"prompt": "x", "ignored": ' + "[" * depth + "]" * depth + "}"
        resp = client.post(
            "/v1/completions", content=body, headers={"content-type": "application/json"}
        )
        assert resp.status_code == 400, (depth, resp.text)
        assert "deeper than 64 levels" in resp.json()["error"]["message"]
    assert _errors_logged(caplog) == []
    shallow = '{"prompt": "x", "max_tokens": 1, "ignored": ' + "[" * 60 + "]" * 60 + "}"
    assert (
        client.post(
            "/v1/completions", content=shallow, headers={"content-type": "application/json"}
        ).status_code
        == 200
    )


def test_deeply_nested_tool_parameters_are_400(serve, caplog) -> None:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(26):  # 52 JSON levels: under the body's limit, over the schema's
        schema = {"type": "object", "properties": {"a": schema}}
    client = serve()
    resp = client.post("/v1/chat/completions", json={"messages": MSG, "tools": _tool(schema)})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == "tools[0].function.parameters"
    assert "nested deeper than" in resp.json()["error"]["message"]
    assert _errors_logged(caplog) == []


# -- 7. smaller ones --------------------------------------------------------------------------
def test_fan_out_per_request_is_capped(serve) -> None:
    client = serve()
    resp = client.post("/v1/completions", json={"prompt": ["a"] * 64, "n": 128})
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert err["code"] == "too_many_sequences" and "8192" in err["message"]
    small = serve(max_sequences_per_request=4)
    assert (
        small.post(
            "/v1/completions", json={"prompt": ["a", "b"], "n": 2, "max_tokens": 1}
        ).status_code
        == 200
    )
    resp = small.post("/v1/chat/completions", json={"messages": MSG, "n": 5})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "n"


def _raw(port: int, data: bytes, read: bool = True) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        if not read:
            return b""
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
        return out


def test_a_client_closing_mid_body_is_not_an_internal_error(live, caplog) -> None:
    engine = FakeEngine()
    srv = live(engine)
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000\r\n\r\n"
    )
    _raw(srv.port, head + b'{"prompt": "abc", ', read=False)
    time.sleep(0.5)
    assert _errors_logged(caplog) == []
    assert httpx.get(srv.url + "/health").json()["server_inflight"] == 0


@pytest.mark.parametrize("value", [b"abc", b"-1", b"2, 3"])
def test_an_invalid_content_length_gets_an_openai_error(live, value) -> None:
    srv = live(FakeEngine())
    reply = _raw(
        srv.port,
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
        b"application/json\r\nContent-Length: " + value + b"\r\n\r\n{}",
    )
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400")
    assert b"content-type: application/json" in head.lower()
    err = json.loads(body)["error"]
    assert err["code"] == "invalid_http_request" and err["type"] == "invalid_request_error"


def _finished(url: str, reason: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for sample in family.samples:
            if (
                sample.name == "tallow_request_finished_total"
                and sample.labels.get("finish_reason") == reason
            ):
                return sample.value
    return 0.0


def test_cancelled_requests_are_counted_as_finished_with_abort(live) -> None:
    engine = FakeEngine(lambda prompt, params, index: "word " * 200, step_delay=0.01)
    srv = live(engine)

    async def leave_mid_stream() -> None:
        async with httpx.AsyncClient(base_url=srv.url, timeout=10) as client:
            async with client.stream(
                "POST",
                "/v1/completions",
                json={"prompt": ["a", "b"], "n": 2, "stream": True, "max_tokens": 300},
            ) as resp:
                async for line in resp.aiter_lines():
                    if line.startswith("data: "):
                        break

    asyncio.run(leave_mid_stream())
    try:
        httpx.post(srv.url + "/v1/chat/completions", json={"messages": MSG}, timeout=0.2)
    except httpx.TimeoutException:
        pass
    deadline = time.monotonic() + 10
    while _finished(srv.url, "abort") < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _finished(srv.url, "abort") == 5  # 2 prompts x n=2, then one chat completion


# -- 2. a request abandoned before the engine thread took it ----------------------------------
def test_a_request_abandoned_while_queued_for_the_engine_is_aborted() -> None:
    """The engine thread is held inside a step while a request's "add" sits in its command
    queue; the client leaves; once the thread goes on, the request must not run."""
    from tallow.engine.async_engine import AsyncEngine
    from tallow.engine.llm import config_from_kwargs
    from tallow import SamplingParams

    engine = AsyncEngine.from_config(
        config_from_kwargs(
            model="random:tiny-llama", dtype="float32", device="cpu", max_model_len=512
        )
    )
    gate = threading.Event()
    in_step = threading.Event()
    step = engine.core.step

    def held_step() -> Any:
        in_step.set()
        gate.wait()
        return step()

    engine.core.step = held_step  # type: ignore[method-assign]
    long = SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True)

    async def main() -> None:
        await engine.start()
        try:
            blocker = engine.generate([1, 2, 3], long, "blocker")
            first = asyncio.ensure_future(blocker.__anext__())
            await asyncio.to_thread(in_step.wait, 10)
            victim = asyncio.ensure_future(_drain(engine.generate([4, 5, 6], long, "victim")))
            await asyncio.sleep(0.1)  # the victim's "add" is posted and waits in the queue
            victim.cancel()  # its client left
            await asyncio.gather(victim, return_exceptions=True)
            gate.set()
            await first
            await blocker.aclose()
            for _ in range(200):
                stats = engine.stats()
                if stats["num_running"] == stats["num_waiting"] == 0:
                    break
                await asyncio.sleep(0.01)
            stats = engine.stats()
            assert stats["num_running"] == 0 and stats["num_waiting"] == 0, stats
            assert stats["num_free_blocks"] == stats["num_total_blocks"]
            assert stats["generation_tokens_total"] < 10  # the victim's 400 never ran
        finally:
            gate.set()
            await engine.shutdown()

    asyncio.run(main())


async def _drain(agen: Any) -> None:
    async for _ in agen:
        pass


# -- the OpenAPI document --------------------------------------------------------------------
@pytest.mark.parametrize("keys", [[], ["sk-1"]])
def test_openapi_covers_every_route_with_its_auth(serve, keys) -> None:
    from starlette.routing import Route

    from tallow.server.app import PROTECTED_PREFIXES

    client = serve(api_keys=keys)
    resp = client.get("/openapi.json")  # public, like /health
    assert resp.status_code == 200
    doc = resp.json()
    assert doc["openapi"].startswith("3.1")
    served = {
        (r.path.replace(":path}", "}"), m.lower())
        for r in client.app.routes
        if isinstance(r, Route)
        for m in (r.methods or ())
        if m != "HEAD"
    }
    served.discard(("/openapi.json", "get"))
    listed = {(p, m) for p, ops in doc["paths"].items() for m in ops}
    assert listed == served
    for path, method in listed:
        op = doc["paths"][path][method]
        protected = bool(keys) and path.startswith(PROTECTED_PREFIXES)
        assert op["security"] == ([{"bearerAuth": []}] if protected else []), (path, method)
        assert ("401" in op["responses"]) == protected
    chat = doc["paths"]["/v1/chat/completions"]["post"]
    ref = chat["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    schema = doc["components"]["schemas"][ref.rsplit("/", 1)[1]]
    assert "messages" in schema["required"]
    assert {"type": "integer", "minimum": 1, "maximum": 128} in schema["properties"]["n"]["anyOf"]
