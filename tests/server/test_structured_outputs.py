"""Structured outputs through the HTTP API on a real engine (a tiny random model, in process, with
the xgrammar backend): the request fields, the 400s naming the part of a schema, forced tool
calls valid by construction, and their streamed argument deltas. The same on the real model
through the openai client is ``test_e2e_structured_outputs.py``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "engine"))
from tiny_models import save_tiny  # noqa: E402

from server_helpers import chunks_of, make_config  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "n": {"type": "integer", "minimum": 0, "maximum": 50},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
    },
    "required": ["name", "n", "tags"],
    "additionalProperties": False,
}
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 5},
                "unit": {"enum": ["c", "f"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
OTHER = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}},
            "required": ["a"],
            "additionalProperties": False,
        },
    },
}
MSG = [{"role": "user", "content": "The quick brown fox"}]


@pytest.fixture(scope="module")
def client(tmp_path_factory) -> Any:
    """One app for the module: an AsyncEngine belongs to the event loop that started it."""
    from starlette.testclient import TestClient

    from tallow.engine.async_engine import AsyncEngine
    from tallow.server.app import build_app

    path = save_tiny(tmp_path_factory.mktemp("tiny"), "llama")
    engine = AsyncEngine.create(
        str(path), dtype="float32", device="cpu", num_blocks=512, block_size=8
    )
    with TestClient(build_app(engine, make_config()), raise_server_exceptions=False) as client:
        yield client


def post(client: Any, path: str = "/v1/chat/completions", **body: Any) -> Any:
    body.setdefault("temperature", 0)
    if path.endswith("chat/completions"):
        body.setdefault("messages", MSG)
    return client.post(path, json=body)


def streamed(client: Any, **body: Any) -> tuple[str, list[dict[str, Any]], str]:
    resp = post(client, stream=True, **body)
    assert resp.status_code == 200, resp.text
    text, deltas, finish = "", [], None
    for chunk in chunks_of(resp):
        for choice in chunk["choices"]:
            text += choice["delta"].get("content") or ""
            deltas += choice["delta"].get("tool_calls") or []
            finish = choice["finish_reason"] or finish
    return text, deltas, finish


def test_response_format_json_schema_whole_and_streamed(client) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "rec", "schema": SCHEMA, "strict": True}}
    resp = post(client, response_format=fmt, max_tokens=80)
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    jsonschema.validate(json.loads(choice["message"]["content"]), SCHEMA)
    text, _, finish = streamed(client, response_format=fmt, max_tokens=80)
    assert (text, finish) == (choice["message"]["content"], "stop")


@pytest.mark.parametrize(
    "body,check",
    [
        # a random model's free-form object seldom closes within the budget: it starts like one
        ({"response_format": {"type": "json_object"}}, lambda t: t.startswith("{")),
        ({"guided_choice": ["alpha", "beta"]}, lambda t: t in ("alpha", "beta")),
        ({"guided_regex": "[a-c]{3}-[0-9]"}, lambda t: len(t) == 5 and t[3] == "-"),
        (
            {"structured_outputs": {"json": SCHEMA}},
            lambda t: jsonschema.validate(json.loads(t), SCHEMA) is None,
        ),
        ({"guided_grammar": 'root ::= "x" ("y" | "z")'}, lambda t: t in ("xy", "xz")),
    ],
)
def test_vllm_fields_on_both_endpoints(client, body, check) -> None:
    chat = post(client, max_tokens=80, **body)
    assert chat.status_code == 200, chat.text
    assert check(chat.json()["choices"][0]["message"]["content"])
    text = post(client, "/v1/completions", prompt="The quick", max_tokens=80, **body)
    assert text.status_code == 200, text.text
    assert check(text.json()["choices"][0]["text"])


@pytest.mark.parametrize(
    "body,param",
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "x",
                        "schema": {
                            "type": "object",
                            "properties": {"t": {"type": "array", "uniqueItems": True}},
                        },
                    },
                }
            },
            "response_format.json_schema.schema.properties.t.uniqueItems",
        ),
        (
            {"guided_json": {"anyOf": [{"type": "string"}, {"not": {"type": "null"}}]}},
            "guided_json.anyOf[1].not",
        ),
        (
            {"structured_outputs": {"json": {"type": "string", "format": "iri"}}},
            "structured_outputs.json.format",
        ),
        ({"guided_regex": "(?<=a)b"}, "guided_regex"),
        ({"guided_grammar": "root ::= ("}, "guided_grammar"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "bad name"}}},
            "response_format.json_schema.name",
        ),
        ({"guided_choice": []}, "guided_choice"),
        ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
        (
            {
                "response_format": {"type": "json_object"},
                "tools": [TOOL],
                "tool_choice": "required",
            },
            "response_format",
        ),
        (
            {
                "tools": [
                    TOOL,
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "parameters": {
                                "type": "object",
                                "properties": {"x": {"oneOf": [{"type": "string"}]}},
                            },
                        },
                    },
                ],
                "tool_choice": "required",
            },
            "tools[1].function.parameters.properties.x.oneOf",
        ),
    ],
)
def test_what_cannot_be_enforced_is_a_400_naming_it(client, body, param) -> None:
    resp = post(client, max_tokens=5, **body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param, resp.json()


@pytest.mark.parametrize(
    "tool_choice", ["required", {"type": "function", "function": {"name": "add"}}]
)
def test_forced_calls_are_valid_and_stream_as_they_are_written(client, tool_choice) -> None:
    tools = [TOOL, OTHER]
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    for prompt in ("The quick brown fox", "def add(a, b):", "日本語"):
        msg = [{"role": "user", "content": prompt}]
        resp = post(client, messages=msg, tools=tools, tool_choice=tool_choice, max_tokens=150)
        assert resp.status_code == 200, resp.text
        choice = resp.json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
        (call,) = choice["message"]["tool_calls"]
        name, arguments = call["function"]["name"], call["function"]["arguments"]
        if tool_choice != "required":
            assert name == "add"
        jsonschema.validate(json.loads(arguments), schemas[name])
        text, deltas, finish = streamed(
            client, messages=msg, tools=tools, tool_choice=tool_choice, max_tokens=150
        )
        assert text == "" and finish == "tool_calls"
        first, *rest = deltas
        assert first["id"].startswith("call_") and first["type"] == "function"
        assert first["function"]["name"] == name and first["function"]["arguments"] == ""
        assert all("id" not in d and "name" not in d["function"] for d in rest)
        assert "".join(d["function"]["arguments"] for d in rest) == arguments
        assert len(rest) > 1


def test_a_cut_short_call_says_length(client) -> None:
    whole = post(client, tools=[TOOL], tool_choice="required", max_tokens=150).json()
    full = whole["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    budget = whole["usage"]["completion_tokens"] - 2  # stops inside the arguments
    resp = post(client, tools=[TOOL], tool_choice="required", max_tokens=budget)
    choice = resp.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert full.startswith(call["function"]["arguments"]) and full != call["function"]["arguments"]
    _, deltas, finish = streamed(client, tools=[TOOL], tool_choice="required", max_tokens=budget)
    assert finish == "length"
    assert "".join(d["function"]["arguments"] for d in deltas) == call["function"]["arguments"]


def test_plugins_endpoint_names_the_grammar_backend(client) -> None:
    assert client.get("/v1/plugins").json()["selected"]["grammar_backend"] == "xgrammar"
