"""Expert parallelism: whole experts on each rank, tokens sent to their experts by all-to-all.

With ``parallel.enable_expert_parallel`` a :class:`~tallow.layers.FusedMoE` holds experts
``[r * E / ep, (r + 1) * E / ep)`` on rank ``r`` of the tensor-parallel group (the EP group is
the TP group) instead of ``I / tp`` of every expert. Attention stays tensor-parallel, so every
rank enters the MoE block with the same ``T`` tokens; each rank takes its contiguous share of
them (:func:`token_shard`: ``ceil(T / ep)`` rows, the last ranks fewer or none), routes them,
and :func:`dispatch_combine` runs their experts:

1. **dispatch**: every ``(token, slot)`` pair is sent to the rank that holds its expert, with
   its routing weight and the expert's local index (``all_to_all`` on the process group:
   ``all_to_all_single`` with split sizes, which NCCL and gloo both run);
2. each rank runs the pairs it received through its local experts, each pair a row of top-1
   routing (``tallow.kernels.fused_moe`` with local expert ids, the weight fused as usual);
3. **combine**: the weighted rows go back to the ranks that sent them, which add up each
   token's ``top_k`` rows in float32 in slot order (as the single-device kernel does).

The layer then writes its share into a zero ``[T, H]`` and the block's one all-reduce (which
also adds the tensor-parallel shared expert's partial sums) gives every rank every token.

Split sizes are data-dependent: the eager path exchanges each pair of ranks' counts first and
reads them on the host. Under CUDA-graph capture nothing may be read on the host, so the
exchange uses a fixed ``capacity`` of rows per pair of ranks (every pair a rank could send:
its token share times ``top_k``); unused rows carry weight zero and local expert 0, so they
add nothing, at the cost of computing them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from tallow.distributed import collectives

#: ``(x [N, H], weights float32 [N, 1], local expert ids int64 [N, 1]) -> [N, H]``: a rank's
#: own experts run on the rows it received
ExpertCompute = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class ExpertPlacement:
    """Which experts of a layer this rank holds: ``[start, start + num_local)``."""

    num_experts: int
    rank: int
    size: int

    def __post_init__(self) -> None:
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise ValueError(f"expert placement: rank {self.rank} of {self.size} ranks")
        if self.num_experts % self.size:
            raise ValueError(
                f"{self.num_experts} experts do not split evenly over "
                f"{self.size} expert-parallel ranks (the tensor-parallel size); "
                "turn parallel.enable_expert_parallel off or pick a "
                "tensor_parallel_size that divides the expert count"
            )

    @property
    def num_local(self) -> int:
        return self.num_experts // self.size

    @property
    def start(self) -> int:
        return self.rank * self.num_local

    def holds(self, expert: int) -> bool:
        return self.start <= expert < self.start + self.num_local


def token_shard(num_tokens: int, rank: int, size: int) -> tuple[int, int]:
    """Rows ``[start, end)`` of ``num_tokens`` replicated tokens that ``rank`` dispatches:
    contiguous shares of ``ceil(num_tokens / size)``; trailing ranks may get fewer or none."""
    chunk = -(-num_tokens // size)
    start = min(rank * chunk, num_tokens)
    return start, min(start + chunk, num_tokens)


def _exchange(
    x: torch.Tensor, rows: int, output_splits: list[int] | None, input_splits: list[int] | None
) -> torch.Tensor:
    out = x.new_empty((rows, *x.shape[1:]))
    return collectives.all_to_all(out, x, output_splits, input_splits)


def dispatch_combine(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    placement: ExpertPlacement,
    compute: ExpertCompute,
    *,
    capacity: int | None = None,
) -> torch.Tensor:
    """The routed-expert output ``[n, H]`` of this rank's tokens ``x [n, H]`` routed to global
    experts ``topk_ids [n, top_k]`` with ``topk_weights``, their experts spread over the ranks
    as ``placement`` says (see the module docstring). Every rank of the group must call it
    together, with its own tokens (``n`` may differ between ranks and be 0).

    ``capacity``: rows sent to each rank, fixed (CUDA-graph safe: no host read), the same on
    every rank and at least ``n * top_k``; None sends exactly the pairs each rank's experts
    take (the counts are exchanged and read on the host first)."""
    if (
        x.dim() != 2
        or topk_ids.dim() != 2
        or topk_ids.shape != topk_weights.shape
        or topk_ids.shape[0] != x.shape[0]
    ):
        raise ValueError(
            f"dispatch_combine: expected x [n, H] and topk_ids / topk_weights "
            f"[n, top_k]; got {tuple(x.shape)}, {tuple(topk_ids.shape)}, "
            f"{tuple(topk_weights.shape)}"
        )
    n, top_k = topk_ids.shape
    size, local = placement.size, placement.num_local
    flat = topk_ids.reshape(-1).long()
    dest = torch.div(flat, local, rounding_mode="floor")
    order = torch.argsort(dest, stable=True)  # pairs grouped by the rank of their expert
    sorted_dest = dest[order]
    send_counts = torch.zeros(size, dtype=torch.int64, device=x.device)
    send_counts.scatter_add_(0, dest, torch.ones_like(dest))
    rows = x[torch.div(order, top_k, rounding_mode="floor")]
    meta = torch.stack(
        [topk_weights.reshape(-1)[order].float(), (flat[order] - sorted_dest * local).float()],
        dim=1,
    )
    if capacity is None:
        recv_counts = _exchange(send_counts, size, None, None)
        sent, received = send_counts.tolist(), recv_counts.tolist()
        recv_x = _exchange(rows, sum(received), received, sent)
        recv_meta = _exchange(meta, sum(received), received, sent)
    else:
        if n * top_k > capacity:
            raise ValueError(
                f"dispatch_combine: {n} tokens x top_k {top_k} exceed the "
                f"capacity of {capacity} rows per rank"
            )
        # pair i of the rows for rank d goes to row d * capacity + i of the send buffer
        first = torch.cumsum(send_counts, 0) - send_counts
        slot = (
            sorted_dest * capacity + torch.arange(n * top_k, device=x.device) - first[sorted_dest]
        )
        padded_x = x.new_zeros(size * capacity, x.shape[1])
        padded_x[slot] = rows
        padded_meta = meta.new_zeros(size * capacity, 2)  # weight 0, local expert 0
        padded_meta[slot] = meta
        recv_x = _exchange(padded_x, size * capacity, None, None)
        recv_meta = _exchange(padded_meta, size * capacity, None, None)
    if recv_x.shape[0]:
        y = compute(recv_x, recv_meta[:, :1], recv_meta[:, 1:].long())
    else:  # nothing for this rank's experts (it still takes part in the exchanges)
        y = recv_x
    if capacity is None:
        back = _exchange(y, n * top_k, sent, received)
    else:
        back = _exchange(y, size * capacity, None, None)[slot]
    out_k = torch.empty_like(back)
    out_k[order] = back
    return out_k.view(n, top_k, x.shape[1]).float().sum(1).to(x.dtype)
