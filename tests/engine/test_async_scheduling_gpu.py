"""Async scheduling on a GPU with CUDA graphs: the same greedy tokens as the sync engine.

On the GPU the sampled ids of step N really are still on the device when step N+1 is
launched; decode-only steps replay CUDA graphs, which copy the (patched) input ids into their
static buffers. Runs only where CUDA is available.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from tallow.engine.llm_engine import LLMEngine  # noqa: E402
from tallow import SamplingParams  # noqa: E402


def engine(async_scheduling: bool) -> LLMEngine:
    from tallow.config import config_from_mapping

    return LLMEngine.from_config(
        config_from_mapping(
            {
                "model": {
                    "source": "random:tiny-llama",
                    "dtype": "float32",
                    "device": "cuda",
                    "max_model_len": 512,
                },
                "cache": {"num_blocks": 512, "block_size": 16},
                "runner": {"disable_cuda_graph": False, "max_cuda_graph_batch": 32},
                "scheduler": {
                    "async_scheduling": async_scheduling,
                    "max_num_seqs": 32,
                    "prefill_chunk_size": 32,
                },
                "plugins": {"settings": {"tallow-attention-triton": {"num_splits": 4}}},
            }
        )
    )


def workload() -> list[tuple[int, list[int], SamplingParams]]:
    """(arrival step, prompt, params): prompts of many lengths, some arriving mid-decode."""
    g = torch.Generator().manual_seed(0)
    jobs = []
    for i, length in enumerate([5, 17, 64, 3, 130, 33, 9, 90, 1, 48, 20, 75]):
        prompt = torch.randint(10, 500, (length,), generator=g).tolist()
        params = SamplingParams(
            temperature=0.0,
            max_tokens=8 + 3 * i,
            ignore_eos=True,
            stop_token_ids=[17, 101] if i % 4 == 3 else [],
        )
        jobs.append((0 if i < 6 else 4 + 2 * i, prompt, params))
    return jobs


def run(eng: LLMEngine) -> list[list[int]]:
    jobs = workload()
    ids: list[str] = []
    done: dict[str, list[int]] = {}
    step = 0
    while len(ids) < len(jobs) or eng.has_unfinished():
        for arrival, prompt, params in jobs:
            if arrival == step:
                ids.append(eng.next_request_id())
                eng.add_request(ids[-1], prompt, params)
        for out in eng.step():
            if out.finished:
                done[out.request_id] = out.outputs[0].token_ids
        step += 1
    return [done[r] for r in ids]


def test_async_scheduling_with_cuda_graphs_gives_the_sync_tokens():
    sync, asyn = engine(False), engine(True)
    asyn.parts.loaded.model.load_state_dict(sync.parts.loaded.model.state_dict())
    graphs = asyn.core.runner.graphs
    assert graphs is not None and sync.core.runner.graphs is not None
    replays = 0
    replay = graphs.run

    def counting_run(*args, **kwargs):
        nonlocal replays
        hidden = replay(*args, **kwargs)
        replays += hidden is not None
        return hidden

    graphs.run = counting_run
    expected = run(sync)
    got = run(asyn)
    assert got == expected
    assert replays > 0  # decode steps fed on the device replayed CUDA graphs
    core = asyn.core
    assert core.overlapped_steps > 0.8 * core.steps
    bm = core.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_total_blocks
