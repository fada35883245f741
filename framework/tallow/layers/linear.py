"""Linear layers that know about quantization and tensor parallelism.

Every layer delegates storage and matmul to a :class:`~tallow.layers.linear_method.LinearMethod`
(chosen from ``BuildContext.quant``) and owns the one thing the method cannot know: how a
checkpoint tensor maps onto this rank's parameters.

- :class:`ReplicatedLinear`: the full weight on every rank.
- :class:`ColumnParallelLinear`: the output features split across ranks.
- :class:`MergedColumnParallelLinear`: several column-parallel projections stored as one
  (``gate_proj`` and ``up_proj`` → ``gate_up_proj``); checkpoint tensors load by shard index.
- :class:`QKVParallelLinear`: q, k and v stored as one; checkpoint tensors load by ``"q"``,
  ``"k"``, ``"v"``. With fewer KV heads than ranks, KV heads are replicated.
- :class:`RowParallelLinear`: the input features split across ranks, partial results summed.

Each parameter carries ``weight_loader(param, loaded, shard_id=None)``: it slices ``loaded``
(the full checkpoint tensor, any dtype) for this rank, checks the shape, and copies it (converting
the dtype) into the right place. Merged parameters also carry ``shard_ids``, the shards a complete
load must provide.

A quantization method that stores weights in a layout of its own (and so brings its own
loader) asks the layer the same questions through ``checkpoint_shape(shard_id)`` (the full
checkpoint tensor expected for a shard) and ``weight_slices(shard_id)`` (which rows and columns
of it this rank's output partitions hold, as :class:`WeightSlice`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable

import torch
from torch import nn

from .linear_method import LinearMethod, WeightSlice, linear_method_for, set_weight_attrs
from .model import BuildContext
from .parallel import all_gather_last_dim, all_reduce, divide


@dataclass(frozen=True)
class _Partition:
    """One logical output block of a column-parallel layer, as one rank sees it."""

    shard_id: Hashable
    full_size: int  # features of this block in the checkpoint tensor
    rank_size: int  # features of this block held by one rank
    rank_index: int  # which slice of the checkpoint block this rank holds


def _copy_into(dst: torch.Tensor, src: torch.Tensor, what: str) -> None:
    if tuple(dst.shape) != tuple(src.shape):
        raise ValueError(
            f"{what}: checkpoint tensor has shape {tuple(src.shape)}, expected {tuple(dst.shape)}"
        )
    with torch.no_grad():
        dst.copy_(src)


def _scaled(value: int, extent: int, logical: int, what: str) -> int:
    """``value`` logical features expressed in a parameter dimension of ``extent`` for
    ``logical`` features (1:1 for dense weights, 1:group for grouped scales)."""
    if (value * extent) % logical:
        raise ValueError(
            f"{what}: a parameter extent of {extent} for {logical} features "
            f"cannot hold a boundary at feature {value}"
        )
    return value * extent // logical


class LinearBase(nn.Module):
    """What every linear layer shares: its method, its rank, and parameter bookkeeping."""

    bias: torch.Tensor | None

    def __init__(
        self,
        input_size: int,
        output_size: int,
        *,
        build: BuildContext | None = None,
        prefix: str = "",
        quant_method: LinearMethod | None = None,
    ) -> None:
        super().__init__()
        build = build if build is not None else BuildContext()
        self.input_size = input_size
        self.output_size = output_size
        self.tp_rank = build.tp_rank
        self.tp_size = build.tp_size
        self.prefix = prefix
        self.params_dtype = build.dtype
        self.quant_method = quant_method or linear_method_for(build.quant, prefix)
        self._device = build.device

    def _create(self, input_per_rank: int, output_sizes: list[int], bias: bool) -> None:
        self.quant_method.create_weights(
            self, input_per_rank, output_sizes, self.params_dtype, self._device
        )
        if bias:
            b = nn.Parameter(
                torch.zeros(sum(output_sizes), dtype=self.params_dtype, device=self._device),
                requires_grad=False,
            )
            set_weight_attrs(b, output_dim=0, input_dim=None)
            self.register_parameter("bias", b)
        else:
            self.register_parameter("bias", None)
        for param in self.parameters(recurse=False):
            if not hasattr(param, "weight_loader"):
                set_weight_attrs(param, weight_loader=self.weight_loader)

    def weight_loader(
        self, param: torch.Tensor, loaded: torch.Tensor, shard_id: Hashable | None = None
    ) -> None:
        raise NotImplementedError

    def checkpoint_shape(self, shard_id: Hashable | None = None) -> tuple[int, int]:
        """``(rows, cols)`` of the full checkpoint tensor that loads ``shard_id``."""
        raise NotImplementedError

    def weight_slices(self, shard_id: Hashable | None = None) -> list[WeightSlice]:
        """Where the checkpoint tensor of ``shard_id`` goes on this rank (see the module
        docstring)."""
        raise NotImplementedError

    def _no_shard(self, shard_id: Hashable | None) -> None:
        if shard_id is not None:
            raise ValueError(
                f"{self.prefix or type(self).__name__}: has no shards, got shard {shard_id!r}"
            )

    def extra_repr(self) -> str:
        return (
            f"in={self.input_size}, out={self.output_size}, tp={self.tp_rank}/{self.tp_size}, "
            f"bias={self.bias is not None}, method={type(self.quant_method).__name__}"
        )


class ReplicatedLinear(LinearBase):
    """``y = x W^T + b`` with the whole weight on every rank."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = False,
        *,
        build: BuildContext | None = None,
        prefix: str = "",
        quant_method: LinearMethod | None = None,
    ) -> None:
        super().__init__(
            input_size, output_size, build=build, prefix=prefix, quant_method=quant_method
        )
        self._create(input_size, [output_size], bias)

    def weight_loader(
        self, param: torch.Tensor, loaded: torch.Tensor, shard_id: Hashable | None = None
    ) -> None:
        if shard_id is not None:
            raise ValueError(
                f"{self.prefix or 'ReplicatedLinear'}: has no shards, got shard {shard_id!r}"
            )
        _copy_into(param.data, loaded, self.prefix or "ReplicatedLinear")

    def checkpoint_shape(self, shard_id: Hashable | None = None) -> tuple[int, int]:
        self._no_shard(shard_id)
        return self.output_size, self.input_size

    def weight_slices(self, shard_id: Hashable | None = None) -> list[WeightSlice]:
        self._no_shard(shard_id)
        return [WeightSlice(0, (0, self.output_size))]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.quant_method.apply(self, x, self.bias)


