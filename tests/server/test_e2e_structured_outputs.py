"""Structured outputs through the official ``openai`` client against one live ``tallow serve``
on the embedded default model (Qwen2.5-Coder-0.5B-Instruct, CPU), with the xgrammar backend.

- Every JSON Schema of ``data/json_schemas.json`` (nested objects, bounded arrays, enums,
  ``anyOf``, formats and patterns, ``$defs`` references, numeric ranges, optional properties,
  ``additionalProperties: false``) is asked for with ``response_format: json_schema``, whole
  and streamed: every output parses and validates with ``jsonschema`` (formats checked), and
  the greedy stream says what the whole answer says.
- Schemas the backend cannot enforce are a 400 naming the part of the schema.
- ``tool_choice: required`` with the weather tool always yields a call whose arguments are
  valid; a named tool too; streamed argument deltas (id and name first, then pieces) add up
  to the whole answer's arguments.
- The vLLM fields (``guided_*``, ``structured_outputs``) on chat and completions.

Requests go concurrently, so the engine batches them; outputs are kept short.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from server_helpers import DEFAULT_SERVER_KEY, ServeProcess

pytestmark = pytest.mark.slow

MODEL = "Qwen2.5-Coder-0.5B-Instruct"
SCHEMAS = json.loads((Path(__file__).parent / "data" / "json_schemas.json").read_text())
SYSTEM = {"role": "system", "content": "You answer with JSON only."}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
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
CONCURRENCY = 32


@pytest.fixture(scope="module")
def server(default_model_server: ServeProcess) -> ServeProcess:
    """The session's shared server (tests/server/conftest.py): it runs ``CONCURRENCY``
    sequences at once."""
    return default_model_server


@pytest.fixture(scope="module")
def client(server: ServeProcess) -> Any:
    """Makes an ``openai.AsyncOpenAI`` for the event loop of each test's ``run``."""
    return lambda: openai.AsyncOpenAI(
        base_url=server.url + "/v1", api_key=DEFAULT_SERVER_KEY, max_retries=0, timeout=600
    )


def run(make_client: Any, work: Any) -> Any:
    """``work(client)`` on a fresh event loop, with a client of that loop."""

    async def main() -> Any:
        async with make_client() as client:
            return await work(client)

    return asyncio.run(main())


async def bounded(calls: list[Any]) -> list[Any]:
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(call: Any) -> Any:
        async with gate:
            return await call

    return await asyncio.gather(*(one(c) for c in calls))


def assert_valid(text: str, schema: Any, name: str) -> Any:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise AssertionError(f"{name}: not JSON ({exc}): {text!r}") from None
    validator = jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )
    errors = [e.message for e in validator.iter_errors(value)]
    assert not errors, f"{name}: {text!r}: {errors}"
    return value


def response_format(entry: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "json_schema",
        "json_schema": {"name": entry["name"], "schema": entry["schema"], "strict": True},
    }


async def _whole(client: Any, entry: dict[str, Any]) -> tuple[str, str]:
    resp = await client.chat.completions.create(
        model=MODEL,
        messages=[SYSTEM, {"role": "user", "content": entry["prompt"]}],
        temperature=0,
        max_tokens=entry.get("max_tokens", 120),
        response_format=response_format(entry),
    )
    choice = resp.choices[0]
    return choice.message.content, choice.finish_reason


async def _streamed(client: Any, entry: dict[str, Any]) -> tuple[str, str]:
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[SYSTEM, {"role": "user", "content": entry["prompt"]}],
        temperature=0,
        max_tokens=entry.get("max_tokens", 120),
        response_format=response_format(entry),
        stream=True,
    )
    text, finish = "", None
    async for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    return text, finish


def test_every_schema_whole_and_streamed_validates(client) -> None:
    assert len(SCHEMAS) >= 50

    async def both(client: Any) -> list[Any]:
        calls = [_whole(client, e) for e in SCHEMAS] + [_streamed(client, e) for e in SCHEMAS]
        return await bounded(calls)

    results = run(client, both)
    whole, streamed = results[: len(SCHEMAS)], results[len(SCHEMAS) :]
    for entry, (text, finish), (s_text, s_finish) in zip(SCHEMAS, whole, streamed):
        assert finish == "stop", f"{entry['name']}: finish_reason {finish}: {text!r}"
        assert_valid(text, entry["schema"], entry["name"])
        assert (s_text, s_finish) == (text, finish), entry["name"]


REFUSED = [
    (
        {
            "type": "object",
            "properties": {
                "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
            },
        },
        "properties.tags.uniqueItems",
    ),
    ({"type": "object", "properties": {"x": {"not": {"type": "string"}}}}, "properties.x.not"),
    (
        {"type": "object", "properties": {"link": {"type": "string", "format": "iri"}}},
        "properties.link.format",
    ),
    ({"oneOf": [{"type": "integer"}, {"type": "string"}]}, "oneOf"),
    (
        {"$defs": {"c": {"type": "string", "pattern": "^(?!x).+$"}}, "$ref": "#/$defs/c"},
        "$defs.c.pattern",
    ),
]


