"""Grammar compiles under a budget (issue 46): a schema too large to compile in time is a 400
naming ``runner.grammar_compile_timeout_s`` and its compile stops (the worker process ends,
its CPU freed); a spec over ``runner.grammar_max_spec_chars`` is a 400 without compiling; a
grammar that no output can match is a 400 up front instead of a 200 that breaks it."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "engine"))

from tiny_models import save_tiny  # noqa: E402
from server_helpers import make_config  # noqa: E402

MSG = [{"role": "user", "content": "The quick brown fox"}]
TIMEOUT_S = 3.0


@pytest.fixture(scope="module")
def client(tmp_path_factory) -> Any:
    from starlette.testclient import TestClient

    from tallow.engine.async_engine import AsyncEngine
    from tallow.server.app import build_app

    path = save_tiny(tmp_path_factory.mktemp("tiny"), "llama")
    engine = AsyncEngine.create(
        str(path),
        dtype="float32",
        device="cpu",
        num_blocks=512,
        block_size=8,
        grammar_compile_timeout_s=TIMEOUT_S,
        grammar_max_spec_chars=200_000,
    )
    with TestClient(build_app(engine, make_config()), raise_server_exceptions=False) as client:
        client.engine = engine
        yield client


def _schema_request(schema: Any) -> dict[str, Any]:
    return {
        "messages": MSG,
        "max_tokens": 8,
        "temperature": 0,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "big", "schema": schema},
        },
    }


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_schema_too_slow_to_compile_is_400_and_its_compile_stops(client) -> None:
    ok = client.post("/v1/chat/completions", json=_schema_request({"type": "object"}))
    assert ok.status_code == 200, ok.text  # the compile worker runs
    worker = client.engine.structured._worker
    pid = worker.pid
    assert pid is not None and _alive(pid)
    props = {f"p{i}": {"type": "string"} for i in range(3000)}
    started = time.monotonic()
    resp = client.post(
        "/v1/chat/completions", json=_schema_request({"type": "object", "properties": props})
    )
    took = time.monotonic() - started
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["code"] == "grammar_too_large"
    assert "runner.grammar_compile_timeout_s" in err["message"]
    assert err["param"] == "response_format.json_schema.schema"
    assert took < TIMEOUT_S + 5
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid), "the overrunning compile is still running"
    # the next request gets a fresh worker
    again = client.post(
        "/v1/chat/completions",
        json=_schema_request({"type": "object", "properties": {"a": {"type": "integer"}}}),
    )
    assert again.status_code == 200, again.text
    assert worker.pid not in (None, pid)


def test_a_spec_over_the_size_limit_is_400_before_compiling(client) -> None:
    resp = client.post(
        "/v1/completions",
        json={"prompt": "x", "max_tokens": 4, "structured_outputs": {"regex": "a" * 200_001}},
    )
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["code"] == "grammar_too_large" and err["param"] == "structured_outputs.regex"
    assert "runner.grammar_max_spec_chars" in err["message"] and "200000" in err["message"]


@pytest.mark.parametrize(
    "field, value",
    [
        ("regex", "[^\\s\\S]"),
        ("grammar", "root ::= [^\\x00-\\U0010FFFF]"),
    ],
)
def test_a_grammar_no_output_can_match_is_400_up_front(client, field, value) -> None:
    resp = client.post(
        "/v1/completions",
        json={"prompt": "x", "max_tokens": 4, "structured_outputs": {field: value}},
    )
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["param"] == f"structured_outputs.{field}"
    assert "no output can match it" in err["message"]
