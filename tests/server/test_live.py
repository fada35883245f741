"""The app under uvicorn on a real socket (fake engine): client disconnects abort their
requests and free their KV blocks at once; the server's own queue limit; metrics that move."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from server_fakes import FakeEngine
from server_helpers import httpx

MSG = [{"role": "user", "content": "tell me a long story"}]


def _long(prompt: str, params: Any, index: int) -> str:
    return "once upon a time " * 40


def _wait(predicate: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


def _metrics(url: str) -> dict[str, float]:
    """Every sample of /metrics, keyed by name plus its labels as sorted JSON."""
    text = httpx.get(url + "/metrics").text
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = json.dumps(sample.labels, sort_keys=True) if sample.labels else ""
            values[sample.name + labels] = sample.value
    return values


async def _read_a_little_then_leave(url: str, path: str, body: dict[str, Any]) -> int:
    """Stream a response, read a few chunks, then drop the connection mid-stream."""
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        async with client.stream("POST", path, json=body) as resp:
            assert resp.status_code == 200
            seen = 0
            async for line in resp.aiter_lines():
                if line.startswith("data: "):
                    seen += 1
                    if seen == 3:
                        break
    return seen


def test_disconnect_mid_stream_frees_every_block(live) -> None:
    engine = FakeEngine(_long, step_delay=0.01)
    srv = live(engine)
    bodies = [
        ("/v1/chat/completions", {"messages": MSG, "stream": True, "n": 2}),
        ("/v1/completions", {"prompt": "once", "stream": True, "max_tokens": 500}),
        ("/v1/completions", {"prompt": ["a", "b"], "stream": True, "max_tokens": 500}),
    ]

    async def burst() -> list[int]:
        return await asyncio.gather(
            *(_read_a_little_then_leave(srv.url, path, body) for path, body in bodies * 4)
        )

    assert asyncio.run(burst()) == [3] * 12
    _wait(lambda: not engine.active)
    assert engine.num_free_blocks == engine.num_total_blocks
    assert len(engine.aborted) == 16 and not engine.finished  # 4 x (1 + 1 + 2 prompts)
    health = httpx.get(srv.url + "/health").json()
    assert health["num_free_blocks"] == health["num_total_blocks"]
    assert health["server_inflight"] == 0
    _wait(lambda: _metrics(srv.url)["tallow_kv_cache_free_blocks"] == engine.num_total_blocks)


def test_disconnect_while_waiting_for_a_whole_response(live) -> None:
    engine = FakeEngine(_long, step_delay=0.01)
    srv = live(engine)
    try:
        httpx.post(srv.url + "/v1/chat/completions", json={"messages": MSG}, timeout=0.3)
    except httpx.TimeoutException:
        pass
    _wait(lambda: len(engine.aborted) == 1)
    assert engine.num_free_blocks == engine.num_total_blocks and not engine.finished


def test_server_queue_limit_is_503_under_real_load(live) -> None:
    engine = FakeEngine(_long, step_delay=0.01)
    srv = live(engine, max_queue=2)

    async def run() -> list[int]:
        async with httpx.AsyncClient(base_url=srv.url, timeout=20) as client:

            async def one(i: int) -> int:
                await asyncio.sleep(0.05 * i)
                resp = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 200})
                return resp.status_code

            return await asyncio.gather(*(one(i) for i in range(4)))

    statuses = asyncio.run(run())
    # two requests (2 s each) hold both slots; the two that follow find none
    assert sorted(statuses) == [200, 200, 503, 503]
    assert httpx.get(srv.url + "/health").json()["server_inflight"] == 0


def test_metrics_parse_and_move(live) -> None:
    engine = FakeEngine(step_delay=0.001)
    srv = live(engine)
    before = httpx.get(srv.url + "/metrics")
    assert before.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(before.text)}
    for name in (
        "tallow_http_requests",
        "tallow_num_requests_waiting",
        "tallow_num_requests_running",
        "tallow_kv_cache_usage_ratio",
        "tallow_kv_cache_free_blocks",
        "tallow_prefix_cache_hit_rate",
        "tallow_time_to_first_token_seconds",
        "tallow_inter_token_latency_seconds",
        "tallow_e2e_request_latency_seconds",
        "tallow_prompt_tokens",
        "tallow_generation_tokens",
        "tallow_num_preemptions",
    ):
        assert name in families, name
    assert families["tallow_time_to_first_token_seconds"].type == "histogram"
    assert families["tallow_prompt_tokens"].type == "counter"
    assert families["tallow_num_preemptions"].type == "counter"
    m0 = _metrics(srv.url)
    for _ in range(2):
        assert (
            httpx.post(
                srv.url + "/v1/completions", json={"prompt": "abc", "max_tokens": 5}
            ).status_code
            == 200
        )
    assert httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "n": 0}).status_code == 400
    m1 = _metrics(srv.url)
    ok = (
        'tallow_http_requests_total{"endpoint": "/v1/completions", "method": "POST", '
        '"status": "200"}'
    )
    bad = ok.replace('"200"', '"400"')
    assert m1[ok] - m0.get(ok, 0) == 2 and m1[bad] - m0.get(bad, 0) == 1
    assert m1["tallow_prompt_tokens_total"] - m0["tallow_prompt_tokens_total"] == 6
    assert m1["tallow_generation_tokens_total"] - m0["tallow_generation_tokens_total"] == 10
    ttft = 'tallow_time_to_first_token_seconds_count{"model_name": "fake-model"}'
    itl = 'tallow_inter_token_latency_seconds_count{"model_name": "fake-model"}'
    e2e = 'tallow_e2e_request_latency_seconds_count{"model_name": "fake-model"}'
    assert m1[ttft] - m0.get(ttft, 0) == 2
    assert m1[itl] - m0.get(itl, 0) == 8  # 4 gaps after the first token, twice
    assert m1[e2e] - m0.get(e2e, 0) == 2
