"""The LinearMethod of the ``gguf`` scheme: a layer's weight kept in GGML block types.

Storage. A layer has one weight per output partition (q/k/v, gate/up, or just one), each a
:class:`~tallow_quant_gguf.packing.PackedWeight` of its own type: the real GGUF files mix types
inside merged layers (Qwen2.5's Q5_0 q/k with a Q8_0 v). When every partition has the same
type they are stacked into one weight after loading, so the layer runs one kernel; otherwise
each run of neighbours of one type is stacked, and runs its own kernel into its columns of
the output. Float tensors (F32/F16/BF16
in a GGUF file) stay dense in the activation dtype, unless ``model.isq`` asks to quantize them.
The planes are registered as buffers of the layer (``weight_<partition>_<plane>``), so memory
accounting and ``named_buffers`` see them; the layer's ``weight`` parameter is an empty
placeholder that carries the loader.

Loading. The loader receives the checkpoint tensor (a :class:`tallow.layers.QuantizedWeight`,
or a float tensor) and asks the layer which rows and columns this rank holds
(``layer.weight_slices``): column-parallel shards are whole rows, row-parallel shards whole
blocks of each row (their bounds must fall on block boundaries), the vocabulary's tail padding
zero rows. It converts each slice to planes on the layer's device, one tensor at a time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Hashable

import torch
from torch import nn

from tallow.layers import LinearMethod, QuantizedWeight, WeightSlice, set_weight_attrs

from tallow.kernels import packed_gemm, packed_gemm_warm_up

from . import ops, tensor_core
from .packing import PackedWeight, cat_rows, dense, pack
from .qtypes import QUANT_TYPES

if TYPE_CHECKING:  # pragma: no cover
    from .scheme import GGUFQuantScheme

#: rows drawn and quantized at a time by random initialisation
RANDOM_CHUNK_ROWS = 8192


def to_packed(
    loaded: Any,
    rows: tuple[int, int],
    cols: tuple[int, int] | None,
    isq: str | None,
    device: torch.device,
    dtype: torch.dtype,
    what: str,
    tp_size: int = 1,
) -> PackedWeight:
    """Rows ``rows`` and columns ``cols`` (None: all) of a 2-d checkpoint tensor as a packed
    weight on ``device``: a :class:`QuantizedWeight` of a type the kernels decode keeps its
    blocks (the columns must fall on block boundaries); a float tensor is quantized to
    ``isq`` when given, else kept dense in ``dtype``."""
    (r0, r1) = rows
    c0, c1 = cols if cols is not None else (0, loaded.shape[-1])
    if isinstance(loaded, QuantizedWeight) and (
        loaded.scheme != "gguf" or loaded.qtype not in QUANT_TYPES
    ):
        loaded = loaded.dequantize()  # a type these kernels do not decode: keep it dense
    if isinstance(loaded, QuantizedWeight):
        qt = QUANT_TYPES[loaded.qtype]
        if c0 % qt.block or c1 % qt.block:
            raise ValueError(
                f"{what}: this rank's columns {c0}:{c1} do not fall on "
                f"{qt.block}-element block boundaries of {qt.name}; "
                "row-parallel shards of a quantized weight must (tensor "
                f"parallelism over {tp_size} ranks splits each row's "
                f"{loaded.shape[-1] // qt.block} blocks: choose a "
                "tensor-parallel size that divides them)"
            )
        raw = loaded.data[r0:r1, qt.row_bytes(c0) : qt.row_bytes(c1)]
        return pack(raw.to(device), qt, cols=c1 - c0)
    weight = loaded[r0:r1, c0:c1]
    if not isq:
        return dense(weight.to(device, dtype))
    from .isq import quantize_rows

    return quantize_rows(weight, isq, device, dtype)


class GGUFLinearMethod(LinearMethod):
    """Weights of one layer in GGML block types (see the module docstring)."""

    def __init__(self, scheme: "GGUFQuantScheme", prefix: str) -> None:
        self.scheme = scheme
        self.prefix = prefix
        self.parts: list[PackedWeight | None] = []
        self.layer: nn.Module | None = None
        self._warm_gates: set[str] = set()
        #: under ``matmul: tensor_core``, the parts re-laid for the packed GEMM, and the parts
        #: list they were made from
        self._packed: list[Any] = []
        self._packed_from: list[Any] | None = None

    # -- storage ---------------------------------------------------------------------------
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
        self.parts = [None] * len(output_sizes)
        placeholder = nn.Parameter(
            torch.empty(0, dtype=torch.uint8, device=device), requires_grad=False
        )
        set_weight_attrs(
            placeholder, output_dim=0, input_dim=1, weight_loader=self.load, accepts_quantized=True
        )
        if self.scheme.isq:
            set_weight_attrs(placeholder, random_fill=self.random_fill)
        layer.register_parameter("weight", placeholder)

    @property
    def _what(self) -> str:
        return self.prefix or type(self.layer).__name__

    def load(self, param: torch.Tensor, loaded: Any, shard_id: Hashable | None = None) -> None:
        """The weight loader: ``loaded`` is the whole checkpoint tensor of ``shard_id``."""
        layer = self.layer
        expected = tuple(layer.checkpoint_shape(shard_id))
        if tuple(loaded.shape) != expected:
            shard = "" if shard_id is None else f" shard {shard_id!r}"
            raise ValueError(
                f"{self._what}{shard}: checkpoint tensor has shape "
                f"{tuple(loaded.shape)}, expected {expected}"
            )
        if isinstance(loaded, QuantizedWeight) and (
            loaded.scheme != "gguf" or loaded.qtype not in QUANT_TYPES
        ):
            loaded = loaded.dequantize()  # once, not per slice (to_packed would per slice)
        for part in layer.weight_slices(shard_id):
            if self.parts[part.partition] is not None:
                raise ValueError(f"{self._what}: output partition {part.partition} is loaded twice")
            self._store(part.partition, self._convert(loaded, part))

    def _convert(self, loaded: Any, part: WeightSlice) -> PackedWeight:
        packed = to_packed(
            loaded,
            part.rows,
            part.cols,
            self.scheme.isq,
            self.device,
            self.dtype,
            self._what,
            getattr(self.layer, "tp_size", 1),
        )
        return packed.pad_rows(part.pad_rows)

    def _store(self, index: int, packed: PackedWeight) -> None:
        rows = self.output_sizes[index]
        if (packed.rows, packed.cols) != (rows, self.input_size):
            raise ValueError(
                f"{self._what}: partition {index} holds [{packed.rows}, "
                f"{packed.cols}], expected [{rows}, {self.input_size}]"
            )
        self.parts[index] = packed

    @torch.no_grad()
    def random_fill(self, generator: torch.Generator, std: float) -> None:
        """Random float weights ~ N(0, std), quantized as they are drawn (``random:`` models
        under ``model.isq``): at most :data:`RANDOM_CHUNK_ROWS` float rows exist at a time."""
        from .isq import quantize_rows

        for index, rows in enumerate(self.output_sizes):
            chunks = []
            for start in range(0, rows, RANDOM_CHUNK_ROWS):
                n = min(RANDOM_CHUNK_ROWS, rows - start)
                w = torch.empty(n, self.input_size, dtype=torch.float32, device=self.device)
                w.normal_(0.0, std, generator=generator)
                chunks.append(quantize_rows(w, self.scheme.isq, self.device, self.dtype))
                del w
            self._store(index, chunks[0] if len(chunks) == 1 else cat_rows(chunks))

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        missing = [i for i, p in enumerate(self.parts) if p is None]
        if missing:
            raise ValueError(f"{self._what}: output partition(s) {missing} were never loaded")
        # neighbours of one type become one weight: one kernel for them
        runs: list[list[PackedWeight]] = []
        for p in self.parts:
            if runs and runs[-1][0].type_name == p.type_name:
                runs[-1].append(p)
            else:
                runs.append([p])
        self.parts = [run[0] if len(run) == 1 else cat_rows(run) for run in runs]
        for i, p in enumerate(self.parts):
            for name, tensor in p.planes.items():
                layer.register_buffer(f"weight_{i}_{name}", tensor, persistent=False)
        if self.device.type == "cuda":
            if self._tensor_core(torch.empty(0, dtype=self.dtype, device=self.device)):
                packed_gemm_warm_up(self._packed_parts(), self.dtype)
            else:
                ops.warm_up(self.parts, self.dtype, self.scheme.policy)

    def _tensor_core(self, x: torch.Tensor) -> bool:
        """Whether ``matmul: tensor_core`` sends this product through the packed GEMM."""
        return self.scheme.policy.matmul == "tensor_core" and tensor_core.applies(x, self.parts)  # type: ignore[arg-type]

    def _packed_parts(self) -> list[Any]:
        """The parts in the packed GEMM's layout, re-laid once per list of parts."""
        if self._packed_from is not self.parts:
            self._packed = [tensor_core.to_packed(p) for p in self.parts]  # type: ignore[arg-type]
            self._packed_from = self.parts
        return self._packed

    # -- compute ---------------------------------------------------------------------------
    def apply(
        self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        if self._tensor_core(x):
            return packed_gemm(x, self._packed_parts(), bias)
        return ops.linear(x, self.parts, bias, policy=self.scheme.policy)

    def apply_gated(
        self, layer: nn.Module, x: torch.Tensor, act: nn.Module, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        kind = getattr(act, "kind", None)
        if kind is None or self._tensor_core(x):
            return self.apply(layer, act(x), bias)
        if kind not in self._warm_gates and x.is_cuda:
            # the kernels that apply the activation as they read x are variants of their own:
            # compiled at the first gated call (the engine runs every captured shape eagerly
            # before capturing it)
            self._warm_gates.add(kind)
            if not torch.cuda.is_current_stream_capturing():
                ops.warm_up(self.parts, x.dtype, self.scheme.policy, gated=kind)
        return ops.linear(x, self.parts, bias, policy=self.scheme.policy, gate=kind)

    def embedding(self, layer: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        return ops.embedding(self.parts[0], ids, self.dtype)
