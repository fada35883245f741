"""Speculative decoding on a GPU: decode steps replay CUDA graphs, verify steps (several tokens
per sequence) run eagerly; greedy tokens equal those of the plain engine, and every block comes
back. Runs only where CUDA is available."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from tallow import SamplingParams  # noqa: E402
from tallow.config import config_from_mapping  # noqa: E402
from tallow.engine.llm_engine import LLMEngine  # noqa: E402


def engine(speculative: dict | None) -> LLMEngine:
    mapping = {
        "model": {
            "source": "random:tiny-llama",
            "dtype": "float32",
            "device": "cuda",
            "max_model_len": 512,
        },
        "cache": {"num_blocks": 512, "block_size": 16},
        "runner": {"disable_cuda_graph": False, "max_cuda_graph_batch": 32},
        "scheduler": {"max_num_seqs": 32, "prefill_chunk_size": 32},
        "plugins": {"settings": {"tallow-attention-triton": {"num_splits": 4}}},
    }
    if speculative:
        mapping["speculative"] = speculative
    return LLMEngine.from_config(config_from_mapping(mapping))


def run(eng: LLMEngine, prompts: list[list[int]]) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    for i, p in enumerate(prompts):
        eng.add_request(f"r{i}", p, params, stream=False)
    done: dict[str, list[int]] = {}
    while eng.has_unfinished():
        for out in eng.step():
            if out.finished:
                done[out.request_id] = out.outputs[0].token_ids
    return [done[f"r{i}"] for i in range(len(prompts))]


@pytest.mark.parametrize("k", [2, 5])
def test_greedy_tokens_equal_the_plain_engine(k: int) -> None:
    g = torch.Generator().manual_seed(0)
    # repetitive prompts, so prompt lookup proposes often
    prompts = [
        (torch.randint(10, 500, (n,), generator=g).tolist() * 4)[: 4 * n]
        for n in (3, 7, 12, 20, 31, 5, 9, 16)
    ]
    want = run(engine(None), prompts)
    eng = engine({"method": "ngram", "num_speculative_tokens": k})
    assert eng.core.runner.graphs is not None  # decode steps still replay graphs
    assert run(eng, prompts) == want
    stats = eng.core.stats()
    assert stats["spec_num_proposals"] > 0
    bm = eng.core.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_total_blocks
