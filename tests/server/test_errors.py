"""Every error the API reports is OpenAI-shaped, with the right status and the field at fault."""

from __future__ import annotations

import json
from typing import Any

import pytest
from server_fakes import FakeEngine
from server_helpers import TOOLS, openai_client

MSG = [{"role": "user", "content": "hi"}]


def _error(resp: Any, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return body["error"]


# (endpoint, body, the param the 400 must name)
BAD_REQUESTS = [
    ("chat", {"messages": MSG, "temperature": -1}, "temperature"),
    ("chat", {"messages": MSG, "temperature": "hot"}, "temperature"),
    ("chat", {"messages": MSG, "top_p": 0}, "top_p"),
    ("chat", {"messages": MSG, "n": 0}, "n"),
    ("chat", {"messages": MSG, "n": True}, "n"),
    ("chat", {"messages": MSG, "max_tokens": 0}, "max_tokens"),
    ("chat", {"messages": MSG, "max_completion_tokens": "3"}, "max_completion_tokens"),
    ("chat", {"messages": MSG, "presence_penalty": 3}, "presence_penalty"),
    ("chat", {"messages": MSG, "frequency_penalty": -2.5}, "frequency_penalty"),
    ("chat", {"messages": MSG, "stop": [1, 2]}, "stop"),
    ("chat", {"messages": MSG, "stop": [""]}, "stop"),
    ("chat", {"messages": MSG, "seed": "x"}, "seed"),
    ("chat", {"messages": MSG, "logit_bias": {"abc": 1}}, "logit_bias"),
    ("chat", {"messages": MSG, "logit_bias": {"5": 500}}, "logit_bias"),
    ("chat", {"messages": MSG, "logit_bias": {"999999": 1}}, "logit_bias"),
    ("chat", {"messages": MSG, "top_logprobs": 2}, "top_logprobs"),
    ("chat", {"messages": MSG, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("chat", {"messages": MSG, "stream_options": {"include_usage": True}}, "stream_options"),
    (
        "chat",
        {"messages": MSG, "stream": True, "stream_options": {"include_usage": 1}},
        "stream_options.include_usage",
    ),
    ("chat", {"messages": MSG, "top_k": -5}, "top_k"),
    ("chat", {"messages": MSG, "min_p": 2}, "min_p"),
    ("chat", {"messages": MSG, "repetition_penalty": 0}, "repetition_penalty"),
    ("chat", {"messages": MSG, "min_tokens": 9, "max_tokens": 3}, "min_tokens"),
    ("chat", {"messages": []}, "messages"),
    ("chat", {}, "messages"),
    ("chat", {"messages": "hi"}, "messages"),
    ("chat", {"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ("chat", {"messages": [{"content": "hi"}]}, "messages[0].role"),
    ("chat", {"messages": [MSG[0], {"role": "user", "content": 5}]}, "messages[1].content"),
    (
        "chat",
        {"messages": [{"role": "user", "content": [{"type": "video"}]}]},
        "messages[0].content[0].type",
    ),
    ("chat", {"messages": [{"role": "tool", "content": "42"}]}, "messages[0].tool_call_id"),
    (
        "chat",
        {
            "messages": [
                MSG[0],
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{bad"},
                        }
                    ],
                },
            ]
        },
        "messages[1].tool_calls[0].function.arguments",
    ),
    (
        "chat",
        {"messages": MSG, "tools": [{"type": "function", "function": {"name": "a b"}}]},
        "tools[0].function.name",
    ),
    (
        "chat",
        {
            "messages": MSG,
            "tools": [
                {"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}
            ],
        },
        "tools[0].function.parameters",
    ),
    ("chat", {"messages": MSG, "tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    (
        "chat",
        {
            "messages": MSG,
            "tools": TOOLS,
            "tool_choice": {"type": "function", "function": {"name": "nope"}},
        },
        "tool_choice.function.name",
    ),
    ("chat", {"messages": MSG, "tool_choice": "required"}, "tool_choice"),
    ("chat", {"messages": MSG, "response_format": {"type": "yaml"}}, "response_format.type"),
    (
        "chat",
        {"messages": MSG, "chat_template_kwargs": {"chat_template": "{{ 7 * 7 }}"}},
        "chat_template_kwargs.chat_template",
    ),
    ("chat", {"messages": MSG, "chat_template_kwargs": "x"}, "chat_template_kwargs"),
    ("completions", {"prompt": "x", "logprobs": 30}, "logprobs"),
    ("completions", {"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ("completions", {"prompt": "x", "max_tokens": -1}, "max_tokens"),
    ("completions", {"prompt": [1, 99999]}, "prompt"),
    ("completions", {"prompt": []}, "prompt"),
    ("completions", {"prompt": ""}, "prompt"),
    ("completions", {"prompt": {"text": "x"}}, "prompt"),
    ("completions", {}, "prompt"),
    ("completions", {"prompt": "x", "echo": "yes"}, "echo"),
    ("completions", {"prompt": "x", "stop": "\n", "temperature": 9}, "temperature"),
]


@pytest.mark.parametrize(
    "endpoint,body,param",
    BAD_REQUESTS,
    ids=[f"{e}:{p}:{i}" for i, (e, _, p) in enumerate(BAD_REQUESTS)],
)
def test_invalid_parameters_are_400_naming_the_field(serve, endpoint, body, param) -> None:
    client = serve()
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    err = _error(client.post(path, json=body), 400)
    assert err["param"] == param
    assert err["type"] == "invalid_request_error"
    assert not client.engine.requests  # nothing reached the engine


# Known OpenAI fields tallow does not implement: refused, never silently dropped.
UNSUPPORTED = [
    ("chat", {"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ("chat", {"modalities": ["text", "audio"]}, "modalities"),
    ("chat", {"prediction": {"type": "content", "content": "x"}}, "prediction"),
    ("chat", {"web_search_options": {}}, "web_search_options"),
    ("chat", {"functions": [{"name": "f"}]}, "functions"),
    ("chat", {"function_call": "auto"}, "function_call"),
    ("chat", {"reasoning_effort": "low"}, "reasoning_effort"),
    ("chat", {"store": True}, "store"),
    (
        "chat",
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}],
                }
            ]
        },
        "messages[0].content[0].type",
    ),
    ("chat", {"messages": [{"role": "function", "name": "f", "content": "1"}]}, "messages[0].role"),
    ("chat", {"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "tools[0].type"),
    ("completions", {"suffix": "}"}, "suffix"),
    ("completions", {"best_of": 3}, "best_of"),
]


@pytest.mark.parametrize(
    "extra,param",
    [
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"guided_regex": "[a-z]+"}, "guided_regex"),
        ({"structured_outputs": {"choice": ["a", "b"]}}, "structured_outputs.choice"),
    ],
)
def test_structured_outputs_need_an_engine_that_constrains(serve, extra, param) -> None:
    client = serve()  # the fake engine has no grammar side
    for path, body in (
        ("/v1/chat/completions", {"messages": MSG}),
        ("/v1/completions", {"prompt": "x"}),
    ):
        err = _error(client.post(path, json={**body, **extra}), 400)
        assert err["param"] == param and err["code"] == "structured_outputs_unavailable"
    assert not client.engine.requests


@pytest.mark.parametrize("endpoint,extra,param", UNSUPPORTED, ids=[p for _, _, p in UNSUPPORTED])
def test_unsupported_known_fields_are_400(serve, endpoint, extra, param) -> None:
    client = serve()
    if endpoint == "chat":
        path, body = "/v1/chat/completions", {"messages": MSG, **extra}
    else:
        path, body = "/v1/completions", {"prompt": "x", **extra}
    err = _error(client.post(path, json=body), 400)
    assert err["param"] == param
    assert "not supported" in err["message"] or "Unsupported" in err["message"]


def test_unknown_fields_are_ignored_and_allowed_values_pass(serve) -> None:
    client = serve()
    resp = client.post(
        "/v1/chat/completions",
        json={
            "messages": MSG,
            "max_tokens": 3,
            "some_future_field": {"x": 1},
            "user": "u-1",
            "metadata": {"a": "b"},
            "service_tier": "auto",
            "modalities": ["text"],
            "response_format": {"type": "text"},
            "store": False,
            "parallel_tool_calls": False,
        },
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"]["content"]


@pytest.mark.parametrize("raw", [b"{not json", b"", b"[1, 2]", b"\xff\xfe", b"null"])
def test_malformed_json_is_400(serve, raw) -> None:
    client = serve()
    err = _error(
        client.post(
            "/v1/chat/completions", content=raw, headers={"content-type": "application/json"}
        ),
        400,
    )
    assert err["code"] == "invalid_json"


def test_unknown_model_is_404(serve) -> None:
    client = serve()
    for path, body in (
        ("/v1/chat/completions", {"messages": MSG}),
        ("/v1/completions", {"prompt": "x"}),
    ):
        err = _error(client.post(path, json={**body, "model": "gpt-17"}), 404)
        assert err["param"] == "model" and err["code"] == "model_not_found"
    _error(client.get("/v1/models/gpt-17"), 404)
    assert client.get("/v1/models/fake-model").json()["id"] == "fake-model"


def test_embeddings_on_a_generation_server_are_400(serve) -> None:
    """The model is served for generation: /v1/embeddings says so (and the reverse is checked
    with a real embedding model in tallow-model-bert's tests)."""
    client = serve()
    err = _error(client.post("/v1/embeddings", json={"input": "hello"}), 400)
    assert err["param"] == "model" and err["code"] == "unsupported_task"
    assert "served for text generation" in err["message"] and "model.task" in err["message"]
    _error(client.post("/v1/embeddings", json={"input": "x", "model": "gpt-17"}), 404)
    assert client.get("/v1/models/fake-model").json()["task"] == "generate"


def test_prompt_longer_than_the_context_is_400(serve) -> None:
    client = serve(FakeEngine(max_model_len=64))
    err = _error(client.post("/v1/completions", json={"prompt": "x" * 100}), 400)
    assert err["param"] == "prompt" and err["code"] == "context_length_exceeded"
    err = _error(client.post("/v1/chat/completions", json={"messages": MSG}), 400)
    assert err["param"] == "messages" and "maximum context length is 64" in err["message"]
    # the prompt fits, but not with the completion asked for
    err = _error(client.post("/v1/completions", json={"prompt": "x" * 10, "max_tokens": 60}), 400)
    assert err["param"] == "max_tokens"


def test_engine_admission_error_is_400(serve) -> None:
    # The server's context check passes; the engine refuses at its door (its KV cache can
    # never hold the prompt), and that is the client's 400 too.
    client = serve(FakeEngine(max_model_len=4096, admit_limit=8))
    err = _error(client.post("/v1/completions", json={"prompt": "x" * 20, "max_tokens": 2}), 400)
    assert err["param"] == "prompt"


def test_api_key(serve) -> None:
    client = serve(api_keys=["k1", "k2"])
    body = {"messages": MSG, "max_tokens": 2}
    err = _error(client.post("/v1/chat/completions", json=body), 401)
    assert err["code"] == "invalid_api_key"
    _error(
        client.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer nope"}),
        401,
    )
    _error(
        client.post("/v1/chat/completions", json=body, headers={"Authorization": "Basic k1"}), 401
    )
    _error(client.get("/v1/models"), 401)
    _error(client.post("/tokenize", json={"prompt": "x"}), 401)
    assert (
        client.post(
            "/v1/chat/completions", json=body, headers={"Authorization": "Bearer k2"}
        ).status_code
        == 200
    )
    # health, version and metrics stay public
    for path in ("/health", "/version", "/metrics"):
        assert client.get(path).status_code == 200
    # the official client sends the key as a bearer token
    import openai

    assert openai_client(client, "k1").models.list().data[0].id == "fake-model"
    with pytest.raises(openai.AuthenticationError):
        openai_client(client, "wrong").models.list()


def test_oversized_body_is_413(serve) -> None:
    client = serve(max_body_bytes=1000)
    big = {"messages": [{"role": "user", "content": "x" * 2000}]}
    err = _error(client.post("/v1/chat/completions", json=big), 413)
    assert err["code"] == "request_too_large"
    # a chunked body (no Content-Length) is counted as it arrives
    chunks = iter([json.dumps(big).encode()[i : i + 300] for i in range(0, 2100, 300)])
    _error(
        client.post(
            "/v1/chat/completions", content=chunks, headers={"content-type": "application/json"}
        ),
        413,
    )
    assert (
        client.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 2}).status_code
        == 200
    )


def test_full_engine_queue_is_429(serve) -> None:
    client = serve(FakeEngine(max_waiting=0))
    resp = client.post("/v1/chat/completions", json={"messages": MSG})
    err = _error(resp, 429)
    assert err["code"] == "queue_full" and resp.headers["retry-after"] == "1"


def test_full_server_queue_is_503(serve) -> None:
    client = serve(max_queue=2)
    state = client.app.state.tallow
    state.inflight = 2  # two requests are being served
    resp = client.post("/v1/completions", json={"prompt": "x"})
    err = _error(resp, 503)
    assert err["code"] == "server_overloaded" and resp.headers["retry-after"] == "1"
    state.inflight = 1
    assert client.post("/v1/completions", json={"prompt": "x"}).status_code == 200
    assert state.inflight == 1  # the slot was given back


class _Exploding(FakeEngine):
    async def generate(self, *args: Any, **kwargs: Any):  # type: ignore[override]
        raise RuntimeError("secret-internal-detail in /srv/tallow/engine.py line 42")
        yield  # pragma: no cover


def test_internal_error_is_500_without_traceback(serve) -> None:
    client = serve(_Exploding())
    for path, body in (
        ("/v1/chat/completions", {"messages": MSG}),
        ("/v1/completions", {"prompt": "x", "stream": True}),
    ):
        resp = client.post(path, json=body)
        err = _error(resp, 500)
        assert "secret" not in resp.text and "Traceback" not in resp.text
        assert err["type"] == "server_error"


def test_unknown_path_and_method(serve) -> None:
    client = serve()
    assert _error(client.get("/v1/nothing"), 404)["code"] == "not_found"
    assert _error(client.get("/v1/chat/completions"), 405)["code"] == "method_not_allowed"


def test_errors_reach_the_official_client_typed(serve) -> None:
    import openai

    oc = openai_client(serve())
    with pytest.raises(openai.BadRequestError) as info:
        oc.chat.completions.create(model="fake-model", messages=MSG, temperature=-3)
    assert info.value.param == "temperature"
    with pytest.raises(openai.NotFoundError):
        oc.chat.completions.create(model="other", messages=MSG)
