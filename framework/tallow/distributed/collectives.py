"""The collectives of a tensor-parallel step, on the group of :mod:`tallow.distributed.state`.

The sharded layers call :func:`all_reduce` (after a row-parallel matmul, a vocabulary-parallel
lookup, a sharded norm's sum of squares), :func:`all_gather_last_dim` (the LM head's
vocabulary shards) and :func:`all_to_all` (expert-parallel MoE layers send tokens to the rank
of their expert and the results back). Every rank runs them in the same order; inside a
captured CUDA graph they are captured too (NCCL), so a replay runs them as recorded.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

from . import state


def _group() -> dist.ProcessGroup | None:
    current = state.current()
    if current is None:
        raise RuntimeError(
            "a tensor-parallel collective ran without a process group: a model "
            "built with tp_size > 1 must run under tallow.distributed"
        )
    return current.device_group


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum ``x`` over the ranks, in place; returns it."""
    dist.all_reduce(x, group=_group())
    return x


def all_gather_last_dim(x: torch.Tensor, world_size: int) -> torch.Tensor:
    """Each rank's ``x`` concatenated along the last dimension, in rank order."""
    parts = [torch.empty_like(x) for _ in range(world_size)]
    dist.all_gather(parts, x.contiguous(), group=_group())
    return torch.cat(parts, dim=-1)


def all_to_all(
    output: torch.Tensor,
    x: torch.Tensor,
    output_splits: list[int] | None = None,
    input_splits: list[int] | None = None,
) -> torch.Tensor:
    """Exchange rows (dimension 0) between the ranks: ``x``'s ``input_splits[r]`` rows (in
    order) go to rank ``r``, and ``output`` receives ``output_splits[r]`` rows from each rank
    ``r`` in rank order; without splits every rank sends and receives equal parts. NCCL and
    gloo both run it (``all_to_all_single``; gloo on CPU tensors, with unequal splits too).
    Returns ``output``."""
    dist.all_to_all_single(output, x.contiguous(), output_splits, input_splits, group=_group())
    return output


def broadcast_from_driver(x: torch.Tensor) -> torch.Tensor:
    """Rank 0's ``x`` on every rank, in place (sampled token ids, on the device)."""
    dist.broadcast(x, src=0, group=_group())
    return x


def agree(values: Sequence[float], op: str) -> list[float]:
    """``values`` (the same count on every rank) reduced over the ranks element-wise with
    ``op`` (``"min"`` or ``"max"``): start-up decisions that every rank must take alike (the KV
    cache's size from each one's free memory, which CUDA graph to replay from each one's
    timings)."""
    ops = {"min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}
    current = state.current()
    if current is None:
        return list(values)
    t = torch.tensor(list(values), dtype=torch.float64, device=current.device)
    dist.all_reduce(t, op=ops[op], group=current.device_group)
    return t.tolist()
