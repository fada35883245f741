"""``tallow serve`` in a subprocess on a random-weight model (``random:qwen2.5-0.5b``: real
engine, real scheduler and KV cache): the waiting queue (429), the server's own limit (503),
``--host host:port`` and Unix sockets, a disconnect burst on the real block manager."""

from __future__ import annotations

import asyncio
import os
import socket
import tempfile
import time
from typing import Any, Iterator

import openai
import pytest
from server_helpers import ServeProcess, httpx

pytestmark = pytest.mark.slow

MODEL = "random:qwen2.5-0.5b"
BASE = ["--model", MODEL, "--dtype", "float32", "--device", "cpu", "--max-model-len", "2048"]
# A long generation: random weights rarely emit EOS, and ignore_eos makes sure of it.
LONG = {
    "model": MODEL,
    "prompt": "<1> <2> <3>",
    "max_tokens": 2000,
    "ignore_eos": True,
    "stream": True,
}


def _health(srv: ServeProcess) -> dict[str, Any]:
    with srv.http() as http:
        return http.get("/health").json()


def _wait(srv: ServeProcess, predicate: Any, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        health = _health(srv)
        if predicate(health):
            return health
        assert time.monotonic() < deadline, health
        time.sleep(0.05)


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[ServeProcess]:
    srv = ServeProcess(BASE + request.param, host_port=True, timeout=180).start()
    yield srv
    assert srv.stop() == 0, srv.log_text()[-3000:]


async def _hold_streams(
    srv: ServeProcess, count: int, body: dict[str, Any], until: Any, in_engine: bool = False
) -> None:
    """Open ``count`` streams one after the other, run ``until()`` while they are all open,
    then leave. The next stream is sent once the server holds the previous one (with
    ``in_engine``: once the engine has it running or waiting)."""
    leave = asyncio.Event()

    async def hold(http: httpx.AsyncClient) -> None:
        async with http.stream("POST", "/v1/completions", json=body) as resp:
            assert resp.status_code == 200
            await leave.wait()

    async with httpx.AsyncClient(base_url=srv.url, timeout=60) as http:
        holders = []
        try:
            for i in range(count):
                holders.append(asyncio.ensure_future(hold(http)))
                if in_engine:
                    await asyncio.to_thread(
                        _wait, srv, lambda h: h["num_running"] + h["num_waiting"] == i + 1
                    )
                else:
                    await asyncio.to_thread(_wait, srv, lambda h: h["server_inflight"] == i + 1)
            await until()
        finally:
            leave.set()
            await asyncio.gather(*holders)


@pytest.mark.parametrize("server", [["--max-num-seqs", "1", "--max-waiting", "1"]], indirect=True)
def test_full_waiting_queue_is_429(server) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)

    async def third_request() -> None:
        health = await asyncio.to_thread(
            _wait, server, lambda h: h["num_running"] == 1 and h["num_waiting"] == 1
        )
        assert health["server_inflight"] == 2
        with pytest.raises(openai.RateLimitError) as info:
            await asyncio.to_thread(
                client.completions.create, model=MODEL, prompt="<5>", max_tokens=2
            )
        assert info.value.body["code"] == "queue_full"
        assert info.value.response.headers["retry-after"] == "1"

    asyncio.run(_hold_streams(server, 2, LONG, third_request, in_engine=True))
    health = _wait(server, lambda h: h["num_running"] == 0 and h["num_waiting"] == 0)
    assert health["num_free_blocks"] == health["num_total_blocks"]


@pytest.mark.parametrize("server", [["--max-queue", "2"]], indirect=True)
def test_full_server_is_503_and_a_disconnect_burst_frees_every_block(server) -> None:
    async def third_request() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
            resp = await http.post(
                "/v1/completions", json={"model": MODEL, "prompt": "<5>", "max_tokens": 2}
            )
        assert resp.status_code == 503
        assert resp.json()["error"]["code"] == "server_overloaded"

    asyncio.run(_hold_streams(server, 2, LONG, third_request))
    health = _wait(server, lambda h: h["num_running"] == 0 and h["server_inflight"] == 0)
    assert health["num_free_blocks"] == health["num_total_blocks"]

    # a burst of clients (up to the limit) that leave mid-stream, several times over
    async def burst() -> None:
        for _ in range(5):

            async def nothing() -> None:
                await asyncio.sleep(0.05)

            await _hold_streams(server, 2, {**LONG, "n": 3}, nothing)

    asyncio.run(burst())
    health = _wait(server, lambda h: h["num_running"] == 0 and h["num_waiting"] == 0)
    assert health["num_free_blocks"] == health["num_total_blocks"]
    assert health["kv_usage"] == 0


def test_unix_socket() -> None:
    path = os.path.join(tempfile.mkdtemp(prefix="tallow-"), "serve.sock")
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(path)  # left behind by a server that died: nobody listens on it
    stale.close()
    srv = ServeProcess(BASE, uds=path, timeout=180).start()
    try:
        with srv.http() as http:
            body = http.post(
                "/v1/completions",
                json={"model": MODEL, "prompt": "<1>", "max_tokens": 3, "ignore_eos": True},
            )
        assert body.status_code == 200 and body.json()["usage"]["completion_tokens"] == 3
        assert f"tallow: serving {MODEL} at unix://{path}" in srv.log_text()
    finally:
        assert srv.stop() == 0
    assert not os.path.exists(path)  # uvicorn removes its socket on shutdown
