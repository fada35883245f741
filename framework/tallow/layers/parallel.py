"""Tensor-parallel arithmetic and collectives shared by the sharded layers.

Layers know their ``tp_rank``/``tp_size`` from the :class:`~tallow.layers.model.BuildContext`
(the engine's loader fills them from :mod:`tallow.distributed.state`). With ``tp_size == 1``
every collective here is the identity, so a single-device model never touches
``torch.distributed``; with more ranks they run on the group that :mod:`tallow.distributed`
started before the model was built (:mod:`tallow.distributed.collectives`).
"""

from __future__ import annotations

import torch

from tallow.distributed import collectives


def divide(numerator: int, denominator: int, what: str = "size") -> int:
    """``numerator / denominator``, refusing a remainder (shards must be equal)."""
    if numerator % denominator:
        raise ValueError(
            f"{what} {numerator} is not divisible by the tensor-parallel size {denominator}"
        )
    return numerator // denominator


def all_reduce(x: torch.Tensor, tp_size: int) -> torch.Tensor:
    """Sum ``x`` over the tensor-parallel ranks (identity when ``tp_size`` is 1)."""
    if tp_size == 1:
        return x
    return collectives.all_reduce(x)


def all_gather_last_dim(x: torch.Tensor, tp_size: int) -> torch.Tensor:
    """Concatenate each rank's ``x`` along the last dimension, in rank order."""
    if tp_size == 1:
        return x
    return collectives.all_gather_last_dim(x, tp_size)
