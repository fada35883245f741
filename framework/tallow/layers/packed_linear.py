"""A base for quantization methods whose checkpoints store a layer as several tensors.

GPTQ stores a linear layer as ``qweight``, ``qzeros``, ``scales`` and ``g_idx``;
compressed-tensors as ``weight_packed``, ``weight_scale``...; gpt-oss's MXFP4 as
``weight_blocks`` and ``weight_scales``. :class:`PackedLinearMethod` does what such a method
needs around its format:

- **Parameters.** One empty placeholder per tensor name (``tensor_names``) plus ``weight`` for
  a layer the checkpoint keeps in floats; each carries the method's own loader, so a model's
  name map (``q_proj.{p}`` → ``qkv_proj.{p}`` with shard ``"q"``) routes every suffix here.
  None is ``from_checkpoint``: which ones a checkpoint fills depends on the layer, and the
  method checks completeness itself when loading ends.
- **Loading.** Tensors are kept as they come, by shard, until loading ends; then each shard is
  handed to :meth:`~PackedLinearMethod.unpack_shard` with this rank's slices of it
  (``layer.weight_slices``), which returns one *part* per slice in the subclass's packed
  layout. A float ``weight`` is sliced the same way and passed to
  :meth:`~PackedLinearMethod.quantize_float` (load-time quantization), or kept dense.
  ``random_fill`` draws a ``random:`` model's float rows a slice at a time for the same hook.
- **Stacking.** Neighbouring partitions (q/k/v, gate/up) whose parts ``stacks_with`` one
  another become one part (``type(part).cat_rows``), so the layer runs one kernel; dense ones
  are concatenated. The parts are registered as buffers of the layer (``<prefix>_<i>_<name>``,
  from each part's ``tensors()``) so that memory accounting sees them.

A part is any object with ``rows``, ``cols``, ``map_rows(fn)`` (fn applied to each per-row
tensor: pads, slices), ``stacks_with(other)``, ``tensors()`` and a classmethod
``cat_rows(parts)``; a dense part is a float tensor ``[rows, cols]``. Subclasses implement
``unpack_shard``, ``quantize_float`` (optional), ``matmul(x, bias, gate)`` over the parts (with
``gate`` one of :attr:`~PackedLinearMethod.gated_kinds`, the activation of a gated MLP's
``[gate | up]`` input, applied as x is read) and ``warm_up(dtype, gate)`` (compiling, on a GPU,
every kernel variant the matmul may launch: called once the parts are final, and at the first
gated call of each activation, before any CUDA-graph capture since the engine runs every shape
eagerly first).
"""

from __future__ import annotations

from functools import partial
from typing import Any, Hashable

import torch
from torch import nn

from .linear import WeightSlice
from .linear_method import LinearMethod, set_weight_attrs, sharded_weights

#: rows drawn (and quantized) at a time when a ``random:`` model fills a layer
RANDOM_CHUNK_ROWS = 8192


