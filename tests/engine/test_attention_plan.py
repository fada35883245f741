"""The attention backend's per-step ``plan``: called once before the layers of every forward,
and before every CUDA-graph replay with the graph's buffers and the padded batch's host
lengths (the capture itself is tested on a GPU in tests/gpu)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from tallow.engine.cuda_graphs import CudaGraphRunner
from tallow.layers import AttentionMetadata, forward_context
from tallow.plugin import AttentionBackend


class Recorder(AttentionBackend):
    name = "recorder"

    def __init__(self, events: list) -> None:
        self.events = events

    def plan(self, meta: AttentionMetadata) -> None:
        self.events.append(("plan", meta))


def test_forward_context_plans_the_step_before_any_layer() -> None:
    events: list = []
    meta = SimpleNamespace()
    with forward_context(meta, Recorder(events)):
        events.append("layers")
    assert events == [("plan", meta), "layers"]
    with forward_context(meta, object()):  # a backend without plan is fine
        pass


class FakeGraph:
    def __init__(self, events: list) -> None:
        self.events = events

    def replay(self) -> None:
        self.events.append("replay")


def graph_runner(backend: object) -> CudaGraphRunner:
    runner = SimpleNamespace(
        device=torch.device("cpu"),
        max_blocks_per_seq=4,
        max_num_seqs=8,
        max_model_len=64,
        block_size=16,
        backend=backend,
    )
    graphs = CudaGraphRunner(runner, 4)
    events = getattr(backend, "events", [])
    for size in graphs.sizes:
        graphs.metas[size] = graphs._meta(size)
        graphs.graphs[size] = FakeGraph(events)  # type: ignore[assignment]
        graphs.outputs[size] = torch.zeros(size, 3)
    return graphs


def decode_meta() -> AttentionMetadata:
    return AttentionMetadata(
        num_seqs=3,
        num_tokens=3,
        query_start_loc=torch.arange(4, dtype=torch.int32),
        seq_lens=torch.tensor([5, 9, 2], dtype=torch.int32),
        block_tables=torch.tensor([[3, 0], [1, 2], [7, 0]], dtype=torch.int32),
        slot_mapping=torch.tensor([52, 40, 113]),
        max_query_len=1,
        max_seq_len=9,
        block_size=16,
        query_start_loc_cpu=[0, 1, 2, 3],
        seq_lens_cpu=[5, 9, 2],
    )


def test_a_replay_is_planned_with_the_graph_buffers_and_padded_lengths() -> None:
    events: list = []
    graphs = graph_runner(Recorder(events))
    assert graphs.sizes == [1, 2, 4]
    out = graphs.run(torch.tensor([1, 2, 3]), torch.tensor([4, 8, 1]), decode_meta())
    assert out.shape == (3, 3)
    assert [e if e == "replay" else e[0] for e in events] == ["plan", "replay"]
    planned = events[0][1]
    assert planned.cuda_graph and planned.num_seqs == 4
    assert planned.seq_lens_cpu == [5, 9, 2, 1] and planned.query_start_loc_cpu == [0, 1, 2, 3, 4]
    assert planned.max_seq_len == 9
    # its tensors are the graph's buffers, already holding this step (padding: length 1)
    assert planned.seq_lens.data_ptr() == graphs.seq_lens.data_ptr()
    assert planned.seq_lens.tolist() == [5, 9, 2, 1]
    assert planned.block_tables[:3, :2].tolist() == [[3, 0], [1, 2], [7, 0]]
    assert planned.slot_mapping.tolist() == [52, 40, 113, -1]


def test_graph_metadata_describes_the_capture_batch() -> None:
    meta = graph_runner(Recorder([]))._meta(2)
    assert meta.cuda_graph and meta.seq_lens_cpu == [1, 1]
    assert meta.query_start_loc_cpu == [0, 1, 2] and meta.max_seq_len == 64


def test_backends_without_a_plan_of_their_own_cost_nothing_per_replay() -> None:
    class Plain(AttentionBackend):
        name = "plain"

    graphs = graph_runner(Plain())
    assert not graphs.backend_plans
    graphs.run(torch.tensor([1, 2, 3]), torch.tensor([4, 8, 1]), decode_meta())
