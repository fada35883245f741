"""Sliding-window cache groups on a GPU (Triton attention, CUDA graphs): blocks outside the
window are given back while sequences run, the null block stands in their table entries, and
decode steps replayed from graphs (every group's tables in the graphs' buffers) give the tokens
of eager execution and of an engine that keeps every block."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from tallow.engine.llm_engine import LLMEngine  # noqa: E402
from tallow import SamplingParams  # noqa: E402
from tallow.plugin.testing.engine import replay_own_graph_sizes  # noqa: E402


def engine(model: str, dtype: str, *, graphs: bool, max_model_len: int) -> LLMEngine:
    from tallow.config import config_from_mapping

    return LLMEngine.from_config(
        config_from_mapping(
            {
                "model": {
                    "source": model,
                    "dtype": dtype,
                    "device": "cuda",
                    "max_model_len": max_model_len,
                    "seed": 0,
                },
                "cache": {"num_blocks": 1024},
                "runner": {"disable_cuda_graph": not graphs, "attention_backend": "triton"},
                "scheduler": {"max_num_batched_tokens": 512, "prefill_chunk_size": 512},
                "plugins": {"settings": {"tallow-attention-triton": {"num_splits": 4}}},
            }
        )
    )


def run(eng: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    ids = []
    for p in prompts:
        rid = eng.next_request_id()
        eng.add_request(rid, p, params)
        ids.append(rid)
    done = {}
    while eng.has_unfinished():
        for out in eng.step():
            if out.finished:
                done[out.request_id] = out.outputs[0].token_ids
    return [done[r] for r in ids]


def prompts(lengths: list[int], vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(10, vocab, (n,), generator=g).tolist() for n in lengths]


# max_model_len: within the positions each model's rotary embedding covers (tiny-mistral's
# max_position_embeddings is 2048) and past the longest prompt plus its 48 tokens
@pytest.mark.parametrize(
    "model,dtype,lengths,vocab,max_model_len",
    [
        ("random:tiny-mistral", "float32", [100, 250], 500, 2048),
        pytest.param(
            "random:gemma-3-4b", "bfloat16", [1500, 1100], 200000, 4096, marks=pytest.mark.gpu_alone
        ),
    ],
    ids=["mistral-window-24", "gemma3-window-1024"],
)
def test_graphs_equal_eager_and_blocks_are_given_back(model, dtype, lengths, vocab, max_model_len):
    graphed = engine(model, dtype, graphs=True, max_model_len=max_model_len)
    assert graphed.core.runner.graphs is not None
    manager = graphed.core.scheduler.block_manager
    sliding = [g for g in manager.groups if g.window is not None]
    assert sliding, "the model has a sliding-window group"
    eager = engine(model, dtype, graphs=False, max_model_len=max_model_len)
    eager.parts.loaded.model.load_state_dict(graphed.parts.loaded.model.state_dict())
    for group in eager.core.scheduler.block_manager.groups:  # the path that keeps them all
        group.release_outside_window = lambda seq, committed: 0
    replay_own_graph_sizes(graphed)  # two prompts: decode batches of 2 and 1, sizes captured
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    batch = prompts(lengths, vocab)
    most = {id(g): 0 for g in sliding}
    mark = manager.mark_computed

    def mark_and_count(seq, upto=None):
        mark(seq, upto)
        for g in sliding:
            table = seq.block_tables[g.group][: -(-upto // g.block_size)]  # committed
            most[id(g)] = max(most[id(g)], sum(1 for b in table if b != g.null_block))

    manager.mark_computed = mark_and_count
    assert run(graphed, batch, params) == run(eager, batch, params)
    for g in sliding:
        assert most[id(g)] <= -(-g.window // g.block_size) + 1
    assert manager.num_free_blocks == manager.num_total_blocks
    manager.check_invariants()
