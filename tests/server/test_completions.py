"""Text completions over the fake engine, and the small endpoints (models, tokenize, ...)."""

from __future__ import annotations

import json

from server_helpers import chunks_of, openai_client


def test_prompt_forms_and_choice_numbering(serve) -> None:
    client = serve()
    tok = client.engine.tokenizer
    body = client.post(
        "/v1/completions", json={"prompt": ["ab", "cde"], "n": 2, "max_tokens": 3}
    ).json()
    assert body["id"].startswith("cmpl-") and body["object"] == "text_completion"
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert all(c["text"] == "Hel" and c["finish_reason"] == "length" for c in body["choices"])
    assert body["usage"]["prompt_tokens"] == 5 and body["usage"]["completion_tokens"] == 12
    prompts = [r["prompt_token_ids"] for r in client.engine.requests]
    assert prompts == [tok.encode("ab"), tok.encode("cde")]
    # token ids, one prompt and several
    client.post("/v1/completions", json={"prompt": [104, 105]})
    assert client.engine.requests[-1]["prompt_token_ids"] == [104, 105]
    assert client.engine.requests[-1]["prompt"] == "hi"
    assert client.engine.requests[-1]["params"].max_tokens == 16  # OpenAI's default
    body = client.post(
        "/v1/completions", json={"prompt": [[104], [105, 106]], "max_tokens": 1}
    ).json()
    assert len(body["choices"]) == 2


def test_echo_and_logprobs(serve) -> None:
    client = serve()
    body = client.post(
        "/v1/completions", json={"prompt": "abc", "max_tokens": 2, "echo": True, "logprobs": 2}
    ).json()
    (choice,) = body["choices"]
    assert choice["text"] == "abcHe"
    lp = choice["logprobs"]
    assert lp["tokens"] == ["a", "b", "c", "H", "e"]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["token_logprobs"][1:] == [-0.25] * 4
    assert lp["text_offset"] == [0, 1, 2, 3, 4]
    assert all(len(t) == 2 for t in lp["top_logprobs"][1:])
    p = client.engine.requests[-1]["params"]
    assert p.logprobs == 2 and p.prompt_logprobs == 2


def test_scoring_a_prompt_with_max_tokens_zero(serve) -> None:
    client = serve()
    body = client.post(
        "/v1/completions", json={"prompt": "abc", "max_tokens": 0, "echo": True, "logprobs": 0}
    ).json()
    (choice,) = body["choices"]
    assert choice["text"] == "abc" and choice["finish_reason"] == "length"
    assert choice["logprobs"]["tokens"] == ["a", "b", "c"]
    assert body["usage"]["completion_tokens"] == 0


def test_stream(serve) -> None:
    client = serve()
    chunks = chunks_of(
        client.post(
            "/v1/completions",
            json={
                "prompt": "abc",
                "max_tokens": 4,
                "stream": True,
                "echo": True,
                "logprobs": 1,
                "stream_options": {"include_usage": True},
            },
        )
    )
    *body, last = chunks
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 4
    for c in body:
        assert c["object"] == "text_completion" and c["usage"] is None
    assert "".join(c["choices"][0]["text"] for c in body) == "abcHell"
    assert body[-1]["choices"][0]["finish_reason"] == "length"
    offsets = [
        o
        for c in body
        if c["choices"][0]["logprobs"]
        for o in c["choices"][0]["logprobs"]["text_offset"]
    ]
    assert offsets == list(range(7))


def test_stream_several_prompts(serve) -> None:
    client = serve()
    chunks = chunks_of(
        client.post(
            "/v1/completions", json={"prompt": ["a", "b"], "n": 2, "max_tokens": 3, "stream": True}
        )
    )
    texts: dict[int, str] = {}
    finished = set()
    for c in chunks:
        (choice,) = c["choices"]
        texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
        if choice["finish_reason"]:
            finished.add(choice["index"])
    assert texts == {i: "Hel" for i in range(4)} and finished == {0, 1, 2, 3}


def test_official_client(serve) -> None:
    oc = openai_client(serve())
    resp = oc.completions.create(model="fake-model", prompt="x", max_tokens=5, stop=["l"])
    assert resp.choices[0].text == "He" and resp.choices[0].finish_reason == "stop"
    text = "".join(
        c.choices[0].text
        for c in oc.completions.create(model="fake-model", prompt="x", max_tokens=5, stream=True)
        if c.choices
    )
    assert text == "Hello"


def test_models_version_health_plugins(serve) -> None:
    client = serve()
    models = client.get("/v1/models").json()
    assert models["object"] == "list"
    (card,) = models["data"]
    assert card["id"] == "fake-model" and card["object"] == "model"
    assert card["owned_by"] == "tallow" and card["max_model_len"] == 4096
    import tallow

    assert client.get("/version").json() == {"version": tallow.__version__}
    health = client.get("/health").json()
    assert health["status"] == "ok"
    assert health["num_free_blocks"] == health["num_total_blocks"] == 2048
    plugins = client.get("/v1/plugins").json()
    names = {p["name"] for p in plugins["plugins"]}
    assert "tallow" in names and "tallow-tool-hermes" in names
    assert all(p["status"] in ("ok", "failed", "disabled") for p in plugins["plugins"])
    assert "hermes" in {e["name"] for e in plugins["components"]["tool_parser"]}
    assert plugins["selected"]["tool_parser"] == "hermes"  # from the Qwen template


def test_health_reports_a_failed_engine(serve) -> None:
    client = serve()
    client.engine.error = RuntimeError("device lost")
    resp = client.get("/health")
    assert resp.status_code == 503 and "device lost" in resp.json()["error"]


def test_tokenize_detokenize(serve) -> None:
    client = serve()
    tok = client.engine.tokenizer
    body = client.post("/tokenize", json={"prompt": "héllo"}).json()
    assert body["tokens"] == tok.encode("héllo") and body["count"] == 6
    assert body["max_model_len"] == 4096
    chat = client.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    text = tok.decode(chat["tokens"], skip_special_tokens=False)
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    back = client.post("/detokenize", json={"tokens": body["tokens"]}).json()
    assert back == {"prompt": "héllo"}
    bad = client.post("/detokenize", json={"tokens": [1, 100000]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens[1]"
    both = client.post("/tokenize", json={"prompt": "x", "messages": []})
    assert both.status_code == 400
    assert (
        json.loads(client.post("/tokenize", json={"prompt": 3}).text)["error"]["param"] == "prompt"
    )