class ColumnParallelLinear(LinearBase):
    """Output features split across ranks: rank ``r`` holds rows ``r*n/tp:(r+1)*n/tp``.

    ``gather_output=True`` all-gathers the result so each rank sees every output feature.
    Subclasses describe several output blocks (:class:`MergedColumnParallelLinear`,
    :class:`QKVParallelLinear`) by overriding ``_partitions``.
    """

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = False,
        *,
        gather_output: bool = False,
        build: BuildContext | None = None,
        prefix: str = "",
        quant_method: LinearMethod | None = None,
    ) -> None:
        super().__init__(
            input_size, output_size, build=build, prefix=prefix, quant_method=quant_method
        )
        self.gather_output = gather_output
        self.partitions = self._partitions()
        self._create(input_size, [p.rank_size for p in self.partitions], bias)
        if len(self.partitions) > 1:
            for param in self.parameters(recurse=False):
                if getattr(param, "output_dim", None) is not None:
                    set_weight_attrs(param, shard_ids=tuple(p.shard_id for p in self.partitions))

    def _partitions(self) -> list[_Partition]:
        rank_size = divide(self.output_size, self.tp_size, f"{self.prefix} output size")
        return [_Partition(None, self.output_size, rank_size, self.tp_rank)]

    def _partition(self, shard_id: Hashable) -> int:
        for i, p in enumerate(self.partitions):
            if p.shard_id == shard_id:
                return i
        known = ", ".join(repr(p.shard_id) for p in self.partitions)
        raise ValueError(
            f"{self.prefix or type(self).__name__}: unknown shard {shard_id!r} "
            f"(expected one of {known})"
        )

    def weight_loader(
        self, param: torch.Tensor, loaded: torch.Tensor, shard_id: Hashable | None = None
    ) -> None:
        what = self.prefix or type(self).__name__
        dim = getattr(param, "output_dim", None)
        if dim is None:  # not sharded along the output (a per-tensor scale, say)
            _copy_into(param.data, loaded, what)
            return
        logical = sum(p.rank_size for p in self.partitions)
        extent = param.shape[dim]
        if shard_id is None and len(self.partitions) > 1:
            # A checkpoint that stores the blocks already fused (qkv_proj, gate_up_proj).
            full_total = sum(p.full_size for p in self.partitions)
            full_extent = _scaled(full_total, extent, logical, what)
            if loaded.shape[dim] != full_extent:
                raise ValueError(
                    f"{what}: fused checkpoint tensor has {loaded.shape[dim]} rows "
                    f"along dim {dim}, expected {full_extent}"
                )
            start = 0
            for p in self.partitions:
                size = _scaled(p.full_size, extent, logical, what)
                self._load_partition(
                    param, loaded.narrow(dim, start, size), p, dim, extent, logical, what
                )
                start += size
            return
        index = 0 if shard_id is None else self._partition(shard_id)
        self._load_partition(param, loaded, self.partitions[index], dim, extent, logical, what)

    def checkpoint_shape(self, shard_id: Hashable | None = None) -> tuple[int, int]:
        if shard_id is None:
            return sum(p.full_size for p in self.partitions), self.input_size
        return self.partitions[self._partition(shard_id)].full_size, self.input_size

    def weight_slices(self, shard_id: Hashable | None = None) -> list[WeightSlice]:
        if shard_id is None and len(self.partitions) > 1:  # already fused in the checkpoint
            out, start = [], 0
            for i, p in enumerate(self.partitions):
                begin = start + p.rank_index * p.rank_size
                out.append(WeightSlice(i, (begin, begin + p.rank_size)))
                start += p.full_size
            return out
        index = 0 if shard_id is None else self._partition(shard_id)
        p = self.partitions[index]
        begin = p.rank_index * p.rank_size
        return [WeightSlice(index, (begin, begin + p.rank_size))]

    def _load_partition(
        self,
        param: torch.Tensor,
        loaded: torch.Tensor,
        p: _Partition,
        dim: int,
        extent: int,
        logical: int,
        what: str,
    ) -> None:
        if p.shard_id is not None:
            what = f"{what} shard {p.shard_id!r}"
        offset = sum(q.rank_size for q in self.partitions[: self.partitions.index(p)])
        p_offset = _scaled(offset, extent, logical, what)
        p_size = _scaled(p.rank_size, extent, logical, what)
        full = _scaled(p.full_size, extent, logical, what)
        if loaded.shape[dim] != full:
            raise ValueError(
                f"{what}: checkpoint tensor has shape {tuple(loaded.shape)}, "
                f"expected {full} along dim {dim}"
            )
        src = loaded.narrow(dim, p.rank_index * p_size, p_size)
        _copy_into(param.data.narrow(dim, p_offset, p_size), src, what)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.quant_method.apply(self, x, self.bias)
        if self.gather_output:
            y = all_gather_last_dim(y, self.tp_size)
        return y


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several projections of the same input stored as one (``gate_up_proj``).

    ``output_sizes`` lists each projection's full width; checkpoint tensors load with
    ``shard_id`` = the projection's index (0 = gate, 1 = up). ``forward`` returns them
    concatenated: ``[..., sum(output_sizes) / tp]``.
    """

    def __init__(
        self,
        input_size: int,
        output_sizes: list[int],
        bias: bool = False,
        *,
        gather_output: bool = False,
        build: BuildContext | None = None,
        prefix: str = "",
        quant_method: LinearMethod | None = None,
    ) -> None:
        self.output_sizes = list(output_sizes)
        super().__init__(
            input_size,
            sum(output_sizes),
            bias,
            gather_output=gather_output,
            build=build,
            prefix=prefix,
            quant_method=quant_method,
        )

    def _partitions(self) -> list[_Partition]:
        return [
            _Partition(
                i, size, divide(size, self.tp_size, f"{self.prefix} output {i}"), self.tp_rank
            )
            for i, size in enumerate(self.output_sizes)
        ]


class QKVParallelLinear(ColumnParallelLinear):
    """The q, k and v projections of attention stored as one.

    ``num_heads`` and ``num_kv_heads`` given to the constructor are the model's **totals**
    (the config's ``num_attention_heads`` / ``num_key_value_heads``); afterwards the attributes
    ``num_heads`` and ``num_kv_heads`` hold **this rank's** counts (``total_num_heads`` and
    ``total_num_kv_heads`` keep the totals), which is what :class:`~tallow.layers.Attention`
    takes. Output (per rank) is ``[q (Hq/tp * D) | k (Hkv/tp * D) | v (Hkv/tp * D)]``. When
    there are fewer KV heads than ranks, each KV head is replicated on ``tp / Hkv``
    consecutive ranks.
    Checkpoint tensors load with ``shard_id`` ``"q"``, ``"k"`` or ``"v"`` (or None for a
    checkpoint that already stores them fused, in that order).
    """

    def __init__(
        self,
        hidden_size: int,
        head_dim: int,
        num_heads: int,
        num_kv_heads: int | None = None,
        bias: bool = False,
        *,
        build: BuildContext | None = None,
        prefix: str = "",
        quant_method: LinearMethod | None = None,
    ) -> None:
        build = build if build is not None else BuildContext()
        num_kv_heads = num_kv_heads or num_heads
        tp = build.tp_size
        self.head_dim = head_dim
        self.total_num_heads = num_heads
        self.total_num_kv_heads = num_kv_heads
        self.num_heads = divide(num_heads, tp, "number of attention heads")
        if num_kv_heads >= tp:
            self.num_kv_heads = divide(num_kv_heads, tp, "number of KV heads")
            self.kv_replicas = 1
        else:
            self.num_kv_heads = 1
            self.kv_replicas = divide(tp, num_kv_heads, "tensor-parallel size over KV heads")
        out = (num_heads + 2 * num_kv_heads) * head_dim
        super().__init__(
            hidden_size, out, bias, build=build, prefix=prefix, quant_method=quant_method
        )

    def _partitions(self) -> list[_Partition]:
        d = self.head_dim
        kv_index = self.tp_rank // self.kv_replicas
        return [
            _Partition("q", self.total_num_heads * d, self.num_heads * d, self.tp_rank),
            _Partition("k", self.total_num_kv_heads * d, self.num_kv_heads * d, kv_index),
            _Partition("v", self.total_num_kv_heads * d, self.num_kv_heads * d, kv_index),
        ]

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def split(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Split this layer's output into ``q [T, Hq*D]``, ``k``, ``v [T, Hkv*D]`` (views)."""
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        return q, k, v


