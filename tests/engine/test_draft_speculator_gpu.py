"""The draft speculator on a GPU: the draft runner's decode forwards replay its own CUDA graphs,
verify steps run eagerly, greedy tokens equal those of the plain engine (the target as its own
draft, and a sliding-window draft of the same synthetic vocabulary), and every block of both
caches comes back. Runs only where CUDA is available."""

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
            # float32: verify rows and decode rows agree on near ties, as bfloat16 may not
            "dtype": "float32",
            "device": "cuda",
            "max_model_len": 512,
        },
        "cache": {"num_blocks": 512, "block_size": 16},
        "runner": {"disable_cuda_graph": False, "max_cuda_graph_batch": 32},
        "scheduler": {"max_num_seqs": 32, "prefill_chunk_size": 32},
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


@pytest.mark.parametrize("draft", ["random:tiny-llama", "random:tiny-mistral"])
def test_greedy_tokens_equal_the_plain_engine(draft: str) -> None:
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 500, (n,), generator=g).tolist() for n in (3, 12, 31, 70, 9, 16)]
    want = run(engine(None), prompts)
    eng = engine(
        {
            "method": "draft",
            "draft_model": draft,
            "num_speculative_tokens": 4,
            "draft_kv_cache_mb": 64,
        },
    )
    spec = eng.core.spec
    draft_runner = spec.speculator.draft
    assert draft_runner.runner.graphs is not None  # the draft's decode forwards replay graphs
    assert run(eng, prompts) == want
    assert spec.num_proposals > 0
    if draft == "random:tiny-llama":  # the same weights: every guess is kept
        assert spec.acceptance_rate > 0.9
    bm = eng.core.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_total_blocks
    assert draft_runner.num_sequences == 0
    assert draft_runner.blocks.num_free_blocks == draft_runner.blocks.num_total_blocks
