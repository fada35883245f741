"""The LinearMethod of the ``int4`` scheme: a layer's weight kept as integer codes in the
plugin's layout (:mod:`tallow_quant_int4.layout`).

Parameters. The layer gets one empty placeholder parameter per tensor name its checkpoint
format stores for a quantized layer (GPTQ: ``qweight``, ``qzeros``, ``scales``, ``g_idx``;
compressed-tensors: ``weight_packed``, ...) plus ``weight`` for a layer the checkpoint keeps
in floats (an ignored module, an unquantized head); each carries the method's own loader, so a
model's name map (``q_proj.{p}`` → ``qkv_proj.{p}``) routes every suffix here unchanged. None
of them is ``from_checkpoint``: which ones a checkpoint fills depends on the layer, and the
method checks completeness itself when loading ends.

Loading. The loader keeps each checkpoint tensor as it comes, by shard (``q``/``k``/``v``,
gate/up). When loading ends (``process_weights_after_loading``) each shard is unpacked
(:mod:`tallow_quant_int4.formats`), the rows and columns this rank holds are cut out
(``layer.weight_slices``), and the result is packed into the layout once. Float weights are
quantized as they arrive under ``model.isq`` (:mod:`tallow_quant_int4.isq`), else kept dense.
Neighbouring partitions that share a layout are stacked, so a merged layer runs one kernel.
The packed tensors are registered as buffers of the layer (``int_<part>_<name>``) so that
memory accounting sees them.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any, Hashable

import torch
from torch import nn

from tallow.layers import LinearMethod, WeightSlice, set_weight_attrs

from . import ops
from .formats import Unpacked, unpack_awq, unpack_compressed, unpack_gptq, unpack_marlin
from .layout import IntWeight, cat_rows, from_codes

if TYPE_CHECKING:  # pragma: no cover
    from .scheme import IntQuantScheme

#: rows drawn and quantized at a time by random initialisation under ``model.isq``
RANDOM_CHUNK_ROWS = 8192


class IntLinearMethod(LinearMethod):
    """Integer weights of one layer (see the module docstring)."""

    def __init__(self, scheme: "IntQuantScheme", prefix: str) -> None:
        self.scheme = scheme
        self.prefix = prefix
        self.layout = scheme.layout  # None under model.isq
        self.parts: list[ops.Part] = []
        self.pending: dict[Hashable, dict[str, torch.Tensor]] = {}
        self.layer: nn.Module | None = None
        self._slots: list[ops.Part | None] = []
        self._warm_gates: set[str] = set()

    @property
    def _what(self) -> str:
        return self.prefix or type(self.layer).__name__

    # -- storage ---------------------------------------------------------------------------
    def create_weights(self, layer: nn.Module, input_size: int, output_sizes: list[int],
                       params_dtype: torch.dtype, device: torch.device) -> None:
        self.layer = layer
        self.input_size = input_size
        self.output_sizes = list(output_sizes)
        self.dtype = params_dtype
        self.device = torch.device(device)
        self._slots = [None] * len(output_sizes)
        names = ("weight",) + (self.layout.tensors if self.layout is not None else ())
        for name in names:
            placeholder = nn.Parameter(torch.empty(0, dtype=torch.uint8, device=device),
                                       requires_grad=False)
            set_weight_attrs(placeholder, weight_loader=partial(self._load, name),
                             from_checkpoint=False)
            if name == "weight" and self.scheme.isq:
                set_weight_attrs(placeholder, random_fill=self.random_fill)
            layer.register_parameter(name, placeholder)

    def _load(self, name: str, param: torch.Tensor, loaded: torch.Tensor,
              shard_id: Hashable | None = None) -> None:
        """The loader of every placeholder: ``loaded`` is the checkpoint tensor ``name`` of
        ``shard_id``."""
        if not isinstance(loaded, torch.Tensor):
            raise ValueError(f"{self._what}.{name}: expected a tensor, got "
                             f"{type(loaded).__name__}")
        if name == "weight":
            self._load_float(loaded, shard_id)
            return
        tensors = self.pending.setdefault(shard_id, {})
        if name in tensors:
            raise ValueError(f"{self._what}: checkpoint tensor {name} of shard {shard_id!r} "
                             "loaded twice")
        tensors[name] = loaded

    def _load_float(self, loaded: torch.Tensor, shard_id: Hashable | None) -> None:
        layer = self.layer
        expected = tuple(layer.checkpoint_shape(shard_id))
        if tuple(loaded.shape) != expected:
            shard = "" if shard_id is None else f" shard {shard_id!r}"
            raise ValueError(f"{self._what}{shard}: checkpoint tensor has shape "
                             f"{tuple(loaded.shape)}, expected {expected}")
        for part in layer.weight_slices(shard_id):
            (r0, r1), cols = part.rows, part.cols
            c0, c1 = cols if cols is not None else (0, loaded.shape[1])
            self._store(part.partition, self._from_float(loaded[r0:r1, c0:c1]), part.pad_rows)

    def _from_float(self, weight: torch.Tensor) -> ops.Part:
        if self.scheme.isq:
            from .isq import quantize_rtn

            packed = quantize_rtn(weight, self.device)
            if packed is not None:
                return packed
        return weight.to(self.device, self.dtype)

    def _store(self, index: int, part: ops.Part, pad_rows: int = 0) -> None:
        if pad_rows:
            part = (part.map_rows(lambda t: _pad(t, pad_rows)) if isinstance(part, IntWeight)
                    else _pad(part, pad_rows))
        rows = part.rows if isinstance(part, IntWeight) else part.shape[0]
        cols = part.cols if isinstance(part, IntWeight) else part.shape[1]
        if (rows, cols) != (self.output_sizes[index], self.input_size):
            raise ValueError(f"{self._what}: partition {index} holds [{rows}, {cols}], expected "
                             f"[{self.output_sizes[index]}, {self.input_size}]")
        if self._slots[index] is not None:
            raise ValueError(f"{self._what}: output partition {index} is loaded twice")
        self._slots[index] = part

    @torch.no_grad()
    def random_fill(self, generator: torch.Generator, std: float) -> None:
        """Random float weights ~ N(0, std), quantized as they are drawn (``random:`` models
        under ``model.isq``): at most :data:`RANDOM_CHUNK_ROWS` float rows exist at a time."""
        from .isq import quantize_rtn

        for index, rows in enumerate(self.output_sizes):
            chunks = []
            for start in range(0, rows, RANDOM_CHUNK_ROWS):
                n = min(RANDOM_CHUNK_ROWS, rows - start)
                w = torch.empty(n, self.input_size, dtype=torch.float32, device=self.device)
                w.normal_(0.0, std, generator=generator)
                chunks.append(quantize_rtn(w, self.device) if self.scheme.isq else None)
                if chunks[-1] is None:
                    chunks[-1] = w.to(self.dtype)
                del w
            if all(isinstance(c, IntWeight) for c in chunks):
                self._store(index, chunks[0] if len(chunks) == 1 else cat_rows(chunks))
            else:
                self._store(index, torch.cat([ops.dequantize(c, self.dtype) for c in chunks]))

    # -- finishing ---------------------------------------------------------------------------
    def process_weights_after_loading(self, layer: nn.Module) -> None:
        for shard_id, tensors in self.pending.items():
            self._unpack_shard(shard_id, tensors)
        self.pending = {}
        missing = [i for i, p in enumerate(self._slots) if p is None]
        if missing:
            raise ValueError(f"{self._what}: output partition(s) {missing} were never loaded "
                             "(neither a quantized weight nor a float one)")
        kinds = {isinstance(p, IntWeight) for p in self._slots}
        if len(kinds) > 1:
            raise ValueError(f"{self._what}: some output partitions are quantized and some are "
                             "not; a merged layer must be one or the other")
        self.parts = _stack(self._slots)
        self._slots = []
        for i, p in enumerate(self.parts):
            named = p.tensors() if isinstance(p, IntWeight) else {"dense": p}
            for name, tensor in named.items():
                layer.register_buffer(f"int_{i}_{name}", tensor, persistent=False)
        if self.device.type == "cuda":
            ops.warm_up(self.parts, self.dtype, self.scheme.policy)

    def _unpack_shard(self, shard_id: Hashable | None, tensors: dict[str, torch.Tensor]) -> None:
        layout = self.layout
        shard = "" if shard_id is None else f" shard {shard_id!r}"
        what = f"{self._what}{shard}"
        lacking = [t for t in layout.required if t not in tensors]
        if lacking:
            raise ValueError(f"{what}: the checkpoint lacks {', '.join(lacking)} "
                             f"(a {layout.method} layer stores {', '.join(layout.required)})")
        shape = tuple(self.layer.checkpoint_shape(shard_id))
        unpacked = _unpack(layout, tensors, shape, self.device, what)
        if unpacked.group_index is not None and any(
                s.cols is not None and s.cols != (0, shape[1])
                for s in self.layer.weight_slices(shard_id)):
            raise ValueError(f"{what}: act-order (g_idx) weights cannot be split along their "
                             "input features across tensor-parallel ranks")
        for part in self.layer.weight_slices(shard_id):
            self._store(part.partition, _slice(unpacked, part, what), part.pad_rows)

    # -- compute ---------------------------------------------------------------------------
    def apply(self, layer: nn.Module, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:
        return ops.linear(x, self.parts, bias, policy=self.scheme.policy)

    def apply_gated(self, layer: nn.Module, x: torch.Tensor, act: nn.Module,
                    bias: torch.Tensor | None = None) -> torch.Tensor:
        kind = getattr(act, "kind", None)
        if kind not in ops.ACTIVATIONS:
            return self.apply(layer, act(x), bias)
        if kind not in self._warm_gates and x.is_cuda:
            # the kernels that apply the activation as they read x are variants of their own,
            # compiled at the first gated call (the engine runs every shape it captures in a
            # CUDA graph eagerly before capturing it)
            self._warm_gates.add(kind)
            if not torch.cuda.is_current_stream_capturing():
                ops.warm_up(self.parts, x.dtype, self.scheme.policy, gate=kind)
        return ops.linear(x, self.parts, bias, policy=self.scheme.policy, gate=kind)

    def type_names(self) -> list[str]:
        """What each part holds, for the scheme's summary."""
        return [p.type_name if isinstance(p, IntWeight) else "dense" for p in self.parts]