def test_schemas_the_backend_cannot_enforce_are_400(client) -> None:
    async def refuse(client: Any, schema: Any) -> Any:
        with pytest.raises(openai.BadRequestError) as info:
            await client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=5,
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": schema},
                },
            )
        return info.value

    errors = run(client, lambda c: bounded([refuse(c, s) for s, _ in REFUSED]))
    for (_, path), error in zip(REFUSED, errors):
        assert error.param == f"response_format.json_schema.schema.{path}", error.message
        assert error.code == "unsupported_schema" and path.split(".")[-1] in error.message

    async def guided(client: Any) -> Any:
        with pytest.raises(openai.BadRequestError) as info:
            await client.completions.create(
                model=MODEL, prompt="x", max_tokens=5, extra_body={"guided_json": REFUSED[0][0]}
            )
        return info.value

    assert run(client, guided).param == "guided_json.properties.tags.uniqueItems"

    async def tool(client: Any) -> Any:
        bad = {"type": "function", "function": {"name": "f", "parameters": REFUSED[1][0]}}
        with pytest.raises(openai.BadRequestError) as info:
            await client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=5,
                tools=[WEATHER_TOOL, bad],
                tool_choice="required",
            )
        return info.value

    assert run(client, tool).param == "tools[1].function.parameters.properties.x.not"


WEATHER_PROMPTS = [
    "What is the weather like in Paris right now?",
    "Should I take an umbrella in Tokyo today?",
    "Hello there!",
    "Write a haiku about the sea.",
    "Is it hot in Cairo in fahrenheit?",
    "Tell me about London.",
]


async def _call(client: Any, prompt: str, tool_choice: Any, stream: bool) -> dict[str, Any]:
    kwargs = dict(
        model=MODEL,
        messages=[{"role": "user", "content": prompt}],
        tools=[WEATHER_TOOL, ADD_TOOL],
        tool_choice=tool_choice,
        temperature=0,
        max_tokens=60,
    )
    if not stream:
        resp = await client.chat.completions.create(**kwargs)
        choice = resp.choices[0]
        calls = choice.message.tool_calls or []
        return {
            "finish": choice.finish_reason,
            "content": choice.message.content,
            "calls": [(c.id, c.function.name, c.function.arguments) for c in calls],
        }
    deltas, finish = [], None
    async for chunk in await client.chat.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for part in choice.delta.tool_calls or []:
                deltas.append(
                    (
                        part.index,
                        part.id,
                        part.function.name if part.function else None,
                        part.function.arguments if part.function else None,
                    )
                )
    return {"finish": finish, "deltas": deltas}


def test_required_tool_choice_always_yields_valid_arguments(client) -> None:
    results = run(
        client, lambda c: bounded([_call(c, p, "required", stream=False) for p in WEATHER_PROMPTS])
    )
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER_TOOL, ADD_TOOL)}
    for prompt, result in zip(WEATHER_PROMPTS, results):
        assert result["finish"] == "tool_calls" and result["content"] is None, (prompt, result)
        ((call_id, name, arguments),) = result["calls"]
        assert re.fullmatch(r"call_[0-9a-f]{24}", call_id)
        assert_valid(arguments, schemas[name], f"{prompt}: {name}")
    # the weather questions go to the weather tool
    assert results[0]["calls"][0][1] == "get_weather"


def test_streamed_argument_deltas_add_up_to_the_whole_answer(client) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    cases = [(p, choice) for p in WEATHER_PROMPTS[:3] for choice in ("required", named)]

    async def pairs(client: Any) -> list[Any]:
        return await bounded(
            [_call(client, p, c, stream=s) for p, c in cases for s in (False, True)]
        )

    results = run(client, pairs)
    for (prompt, choice), whole, streamed in zip(cases, results[::2], results[1::2]):
        ((call_id, name, arguments),) = whole["calls"]
        if choice != "required":
            assert name == "get_weather"
        first, *rest = streamed["deltas"]
        assert first[0] == 0 and first[1].startswith("call_") and first[2] == name, first
        assert first[3] in ("", None)
        assert all(d[1] is None and d[2] is None for d in rest), rest
        pieces = [d[3] for d in rest]
        assert "".join(pieces) == arguments, (prompt, choice)
        assert len(pieces) > 1, "the arguments came in one piece, not as they were written"
        assert streamed["finish"] == whole["finish"] == "tool_calls"


def test_guided_fields_on_chat_and_completions(client) -> None:
    user = [{"role": "user", "content": "Pick a color and answer with it."}]

    async def all_of_them(client: Any) -> list[str]:
        chat = [
            client.chat.completions.create(
                model=MODEL, messages=user, temperature=0, max_tokens=20, extra_body=body
            )
            for body in (
                {"guided_choice": ["red", "green", "blue"]},
                {"guided_regex": "#[0-9a-f]{6}"},
                {"structured_outputs": {"choice": ["yes", "no"]}},
                {"guided_grammar": 'root ::= "color: " ("red" | "blue")'},
            )
        ]
        text = [
            client.completions.create(
                model=MODEL,
                prompt="The capital of France is",
                temperature=0,
                max_tokens=tokens,
                extra_body=body,
            )
            for body, tokens in (
                ({"guided_choice": [" Paris", " Lyon"]}, 20),
                ({"response_format": {"type": "json_object"}}, 60),
            )
        ]
        done = await bounded(chat + text)
        return [r.choices[0].message.content for r in done[:4]] + [
            r.choices[0].text for r in done[4:]
        ]

    answers = run(client, all_of_them)
    assert answers[0] in ("red", "green", "blue")
    assert re.fullmatch(r"#[0-9a-f]{6}", answers[1])
    assert answers[2] in ("yes", "no")
    assert answers[3] in ("color: red", "color: blue")
    assert answers[4] in (" Paris", " Lyon")
    assert isinstance(json.loads(answers[5]), dict)
