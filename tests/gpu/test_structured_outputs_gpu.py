"""Structured outputs on a GPU: the mask kernel and the masks filled while the forward runs,
under CUDA graphs and async scheduling. A random-weight model with a synthetic byte-level
vocabulary writes whatever its grammar allows; every output must validate, end by its grammar,
and be the same with and without CUDA graphs and async scheduling."""

from __future__ import annotations

import json

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from tallow.engine.llm_engine import LLMEngine  # noqa: E402
from tallow import SamplingParams  # noqa: E402

SHAPE = "random:llama-3.2-1b"
SCHEMAS = [
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {
                "type": "array",
                "items": {"enum": ["a", "b", "c"]},
                "minItems": 1,
                "maxItems": 4,
            },
        },
        "required": ["name", "age", "tags"],
        "additionalProperties": False,
    },
    {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {
                "x": {"type": "integer", "minimum": -5, "maximum": 5},
                "ok": {"type": "boolean"},
            },
            "required": ["x", "ok"],
            "additionalProperties": False,
        },
        "minItems": 1,
        "maxItems": 3,
    },
]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    from tallow.bench.synthetic_vocab import write_tokenizer
    from tallow.engine.random_model import shape_config

    return write_tokenizer(tmp_path_factory.mktemp("vocab"), int(shape_config(SHAPE)["vocab_size"]))


def engine(tokenizer_dir, **settings) -> LLMEngine:
    from tallow.config import config_from_mapping

    scheduler = {"async_scheduling": settings.pop("async_scheduling", True)}
    return LLMEngine.from_config(
        config_from_mapping(
            {
                "model": {
                    "source": SHAPE,
                    "dtype": "bfloat16",
                    "device": "cuda",
                    "max_model_len": 2048,
                    "tokenizer": str(tokenizer_dir),
                },
                "cache": {"num_blocks": 2048},
                "runner": settings,
                "scheduler": scheduler,
                "plugins": {"settings": {"tallow-attention-triton": {"num_splits": 4}}},
            }
        )
    )


def run(eng: LLMEngine, n: int = 24) -> list:
    g = torch.Generator().manual_seed(0)
    ids = []
    for i in range(n):
        rid = eng.next_request_id()
        prompt = torch.randint(300, 120000, (5 + 7 * i,), generator=g).tolist()
        if _free(i):  # unconstrained rows beside the constrained ones: some rows get no mask
            params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
        else:
            params = SamplingParams(
                temperature=0.0, max_tokens=400, structured_outputs={"json": SCHEMAS[i % 2]}
            )
        eng.add_request(rid, prompt, params)
        ids.append(rid)
    done = {}
    while eng.has_unfinished():
        for out in eng.step():
            if out.finished:
                done[out.request_id] = out.outputs[0]
    return [done[r] for r in ids]


def _free(i: int) -> bool:
    return i % 6 == 5


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


@pytest.mark.parametrize(
    "backend",
    [
        "xgrammar",
        pytest.param(
            "llguidance",
            marks=pytest.mark.skipif(
                not (_installed("tallow_grammar_llguidance") and _installed("llguidance")),
                reason="needs the tallow-grammar-llguidance plugin and the llguidance package",
            ),
        ),
    ],
)
def test_constrained_outputs_on_the_gpu(tokenizer_dir, backend):
    import jsonschema

    graphs = engine(tokenizer_dir, grammar_backend=backend)
    assert graphs.parts.core.runner.graphs is not None
    outs = run(graphs)
    for i, out in enumerate(outs):
        if _free(i):
            assert out.finish_reason == "length" and len(out.token_ids) == 40
            continue
        assert out.finish_reason == "stop", out.text
        jsonschema.validate(json.loads(out.text), SCHEMAS[i % 2])
    stats = graphs.stats()
    assert stats["grammar_mask_steps_total"] > 0
    eager_sync = run(
        engine(
            tokenizer_dir, grammar_backend=backend, disable_cuda_graph=True, async_scheduling=False
        )
    )
    assert [o.token_ids for o in eager_sync] == [o.token_ids for o in outs]
