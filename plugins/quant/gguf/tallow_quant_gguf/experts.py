"""The MoEMethod of the ``gguf`` scheme: a mixture of experts whose experts stay GGML blocks.

Storage. Each projection's experts are stacked along the rows of one
:class:`~tallow_quant_gguf.packing.PackedWeight`: the gate/up weight holds, for each expert in
turn, its ``I`` gate rows then its ``I`` up rows (``[E * 2I, H]``), the down weight its ``H``
rows (``[E * H, I]``); ``I`` is this rank's share of the intermediate size. The two
projections may be of different types (MoE GGUFs often pair Q4_K gate/up with Q6_K down);
gate and up of different types are kept as two weights. Float expert tensors stay dense in
the activation dtype, unless ``model.isq`` quantizes them (``random:`` models draw and
quantize one expert at a time). The planes are buffers of the experts' module
(``w13_<plane>``, ``w2_<plane>``); ``w13_weight`` and ``w2_weight`` are empty placeholders
that carry the loader.

Compute (:meth:`GGUFMoEMethod.apply`):

- up to ``moe_decode_max_tokens`` tokens (the scheme's setting, default 32): the decode
  kernels of :mod:`~tallow_quant_gguf.kernels.moe` — the GEMV with an expert index, reading
  only the selected experts' blocks, SwiGLU fused into the gate/up kernel and the weighted
  top-k sum into the down kernel;
- more tokens: every expert is decoded into a workspace in the activation dtype and the
  core's grouped GEMM runs on it (:func:`tallow.kernels.fused_moe`). All experts, not only the
  ones the routing hits: choosing them would need the routing on the host (no CUDA graph),
  and at these batch sizes nearly every expert is hit (128 experts, top-8, 64 tokens: each
  is missed with probability ``(1 - 8/128)**64``, under 2%);
- experts with biases, activations other than SwiGLU, or a dense projection take the
  workspace path at every size; on a CPU the workspace is the torch reference's decoding.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Hashable, cast

import torch
from torch import nn

from tallow.kernels import fused_moe, silu_and_mul, triton_enabled
from tallow.layers import MoEMethod, set_weight_attrs

from . import ops
from .method import to_packed
from .packing import PackedWeight, cat_rows

if TYPE_CHECKING:  # pragma: no cover
    from .scheme import GGUFQuantScheme

_PARTS = ("gate", "up", "down")


class GGUFMoEMethod(MoEMethod):
    """Experts kept in GGML block types (see the module docstring)."""

    def __init__(self, scheme: "GGUFQuantScheme", prefix: str) -> None:
        self.scheme = scheme
        self.prefix = prefix
        #: per expert, its gate, up and down weights until they are stacked
        self.loaded: dict[str, list[PackedWeight | None]] = {}
        #: after loading: "w13" (gate and up of one type), or "gate" and "up"; and "w2"
        self.stacked: dict[str, PackedWeight] = {}

    @property
    def parts(self) -> list[PackedWeight]:
        """The stacked weights (what the scheme's summary counts)."""
        return list(self.stacked.values())

    # -- storage ---------------------------------------------------------------------------
    def create_weights(
        self,
        layer: nn.Module,
        num_experts: int,
        hidden_size: int,
        intermediate_per_rank: int,
        bias: bool,
        params_dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.num_experts, self.hidden = num_experts, hidden_size
        self.inter = intermediate_per_rank
        self.dtype, self.device = params_dtype, torch.device(device)
        self.loaded = {part: [None] * num_experts for part in _PARTS}
        for name in ("w13_weight", "w2_weight"):
            placeholder = nn.Parameter(
                torch.empty(0, dtype=torch.uint8, device=device), requires_grad=False
            )
            set_weight_attrs(
                placeholder,
                expert_dim=0,
                output_dim=1,
                input_dim=2,
                weight_loader=self._loader(layer),
                accepts_quantized=True,
            )
            if self.scheme.isq:
                set_weight_attrs(placeholder, random_fill=self._random_fill(name))
            layer.register_parameter(name, placeholder)
        if bias:  # biases stay float: the experts' module loads them like float experts'
            e, i, h = num_experts, intermediate_per_rank, hidden_size
            for name, shape in (("w13_bias", (e, 2 * i)), ("w2_bias", (e, h))):
                p = nn.Parameter(
                    torch.zeros(*shape, dtype=params_dtype, device=device), requires_grad=False
                )
                set_weight_attrs(p, expert_dim=0, output_dim=1, input_dim=None)
                layer.register_parameter(name, p)

    def _what(self, layer: nn.Module) -> str:
        return self.prefix or type(layer).__name__

    def _loader(self, layer: nn.Module) -> Any:  # Any: a weight_loader callable
        def load(param: torch.Tensor, loaded: Any, shard_id: Hashable | None = None) -> None:
            is_w13 = param is getattr(layer, "w13_weight")
            for e, part, src in layer.expert_tensors(loaded, shard_id):
                self._load_expert(layer, is_w13, e, part, src)

        return load

    def _load_expert(
        self, layer: nn.Module, is_w13: bool, e: int, part: str | None, src: Any
    ) -> None:
        what = f"{self._what(layer)} expert {e}"
        full_i = int(getattr(layer, "intermediate_size"))
        rank, i = int(getattr(layer, "tp_rank")), self.inter
        tp = int(getattr(layer, "tp_size"))
        if is_w13:
            if part not in (None, "gate", "up"):
                raise ValueError(f"{what}: the gate/up projection has no part {part!r}")
            expected = (full_i if part else 2 * full_i, self.hidden)
            if tuple(src.shape) != expected:
                raise ValueError(
                    f"{what}: {part or 'gate_up'} tensor has shape "
                    f"{tuple(src.shape)}, expected {expected}"
                )
            for name, base in ((part, 0),) if part else (("gate", 0), ("up", full_i)):
                rows = (base + rank * i, base + (rank + 1) * i)
                self._put(
                    name,
                    e,
                    to_packed(src, rows, None, self.scheme.isq, self.device, self.dtype, what, tp),
                    what,
                )
            return
        if part not in (None, "down"):
            raise ValueError(f"{what}: the down projection has no part {part!r}")
        if tuple(src.shape) != (self.hidden, full_i):
            raise ValueError(
                f"{what}: down tensor has shape {tuple(src.shape)}, expected "
                f"{(self.hidden, full_i)}"
            )
        self._put(
            "down",
            e,
            to_packed(
                src,
                (0, self.hidden),
                (rank * i, (rank + 1) * i),
                self.scheme.isq,
                self.device,
                self.dtype,
                what,
                tp,
            ),
            what,
        )

    def _put(self, part: str, e: int, packed: PackedWeight, what: str) -> None:
        if self.loaded[part][e] is not None:
            raise ValueError(f"{what}: its {part} weight is loaded twice")
        self.loaded[part][e] = packed

    def _random_fill(self, name: str) -> Any:  # Any: a random_fill callable
        @torch.no_grad()
        def fill(generator: torch.Generator, std: float) -> None:
            """Random float experts ~ N(0, std), quantized one expert at a time."""
            from .isq import quantize_rows

            isq = cast(str, self.scheme.isq)
            rows, cols = (
                (2 * self.inter, self.hidden) if name == "w13_weight" else (self.hidden, self.inter)
            )
            for e in range(self.num_experts):
                w = torch.empty(rows, cols, dtype=torch.float32, device=self.device)
                w.normal_(0.0, std, generator=generator)
                if name == "w13_weight":
                    self.loaded["gate"][e] = quantize_rows(
                        w[: self.inter], isq, self.device, self.dtype
                    )
                    self.loaded["up"][e] = quantize_rows(
                        w[self.inter :], isq, self.device, self.dtype
                    )
                else:
                    self.loaded["down"][e] = quantize_rows(w, isq, self.device, self.dtype)

        return fill

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        if self.stacked:  # already stacked (a second call finds nothing left to do)
            return
        what = self._what(layer)
        for part, experts in self.loaded.items():
            missing = [e for e, p in enumerate(experts) if p is None]
            if missing:
                raise ValueError(
                    f"{what}: the {part} weight of expert(s) {missing} was never loaded"
                )
        loaded = cast(dict[str, list[PackedWeight]], self.loaded)
        gates, ups = loaded["gate"], loaded["up"]
        try:
            if gates[0].type_name == ups[0].type_name:
                self.stacked["w13"] = cat_rows([w for pair in zip(gates, ups) for w in pair])
            else:
                self.stacked["gate"], self.stacked["up"] = cat_rows(gates), cat_rows(ups)
            self.stacked["w2"] = cat_rows(loaded["down"])
        except ValueError:
            kinds = {
                part: sorted({p.type_name for p in experts}) for part, experts in loaded.items()
            }
            raise ValueError(
                f"{what}: the experts of one projection must share one type, got {kinds}"
            ) from None
        self.loaded = {}
        for name, packed in self.stacked.items():
            for plane, tensor in packed.planes.items():
                layer.register_buffer(f"{name}_{plane}", tensor, persistent=False)
        if self.device.type == "cuda":
            # compile the decode kernels (and make the per-device tables) before any capture
            x = torch.zeros(1, self.hidden, dtype=self.dtype, device=self.device)
            ids = torch.zeros(1, 1, dtype=torch.long, device=self.device)
            self.apply(layer, x, torch.ones(1, 1, device=self.device), ids)

    # -- compute ---------------------------------------------------------------------------
    def _decodes(self, layer: nn.Module, tokens: int) -> bool:
        """Whether ``tokens`` take the decode kernels (see the module docstring)."""
        return (
            tokens <= self.scheme.policy.moe_decode_max_tokens
            and getattr(layer, "activation") == "silu"
            and getattr(layer, "w13_bias", None) is None
            and all(p.qtype is not None for p in self.stacked.values())
        )

    def _config(self, p: PackedWeight, rows: int, device: torch.device) -> Any:
        """The GEMV configuration of one expert's ``[rows, K]`` matrix at one row."""
        choice = self.scheme.policy.choice(p.type_name, rows, p.cols, 1, device, fused=True)
        return choice.config if choice.path == "gemv" else None

    def dequantized(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Every expert decoded: ``w13 [E, 2I, H]`` and ``w2 [E, H, I]`` in ``dtype``."""
        e, i, h = self.num_experts, self.inter, self.hidden
        if "w13" in self.stacked:
            w13 = ops.dequantize(self.stacked["w13"], dtype).view(e, 2 * i, h)
        else:
            w13 = torch.cat(
                [
                    ops.dequantize(self.stacked["gate"], dtype).view(e, i, h),
                    ops.dequantize(self.stacked["up"], dtype).view(e, i, h),
                ],
                dim=1,
            )
        return w13, ops.dequantize(self.stacked["w2"], dtype).view(e, h, i)

    def apply(
        self, layer: nn.Module, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        if not triton_enabled(x) or not self._decodes(layer, x.shape[0]):
            w13, w2 = self.dequantized(x.dtype)
            return fused_moe(
                x,
                w13,
                w2,
                topk_weights,
                topk_ids,
                activation=getattr(layer, "activation"),
                w13_bias=getattr(layer, "w13_bias", None),
                w2_bias=getattr(layer, "w2_bias", None),
                swiglu_alpha=getattr(layer, "swiglu_alpha"),
                swiglu_limit=getattr(layer, "swiglu_limit"),
            )
        from .kernels.moe import moe_down_triton, moe_up_triton

        e, i = self.num_experts, self.inter
        if "w13" in self.stacked:
            w13 = self.stacked["w13"]
            h = moe_up_triton(
                x, w13, e, topk_ids, swiglu=True, config=self._config(w13, 2 * i, x.device)
            )
        else:
            halves = [
                moe_up_triton(
                    x,
                    self.stacked[part],
                    e,
                    topk_ids,
                    swiglu=False,
                    config=self._config(self.stacked[part], i, x.device),
                )
                for part in ("gate", "up")
            ]
            h = silu_and_mul(torch.cat(halves, dim=-1))
        w2 = self.stacked["w2"]
        return moe_down_triton(
            h,
            w2,
            e,
            topk_weights,
            topk_ids,
            out_dtype=x.dtype,
            config=self._config(w2, self.hidden, x.device),
        )
