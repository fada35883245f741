"""The test model with a recurrent-state layer (tests/engine/state_model.py) on a GPU: decode
steps replayed from CUDA graphs (state slots in the graphs' persistent buffers, padding rows on
the dummy slot) give the tokens of eager execution, and the slots are balanced at the end."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).parents[1] / "engine"))
from state_model import StateModel, build_core, run_to_end  # noqa: E402

from tallow import SamplingParams  # noqa: E402

PROMPTS = {
    "a": [3, 17, 5, 9, 33, 2, 8, 41, 7, 7, 12],
    "b": [60, 1],
    "c": [25],
    "d": [(5 * i + 1) % 64 for i in range(23)],
    "e": [9] * 7,
}


def core_on_gpu(graphs: bool, async_scheduling: bool):
    from tallow.engine.cuda_graphs import CudaGraphRunner
    from tallow_attention_triton.backend import TritonAttentionBackend

    core = build_core(
        StateModel(seed=1),
        device="cuda",
        block_size=16,
        num_blocks=64,
        max_num_seqs=8,
        max_num_batched_tokens=64,
        backend=TritonAttentionBackend(None),
        async_scheduling=async_scheduling,
    )
    if graphs:
        runner = core.runner
        runner.graphs = CudaGraphRunner.capture(runner, 8)
        replay = runner.graphs.run
        core.replays = 0

        def counted(*args):
            hidden = replay(*args)
            core.replays += hidden is not None
            return hidden

        runner.graphs.run = counted
    return core


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_graph_replays_equal_eager(async_scheduling):
    params = SamplingParams(temperature=0.0, max_tokens=16)
    requests = {rid: (p, params) for rid, p in PROMPTS.items()}
    eager = core_on_gpu(graphs=False, async_scheduling=async_scheduling)
    expected = run_to_end(eager, requests)
    graphed = core_on_gpu(graphs=True, async_scheduling=async_scheduling)
    got = run_to_end(graphed, requests, abort_after={"e": 4})
    assert graphed.replays > 0
    for rid in ("a", "b", "c", "d"):
        assert got[rid] == expected[rid], rid
    assert got["e"][0] == expected["e"][0][: len(got["e"][0])]
    for core in (eager, graphed):
        manager = core.scheduler.block_manager
        manager.check_invariants()
        assert manager.num_free_state_slots() == manager.states[0].num_slots
        assert manager.num_free_blocks == manager.num_total_blocks