class PackedLinearMethod(LinearMethod):
    """Storage of a layer whose checkpoint tensors are unpacked into parts when loading ends
    (see the module docstring)."""

    #: prefix of the buffers the parts are registered as
    buffer_prefix = "packed"
    #: rows a ``random:`` model draws at a time (see :meth:`random_fill`)
    random_chunk_rows = RANDOM_CHUNK_ROWS

    def __init__(
        self,
        prefix: str,
        tensor_names: tuple[str, ...] = (),
        required: tuple[str, ...] = (),
        *,
        quantize_floats: bool = False,
    ) -> None:
        self.prefix = prefix
        self.tensor_names = tuple(tensor_names)
        self.required = tuple(required)
        self.quantize_floats = quantize_floats
        self.parts: list[Any] = []
        self.pending: dict[Hashable, dict[str, torch.Tensor]] = {}
        self.layer: nn.Module | None = None
        self._slots: list[Any] = []
        self._warm_gates: set[str] = set()

    # -- what a subclass provides -----------------------------------------------------------
    def unpack_shard(
        self,
        tensors: dict[str, torch.Tensor],
        shape: tuple[int, int],
        slices: list[WeightSlice],
        what: str,
    ) -> list[Any]:
        """The parts of this rank's ``slices`` of one shard's checkpoint tensors (all of
        :attr:`required` are present), ``shape`` the shard's logical ``(rows, cols)``; one
        part per slice, its ``pad_rows`` not yet added."""
        raise NotImplementedError

    def quantize_float(self, weight: torch.Tensor) -> Any:
        """A float slice quantized into a part, or None to keep it dense."""
        return None

    #: the activations ``matmul`` applies to a gated input as it reads it
    gated_kinds: tuple[str, ...] = ()

    def matmul(
        self, x: torch.Tensor, bias: torch.Tensor | None = None, gate: str | None = None
    ) -> torch.Tensor:
        """``x @ W.T (+ bias)`` over the parts; with ``gate``, x is ``[gate | up]``."""
        raise NotImplementedError

    def warm_up(self, dtype: torch.dtype, gate: str | None = None) -> None:
        """Compile the kernels the matmul may launch for activations of ``dtype`` (a GPU)."""

    # -- compute ---------------------------------------------------------------------------
    def apply(
        self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.matmul(x, bias)

    def apply_gated(
        self, layer: nn.Module, x: torch.Tensor, act: nn.Module, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        kind = getattr(act, "kind", None)
        if kind not in self.gated_kinds:
            return self.matmul(act(x), bias)
        if kind not in self._warm_gates and x.is_cuda:
            self._warm_gates.add(kind)
            if not torch.cuda.is_current_stream_capturing():
                self.warm_up(x.dtype, gate=kind)
        return self.matmul(x, bias, gate=kind)

    # -- storage ---------------------------------------------------------------------------
    def _layer(self) -> nn.Module:
        if self.layer is None:
            raise RuntimeError(f"{self.what}: create_weights has not run")
        return self.layer

    @property
    def what(self) -> str:
        return self.prefix or type(self.layer).__name__

    def create_weights(
        self,
        layer: nn.Module,
        input_size: int,
        output_sizes: list[int],
        params_dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.layer = layer
        self.input_size = input_size
        self.output_sizes = list(output_sizes)
        self.dtype = params_dtype
        self.device = torch.device(device)
        self._slots = [None] * len(output_sizes)
        for name in ("weight", *self.tensor_names):
            placeholder = nn.Parameter(
                torch.empty(0, dtype=torch.uint8, device=device), requires_grad=False
            )
            set_weight_attrs(
                placeholder, weight_loader=partial(self._load, name), from_checkpoint=False
            )
            if name == "weight":
                set_weight_attrs(placeholder, random_fill=self.random_fill)
            layer.register_parameter(name, placeholder)

    def _load(
        self, name: str, param: torch.Tensor, loaded: torch.Tensor, shard_id: Hashable | None = None
    ) -> None:
        if not isinstance(loaded, torch.Tensor):
            raise ValueError(f"{self.what}.{name}: expected a tensor, got {type(loaded).__name__}")
        if name == "weight":
            self._load_float(loaded, shard_id)
            return
        tensors = self.pending.setdefault(shard_id, {})
        if name in tensors:
            raise ValueError(
                f"{self.what}: checkpoint tensor {name} of shard {shard_id!r} loaded twice"
            )
        tensors[name] = loaded

    def _load_float(self, loaded: torch.Tensor, shard_id: Hashable | None) -> None:
        layout = sharded_weights(self._layer())
        expected = tuple(layout.checkpoint_shape(shard_id))
        if tuple(loaded.shape) != expected:
            shard = "" if shard_id is None else f" shard {shard_id!r}"
            raise ValueError(
                f"{self.what}{shard}: checkpoint tensor has shape "
                f"{tuple(loaded.shape)}, expected {expected}"
            )
        for part in layout.weight_slices(shard_id):
            (r0, r1), cols = part.rows, part.cols
            c0, c1 = cols if cols is not None else (0, loaded.shape[1])
            self._store(part.partition, self._from_float(loaded[r0:r1, c0:c1]), part.pad_rows)

    def _from_float(self, weight: torch.Tensor) -> Any:
        packed = self.quantize_float(weight) if self.quantize_floats else None
        return packed if packed is not None else weight.to(self.device, self.dtype)

    def _store(
        self,
        index: int,
        part: Any,  # Any: a tensor or the subclass's packed part
        pad_rows: int = 0,
    ) -> None:
        if pad_rows:
            part = _pad(part, pad_rows)
        rows, cols = _shape(part)
        if (rows, cols) != (self.output_sizes[index], self.input_size):
            raise ValueError(
                f"{self.what}: partition {index} holds [{rows}, {cols}], expected "
                f"[{self.output_sizes[index]}, {self.input_size}]"
            )
        if self._slots[index] is not None:
            raise ValueError(f"{self.what}: output partition {index} is loaded twice")
        self._slots[index] = part

    @torch.no_grad()
    def random_fill(self, generator: torch.Generator, std: float) -> None:
        """Random float weights ~ N(0, std) (a ``random:`` model), quantized as they are drawn
        when the method quantizes at load (then at most :attr:`random_chunk_rows` float rows
        exist at a time), else kept dense."""
        for index, rows in enumerate(self.output_sizes):
            chunks = []
            for start in range(0, rows, self.random_chunk_rows):
                n = min(self.random_chunk_rows, rows - start)
                w = torch.empty(n, self.input_size, dtype=torch.float32, device=self.device)
                w.normal_(0.0, std, generator=generator)
                chunks.append(self._from_float(w))
                del w
            if len(chunks) == 1:
                self._store(index, chunks[0])
            elif all(isinstance(c, torch.Tensor) for c in chunks):
                self._store(index, torch.cat(chunks))
            else:
                self._store(index, type(chunks[0]).cat_rows(chunks))

    # -- finishing ---------------------------------------------------------------------------
    def process_weights_after_loading(self, layer: nn.Module) -> None:
        for shard_id, tensors in self.pending.items():
            what = self.what + ("" if shard_id is None else f" shard {shard_id!r}")
            lacking = [t for t in self.required if t not in tensors]
            if lacking:
                raise ValueError(
                    f"{what}: the checkpoint lacks {', '.join(lacking)} (a "
                    f"quantized layer stores {', '.join(self.required)})"
                )
            layout = sharded_weights(layer)
            slices = layout.weight_slices(shard_id)
            parts = self.unpack_shard(tensors, layout.checkpoint_shape(shard_id), slices, what)
            for part, where in zip(parts, slices):
                self._store(where.partition, part, where.pad_rows)
        self.pending = {}
        missing = [i for i, p in enumerate(self._slots) if p is None]
        if missing:
            raise ValueError(
                f"{self.what}: output partition(s) {missing} were never loaded "
                "(neither a quantized weight nor a float one)"
            )
        if len({isinstance(p, torch.Tensor) for p in self._slots}) > 1:
            raise ValueError(
                f"{self.what}: some output partitions are quantized and some are "
                "not; a merged layer must be one or the other"
            )
        parts = _stack(self._slots)
        self._slots = []
        self.replace_parts(parts)

    def replace_parts(self, parts: list[Any]) -> None:
        """Make ``parts`` the layer's storage: registered as its buffers (those of the parts
        before them removed) and, on a GPU, their kernels compiled. Loading ends with it; a
        method that quantizes later (from calibration) calls it again."""
        layer = self._layer()
        for name in [n for n in layer._buffers if n.startswith(f"{self.buffer_prefix}_")]:
            delattr(layer, name)
        self.parts = list(parts)
        self._warm_gates.clear()  # the new parts' gated variants compile at their first call
        for i, p in enumerate(self.parts):
            named = {"dense": p} if isinstance(p, torch.Tensor) else p.tensors()
            for name, tensor in named.items():
                layer.register_buffer(f"{self.buffer_prefix}_{i}_{name}", tensor, persistent=False)
        if self.device.type == "cuda":
            self.warm_up(self.dtype)


def _shape(part: Any) -> tuple[int, int]:  # Any: a tensor or a packed part
    if isinstance(part, torch.Tensor):
        return part.shape[0], part.shape[1]
    return part.rows, part.cols


def _pad_tensor(t: torch.Tensor, rows: int) -> torch.Tensor:
    return torch.cat([t, t.new_zeros(rows, *t.shape[1:])])


def _pad(part: Any, rows: int) -> Any:  # Any: a tensor or a packed part
    """``rows`` zero rows appended (a vocabulary's tail): zero codes with zero scales."""
    if isinstance(part, torch.Tensor):
        return _pad_tensor(part, rows)
    return part.map_rows(lambda t: _pad_tensor(t, rows))


def _stack(slots: list[Any]) -> list[Any]:
    """Neighbouring partitions joined where they share a layout (all dense ones join)."""
    runs: list[list[Any]] = []
    for p in slots:
        last = runs[-1][-1] if runs else None
        dense = isinstance(p, torch.Tensor)
        joins = last is not None and (
            (dense and isinstance(last, torch.Tensor))
            or (
                not dense
                and not isinstance(last, torch.Tensor)
                and type(last) is type(p)
                and last.stacks_with(p)
            )
        )
        if joins:
            runs[-1].append(p)
        else:
            runs.append([p])
    out = []
    for run in runs:
        if len(run) == 1:
            out.append(run[0])
        elif isinstance(run[0], torch.Tensor):
            out.append(torch.cat(run))
        else:
            out.append(type(run[0]).cat_rows(run))
    return out