class RowParallelLinear(LinearBase):
    """Input features split across ranks; the partial products are summed over ranks.

    ``input_is_parallel`` (default) means the caller already holds this rank's slice of the
    input (the output of a column-parallel layer); otherwise the layer takes its slice itself.
    The bias is added once, after the sum.
    """

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = False,
        *,
        input_is_parallel: bool = True,
        reduce_results: bool = True,
        build: BuildContext | None = None,
        prefix: str = "",
        quant_method: LinearMethod | None = None,
    ) -> None:
        super().__init__(
            input_size, output_size, build=build, prefix=prefix, quant_method=quant_method
        )
        self.input_is_parallel = input_is_parallel
        self.reduce_results = reduce_results
        self.input_per_rank = divide(input_size, self.tp_size, f"{prefix} input size")
        self._create(self.input_per_rank, [output_size], bias)

    def weight_loader(
        self, param: torch.Tensor, loaded: torch.Tensor, shard_id: Hashable | None = None
    ) -> None:
        what = self.prefix or "RowParallelLinear"
        if shard_id is not None:
            raise ValueError(f"{what}: has no shards, got shard {shard_id!r}")
        dim = getattr(param, "input_dim", None)
        if dim is None:
            _copy_into(param.data, loaded, what)
            return
        size = param.shape[dim]
        full = size * self.tp_size
        if loaded.shape[dim] != full:
            raise ValueError(
                f"{what}: checkpoint tensor has shape {tuple(loaded.shape)}, "
                f"expected {full} along dim {dim}"
            )
        _copy_into(param.data, loaded.narrow(dim, self.tp_rank * size, size), what)

    def checkpoint_shape(self, shard_id: Hashable | None = None) -> tuple[int, int]:
        self._no_shard(shard_id)
        return self.output_size, self.input_size

    def weight_slices(self, shard_id: Hashable | None = None) -> list[WeightSlice]:
        self._no_shard(shard_id)
        begin = self.tp_rank * self.input_per_rank
        return [WeightSlice(0, (0, self.output_size), (begin, begin + self.input_per_rank))]

    def forward(self, x: torch.Tensor, act: nn.Module | None = None) -> torch.Tensor:
        """``x @ W.T (+ b)``, summed over ranks. With ``act`` (a gated activation of
        :mod:`tallow.layers.activation`), ``x`` is this rank's merged ``[gate | up]`` and the
        layer computes ``act(x) @ W.T``; the quantization method may fuse the activation into
        its matmul."""
        if act is not None and not self.input_is_parallel:
            raise ValueError(
                f"{self.prefix or 'RowParallelLinear'}: a gated input must "
                "already be this rank's slice (input_is_parallel=True)"
            )
        if self.tp_size == 1:
            if act is not None:
                return self.quant_method.apply_gated(self, x, act, self.bias)
            return self.quant_method.apply(self, x, self.bias)
        if not self.input_is_parallel:
            x = x.narrow(-1, self.tp_rank * self.input_per_rank, self.input_per_rank)
        y = (
            self.quant_method.apply(self, x, None)
            if act is None
            else self.quant_method.apply_gated(self, x, act, None)
        )
        if self.reduce_results:
            y = all_reduce(y, self.tp_size)
        if self.bias is not None:
            y = y + self.bias
        return y
