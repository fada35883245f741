"""CUDA graphs for decode steps: captured once per padded batch size, replayed every step.

Every input of a decode step lives in a persistent device buffer; a replay only copies this
step's values in. Graphs are captured with ``meta.max_seq_len = max_model_len`` so the attention
kernels' launch grids cover any context; the kernels read the true per-sequence lengths from
``seq_lens``. Padding rows have slot -1 (nothing stored) and length 1 (finite, discarded).
With several paged cache groups each group has its own persistent block tables and slots;
with state groups each has persistent state slots, padding rows naming the dummy slot.
Before every replay the attention backend's ``plan`` sees the graph's metadata with this
step's host lengths (``cuda_graph`` set), so a backend that schedules on the host refills its
own fixed buffers.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import torch

from tallow.distributed.collectives import agree
from tallow.layers import AttentionMetadata, forward_context
from tallow.plugin import AttentionBackend

from .model_runner import ModelRunner

log = logging.getLogger("tallow.engine")


def graph_batch_sizes(max_batch: int) -> list[int]:
    sizes = [1, 2, 4, 8] + list(range(16, max_batch + 1, 16))
    return sorted({s for s in sizes if s <= max_batch} | {max_batch})


#: a larger graph replaces a smaller one only when it replays at least this much faster
REPLAY_MARGIN = 0.03


def fastest_graphs(replay_s: dict[int, float], margin: float = REPLAY_MARGIN) -> dict[int, int]:
    """For each captured batch size, the captured size (itself or larger) whose graph replays
    fastest; a larger one must be faster by ``margin`` (a fraction) to be chosen.

    The matrix products' library picks its kernels by shape, and a poor pick can make one
    padded size slower than the next (cuBLAS has such cliffs for llama-3-8b's decode GEMMs:
    ``bench/gpu/profile_decode.py gemm`` shows them, docs/benchmarks.md). Padding rows
    cost nothing in attention (length 1, no KV written), so a batch of 443 is better served
    by the 464 graph."""
    best: dict[int, int] = {}
    winner: int | None = None
    for size in sorted(replay_s, reverse=True):
        if winner is None or replay_s[winner] >= (1 - margin) * replay_s[size]:
            winner = size
        best[size] = winner
    return best


class CudaGraphRunner:
    def __init__(self, runner: ModelRunner, max_batch: int) -> None:
        self.runner = runner
        self.max_batch = max_batch
        dev = runner.device
        width = runner.max_blocks_per_seq
        self.input_ids = torch.zeros(max_batch, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(max_batch, dtype=torch.int64, device=dev)
        self.slot_mapping = torch.full((max_batch,), -1, dtype=torch.int64, device=dev)
        self.seq_lens = torch.ones(max_batch, dtype=torch.int32, device=dev)
        self.block_tables = torch.zeros(max_batch, width, dtype=torch.int32, device=dev)
        #: paged groups 1..: their block tables and slots (group 0's are the two above)
        num_groups = max(1, len(getattr(runner, "paged_groups", ())))
        self.group_tables = [
            torch.zeros(max_batch, width, dtype=torch.int32, device=dev)
            for _ in range(num_groups - 1)
        ]
        self.group_slots = [
            torch.full((max_batch,), -1, dtype=torch.int64, device=dev)
            for _ in range(num_groups - 1)
        ]
        #: per state group, each row's state slot (padding rows: the dummy slot)
        self.dummy_slot = runner.max_num_seqs
        self.state_slots = [
            torch.full((max_batch,), self.dummy_slot, dtype=torch.int64, device=dev)
            for _ in getattr(runner, "state_groups", ())
        ]
        self.query_start_loc = torch.arange(max_batch + 1, dtype=torch.int32, device=dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        #: the metadata each graph was captured with (its buffers; host lists of the capture)
        self.metas: dict[int, AttentionMetadata] = {}
        self.sizes = graph_batch_sizes(max_batch)
        self.pool: torch.cuda._POOL_HANDLE | None = None
        #: captured size -> the captured size replayed for it (see fastest_graphs)
        self.replay_size: dict[int, int] = {}
        #: whether the backend prepares steps on the host (its own ``plan``, not the default)
        self.backend_plans = (
            getattr(type(runner.backend), "plan", AttentionBackend.plan)
            is not AttentionBackend.plan
        )

    def _meta(self, bs: int) -> AttentionMetadata:
        r = self.runner
        meta = AttentionMetadata(
            num_seqs=bs,
            num_tokens=bs,
            query_start_loc=self.query_start_loc[: bs + 1],
            seq_lens=self.seq_lens[:bs],
            block_tables=self.block_tables[:bs],
            slot_mapping=self.slot_mapping[:bs],
            max_query_len=1,
            max_seq_len=r.max_model_len,
            block_size=r.block_size,
            query_start_loc_cpu=list(range(bs + 1)),
            seq_lens_cpu=[1] * bs,
            cuda_graph=True,
        )
        if self.group_tables:
            meta.group_views = [meta] + [
                dataclasses.replace(meta, block_tables=table[:bs], slot_mapping=slots[:bs])
                for table, slots in zip(self.group_tables, self.group_slots)
            ]
        meta.state_slots = [slots[:bs] for slots in self.state_slots]
        return meta

    @classmethod
    @torch.inference_mode()
    def capture(cls, runner: ModelRunner, max_batch: int) -> "CudaGraphRunner":
        max_batch = max(1, min(max_batch, runner.max_num_seqs))
        self = cls(runner, max_batch)
        started = time.perf_counter()
        free_before = torch.cuda.mem_get_info(runner.device)[0]
        for bs in reversed(self.sizes):
            meta = self.metas[bs] = self._meta(bs)
            with forward_context(meta, runner.backend):
                for _ in range(2):  # warm up: Triton compiles, allocator settles
                    runner.model(self.input_ids[:bs], self.positions[:bs])
                torch.cuda.synchronize(runner.device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool):
                    out = runner.model(self.input_ids[:bs], self.positions[:bs])
            if self.pool is None:
                self.pool = graph.pool()
            self.graphs[bs] = graph
            self.outputs[bs] = out
        torch.cuda.synchronize(runner.device)
        used = free_before - torch.cuda.mem_get_info(runner.device)[0]
        times = self._agreed(self._time_replays())
        self.replay_size = fastest_graphs(times)
        for size, other in self.replay_size.items():
            if other != size:
                log.info(
                    "decode batches padded to %d replay the %d graph (%.2f ms, not %.2f)",
                    size,
                    other,
                    times[other] * 1e3,
                    times[size] * 1e3,
                )
        log.info(
            "captured %d CUDA graphs (batch ≤ %d) in %.1fs, %.0f MiB",
            len(self.graphs),
            max_batch,
            time.perf_counter() - started,
            used / 2**20,
        )
        return self

    @staticmethod
    def _agreed(times: dict[int, float]) -> dict[int, float]:
        """Under tensor parallelism, each size's slowest time over the ranks: every rank
        must replay the same graph for a batch (their collectives pair up)."""
        sizes = sorted(times)
        return dict(zip(sizes, agree([times[s] for s in sizes], "max")))

    def _time_replays(self, repeats: int = 3) -> dict[int, float]:
        """Seconds per replay of each graph with every row padding (no KV written)."""
        self.slot_mapping.fill_(-1)
        self.seq_lens.fill_(1)
        for slots in self.group_slots:
            slots.fill_(-1)
        for slots in self.state_slots:
            slots.fill_(self.dummy_slot)
        times = {}
        for size, graph in self.graphs.items():
            self._plan(self.metas[size])
            graph.replay()  # first replay: uploads the graph
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(repeats):
                graph.replay()
            end.record()
            end.synchronize()
            times[size] = start.elapsed_time(end) / 1e3 / repeats
        return times

    def run(
        self, ids: torch.Tensor, pos: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor | None:
        """Replay the graph for this decode batch; None if it does not fit a captured size."""
        bs = meta.num_seqs
        if bs > self.max_batch:
            return None
        size = next(s for s in self.sizes if s >= bs)
        size = self.replay_size.get(size, size)
        self.input_ids[:bs].copy_(ids, non_blocking=True)
        self.positions[:bs].copy_(pos, non_blocking=True)
        self.slot_mapping[:bs].copy_(meta.slot_mapping, non_blocking=True)
        self.seq_lens[:bs].copy_(meta.seq_lens, non_blocking=True)
        width = meta.block_tables.shape[1]
        self.block_tables[:bs, :width].copy_(meta.block_tables, non_blocking=True)
        for g, (table, slots) in enumerate(zip(self.group_tables, self.group_slots), start=1):
            view = meta.group(g)
            table[:bs, :width].copy_(view.block_tables, non_blocking=True)
            slots[:bs].copy_(view.slot_mapping, non_blocking=True)
            if size > bs:
                slots[bs:size].fill_(-1)
        for buffer, slots in zip(self.state_slots, meta.state_slots):
            buffer[:bs].copy_(slots, non_blocking=True)
            if size > bs:
                buffer[bs:size].fill_(self.dummy_slot)
        if size > bs:
            self.slot_mapping[bs:size].fill_(-1)
            self.seq_lens[bs:size].fill_(1)
        if self.backend_plans:
            lens = meta.seq_lens_cpu if meta.seq_lens_cpu is not None else meta.seq_lens.tolist()
            self._plan(
                dataclasses.replace(
                    self.metas[size],
                    max_seq_len=meta.max_seq_len,
                    seq_lens_cpu=list(lens) + [1] * (size - bs),
                )
            )
        self.graphs[size].replay()
        return self.outputs[size][:bs]

    def _plan(self, meta: AttentionMetadata) -> None:
        """The backend's per-step preparation for a replay of the graph ``meta`` belongs to
        (see :meth:`tallow.plugin.AttentionBackend.plan`)."""
        if self.backend_plans:
            self.runner.backend.plan(meta)