def _pad(t: torch.Tensor, rows: int) -> torch.Tensor:
    return torch.cat([t, t.new_zeros(rows, *t.shape[1:])])


def _stack(slots: list[ops.Part]) -> list[ops.Part]:
    """Neighbouring partitions joined where they share a layout (all dense ones join)."""
    runs: list[list[ops.Part]] = []
    for p in slots:
        last = runs[-1][-1] if runs else None
        joins = last is not None and (
            (isinstance(p, IntWeight) and isinstance(last, IntWeight) and last.stacks_with(p))
            or (not isinstance(p, IntWeight) and not isinstance(last, IntWeight)))
        if joins:
            runs[-1].append(p)
        else:
            runs.append([p])
    out = []
    for run in runs:
        if len(run) == 1:
            out.append(run[0])
        elif isinstance(run[0], IntWeight):
            out.append(cat_rows(run))
        else:
            out.append(torch.cat(run))
    return out


def _unpack(layout: Any, tensors: dict[str, torch.Tensor], shape: tuple[int, int],
            device: torch.device, what: str) -> Unpacked:
    t = {name: v.to(device) for name, v in tensors.items()}
    if layout.kind == "gptq":
        return unpack_gptq(t["qweight"], t["qzeros"], t["scales"], t.get("g_idx"), shape,
                           zero_offset=layout.zero_offset, what=what)
    if layout.kind == "awq":
        return unpack_awq(t["qweight"], t["qzeros"], t["scales"], shape, what=what)
    if layout.kind == "marlin":
        return unpack_marlin(t["B"], t["s"], shape, what=what)
    stated = t.get("weight_shape")
    if stated is not None and tuple(int(v) for v in stated.tolist()) != shape:
        raise ValueError(f"{what}: weight_shape says {stated.tolist()}, the layer expects "
                         f"{list(shape)}")
    return unpack_compressed(t["weight_packed"], t["weight_scale"], t.get("weight_zero_point"),
                             t.get("weight_g_idx"), shape, what=what)


def _slice(u: Unpacked, part: WeightSlice, what: str) -> IntWeight:
    """This rank's rows and columns of an unpacked checkpoint weight, in the layout."""
    (r0, r1), cols = part.rows, part.cols
    k = u.codes.shape[1]
    c0, c1 = cols if cols is not None else (0, k)
    groups = u.scales.shape[1]
    group = k // groups
    if (c0, c1) != (0, k) and (c0 % group or c1 % group):
        raise ValueError(f"{what}: this rank's columns {c0}:{c1} do not fall on the "
                         f"{group}-column groups of the weight")
    g0, g1 = c0 // group, c1 // group
    if u.group_index is not None:
        g0, g1 = 0, groups
    zeros = None if u.zeros is None else u.zeros[r0:r1, g0:g1]
    return from_codes(u.codes[r0:r1, c0:c1], u.scales[r0:r1, g0:g1], zeros, u.bits,
                      group_index=u.group_index, what=what)
