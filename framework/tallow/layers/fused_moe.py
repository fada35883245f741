"""A mixture-of-experts MLP block: router, routed experts, optional shared expert.

Example (Qwen3-MoE's block; the names match its checkpoints under ``prefix``)::

    from tallow.layers import FusedMoE, RouterSpec

    mlp = FusedMoE(num_experts=128, hidden_size=2048, intermediate_size=768,
                   router=RouterSpec(top_k=8, renormalize=True),
                   build=build, prefix="model.layers.0.mlp")
    out = mlp(hidden)                      # [T, 2048] -> [T, 2048]

    # the plugin's weight_name_maps: per-expert and stacked checkpoint forms
    rules = FusedMoE.hf_weight_rules("model.layers.{i}.mlp")

Parameters (``prefix`` ``.gate``, ``.experts``, ``.shared_expert``, ``.shared_expert_gate``,
named as in Hugging Face's MoE models):

- ``gate.weight [E, H]`` (and ``gate.bias`` with ``router_bias``): the router's logits; with
  ``correction_bias`` also ``gate.e_score_correction_bias [E]`` (DeepSeek-V3, GLM-4.5);
- ``experts.w13_weight [E, 2I/tp, H]`` (each expert's gate rows then its up rows) and
  ``experts.w2_weight [E, H, I/tp]``, with ``expert_bias`` also ``experts.w13_bias`` and
  ``experts.w2_bias`` (gpt-oss). They load from per-expert tensors
  (``experts.{e}.gate_proj.weight`` ...), from the stacked forms transformers 5 uses in
  memory (``experts.gate_up_proj [E, 2I, H]``, ``experts.down_proj [E, H, I]``), or from one
  part of every expert stacked (shard ``("*", "gate")``: GGUF's ``ffn_gate_exps [E, I, H]``,
  :meth:`FusedMoE.gguf_weight_rules`);
- with ``shared_intermediate_size``, ``shared_expert`` (a gated MLP every token goes through,
  ``gate_up_proj`` / ``down_proj``) and with ``shared_gate`` its scalar gate
  ``shared_expert_gate.weight [1, H]``: ``sigmoid(x · g) * shared(x)`` (Qwen2-MoE).

Tensor parallelism splits every expert (and the shared expert) along its intermediate size;
each rank computes a partial sum of the block's output and one all-reduce at the end adds
them (the expert ``w2_bias`` is held by rank 0 only, so it is added once). With
``build.expert_parallel`` (``parallel.enable_expert_parallel``) the routed experts are placed
whole on the ranks instead, ``E / tp`` each (their parameters ``[E / tp, ...]``; the loader
keeps only this rank's experts of a checkpoint), and each rank's share of the tokens travels
to their experts' ranks and back by all-to-all (:mod:`tallow.layers.moe_dispatch`); the shared
expert stays split along its intermediate size, and the same one all-reduce ends the block.

How the experts are stored and run is the :class:`~tallow.layers.MoEMethod` that
``build.quant`` assigns (float experts unless the scheme has its own; see
:mod:`tallow.layers.moe_method`).
"""

from __future__ import annotations

from typing import Any, Hashable

import torch
from torch import nn

from tallow.kernels.moe import ACTIVATIONS

from .activation import SiluAndMul
from .linear import MergedColumnParallelLinear, ReplicatedLinear, RowParallelLinear
from .linear_method import WeightSlice, set_weight_attrs
from .model import BuildContext
from .moe_dispatch import ExpertPlacement, dispatch_combine, token_shard
from .moe_method import moe_method_for
from .moe_router import RouterSpec, select_experts
from .quantized import QuantizedWeight
from .parallel import all_reduce, divide
from .weight_names import WeightRule

#: per-expert checkpoint names → (stacked parameter, part)
_EXPERT_PARTS = {
    "gate_proj": ("w13", "gate"),
    "up_proj": ("w13", "up"),
    "down_proj": ("w2", "down"),
}


class FusedExperts(nn.Module):
    """The routed experts of a :class:`FusedMoE`: stacked parameters, their loader, and the
    :class:`~tallow.layers.MoEMethod` that runs them.

    ``tp_rank`` / ``tp_size`` say how each expert is split along its intermediate size (0 and
    1 under expert parallelism); ``placement`` which experts this rank holds (all of them
    without expert parallelism): the parameters stack those ``placement.num_local``."""

    def __init__(
        self,
        num_experts: int,
        hidden_size: int,
        intermediate_size: int,
        *,
        bias: bool,
        activation: str,
        swiglu_alpha: float,
        swiglu_limit: float,
        build: BuildContext,
        prefix: str,
    ) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        expert_parallel = build.expert_parallel and build.tp_size > 1
        try:
            self.placement = ExpertPlacement(
                num_experts,
                build.tp_rank if expert_parallel else 0,
                build.tp_size if expert_parallel else 1,
            )
        except ValueError as exc:
            raise ValueError(f"{prefix or 'FusedMoE'}: {exc}") from None
        self.tp_rank, self.tp_size = (0, 1) if expert_parallel else (build.tp_rank, build.tp_size)
        self.intermediate_per_rank = divide(
            intermediate_size, self.tp_size, f"{prefix} expert intermediate size"
        )
        self.activation = activation
        self.swiglu_alpha, self.swiglu_limit = swiglu_alpha, swiglu_limit
        self.prefix = prefix
        self.quant_method = moe_method_for(build.quant, prefix)
        self.quant_method.create_weights(
            self,
            self.placement.num_local,
            hidden_size,
            self.intermediate_per_rank,
            bias,
            build.dtype,
            build.device,
        )
        for name, param in self.named_parameters(recurse=False):
            part = ("gate", "up") if name.startswith("w13") else ("down",)
            if not hasattr(param, "shard_ids"):
                set_weight_attrs(
                    param, shard_ids=tuple((str(e), p) for e in range(num_experts) for p in part)
                )
            if not hasattr(param, "shard_cover"):
                set_weight_attrs(param, shard_cover=self.shard_cover)
            if not hasattr(param, "weight_loader"):
                set_weight_attrs(param, weight_loader=self.weight_loader)

    def checkpoint_shape(self, part: str) -> tuple[int, int]:
        """The ``(rows, cols)`` of one expert's whole checkpoint weight of ``part``
        (``"gate"``, ``"up"``: ``(I, H)``; ``"down"``: ``(H, I)``), before any sharding."""
        if part in ("gate", "up"):
            return self.intermediate_size, self.hidden_size
        if part == "down":
            return self.hidden_size, self.intermediate_size
        raise ValueError(
            f"{self.prefix or 'FusedExperts'}: an expert has no part {part!r} "
            "(expected gate, up or down)"
        )

    def weight_slices(self, part: str) -> list[WeightSlice]:
        """This rank's share of one expert's checkpoint weight of ``part`` (one slice): the
        rows (gate, up) or columns (down) of its intermediate features. ``partition`` is the
        block of this rank's stacked rows it fills: ``w13`` rows ``partition * I/tp`` on
        (0 gate, 1 up); ``w2`` has one (0). Quantization methods whose checkpoints store an
        expert as packed tensors cut their unpacked weights with it."""
        i_rank = self.intermediate_per_rank
        span = (self.tp_rank * i_rank, (self.tp_rank + 1) * i_rank)
        self.checkpoint_shape(part)  # refuses an unknown part
        if part == "down":
            return [WeightSlice(0, (0, self.hidden_size), span)]
        return [WeightSlice(0 if part == "gate" else 1, span, None)]

    def shard_cover(self, shard_id: Hashable) -> set[Hashable]:
        """The per-expert shard ids one loaded shard fills: ``("*", part)`` (that part of every
        expert, stacked) fills ``(e, part)`` for each expert; any other id fills itself."""
        if isinstance(shard_id, tuple) and len(shard_id) == 2 and shard_id[0] == "*":
            return {(str(e), shard_id[1]) for e in range(self.num_experts)}
        return {shard_id}

    def expert_tensors(
        self, loaded: Any, shard_id: Hashable | None, projection: str | None = None
    ) -> list[tuple[int, str | None, Any]]:
        """``(local expert, part, tensor)`` for each expert of a checkpoint tensor that this
        rank holds (``placement``; the others' are passed over), the index counted from this
        rank's first expert. ``shard_id`` None: the stacked tensor of every expert
        (``[E, ...]``, part None: the whole projection); ``("*", part)``: one part of every
        expert stacked (GGUF's ``ffn_gate_exps``); ``(expert, part)``: one expert's part.
        ``loaded`` is a float tensor or a :class:`~tallow.layers.QuantizedWeight` (its experts
        are selected as its rows of blocks, still quantized). ``projection`` ``"w13"`` or
        ``"w2"`` names the stacked projection the tensor is loaded into: a whole projection
        (part None) then comes back as its parts (w13's rows split into gate and up), and a
        part that projection does not have is refused."""
        what = self.prefix or "FusedExperts"
        items = self._expert_items(loaded, shard_id, what)
        if projection is None:
            return items
        parts = {"w13": ("gate", "up"), "w2": ("down",)}.get(projection)
        if parts is None:
            raise ValueError(f"{what}: no projection {projection!r} (expected w13 or w2)")
        out: list[tuple[int, str | None, Any]] = []
        for e, part, src in items:
            if part is None:
                out += (
                    list(zip([e, e], parts, src.chunk(2, dim=0)))
                    if projection == "w13"
                    else [(e, "down", src)]
                )
            elif part in parts:
                out.append((e, part, src))
            else:
                raise ValueError(
                    f"{what}: {projection} has no part {part!r} (expected {' or '.join(parts)})"
                )
        return out

    def _expert_items(
        self, loaded: Any, shard_id: Hashable | None, what: str
    ) -> list[tuple[int, str | None, Any]]:
        start = self.placement.start
        if shard_id is None or (
            isinstance(shard_id, tuple) and len(shard_id) == 2 and shard_id[0] == "*"
        ):
            part = None if shard_id is None else str(shard_id[1])
            if len(loaded.shape) < 2 or loaded.shape[0] != self.num_experts:
                raise ValueError(
                    f"{what}: stacked tensor {tuple(loaded.shape)} does not hold "
                    f"{self.num_experts} experts"
                )
            local = range(self.placement.num_local)
            if isinstance(loaded, QuantizedWeight):
                return [(e, part, loaded.select(start + e)) for e in local]
            return [(e, part, loaded[start + e]) for e in local]
        if not isinstance(shard_id, tuple) or len(shard_id) != 2:
            raise ValueError(f"{what}: shard must be (expert, part), got {shard_id!r}")
        e, part = int(shard_id[0]), str(shard_id[1])
        if not 0 <= e < self.num_experts:
            raise ValueError(f"{what}: expert {e} out of range (the layer has {self.num_experts})")
        return [(e - start, part, loaded)] if self.placement.holds(e) else []

    def weight_loader(
        self, param: torch.Tensor, loaded: torch.Tensor, shard_id: Hashable | None = None
    ) -> None:
        """``shard_id`` ``(expert, part)`` (part "gate", "up" or "down"): one expert's
        checkpoint tensor; ``("*", part)``: that part of every expert, stacked; None: the
        stacked tensor of every expert (``[E, ...]``). Only the experts this rank holds are
        copied; see :meth:`expert_tensors`."""
        what = self.prefix or "FusedExperts"
        for e, part, src in self.expert_tensors(loaded, shard_id):
            self._load_expert(param, e, src, part, what)

    def _load_expert(
        self, param: torch.Tensor, e: int, src: torch.Tensor, part: str | None, what: str
    ) -> None:
        dst = param.data[e]
        i_rank, rank = self.intermediate_per_rank, self.tp_rank
        full_i = self.intermediate_size
        shard_ids: tuple[tuple[str, str], ...] = getattr(param, "shard_ids")
        if shard_ids[0][1] == "gate":  # w13: rows are gate then up, I each
            if part not in (None, "gate", "up"):
                raise ValueError(f"{what}: the gate/up projection has no part {part!r}")
            halves = [0, 1] if part is None else [0 if part == "gate" else 1]
            expected = 2 * full_i if part is None else full_i
            if src.shape[0] != expected or src.shape[1:] != dst.shape[1:]:
                raise ValueError(
                    f"{what}: expert {e} {part or 'gate_up'} tensor has shape "
                    f"{tuple(src.shape)}, expected "
                    f"{(expected, *dst.shape[1:])}"
                )
            for half in halves:
                block = src if part is not None else src.narrow(0, half * full_i, full_i)
                with torch.no_grad():
                    dst.narrow(0, half * i_rank, i_rank).copy_(
                        block.narrow(0, rank * i_rank, i_rank)
                    )
            return
        if part not in (None, "down"):
            raise ValueError(f"{what}: the down projection has no part {part!r}")
        if dst.dim() == 1:  # w2_bias [H]: added once, after the sum over ranks
            if tuple(src.shape) != tuple(dst.shape):
                raise ValueError(
                    f"{what}: expert {e} down bias has shape {tuple(src.shape)}, "
                    f"expected {tuple(dst.shape)}"
                )
            with torch.no_grad():
                dst.copy_(src if rank == 0 else torch.zeros_like(src))
            return
        if src.shape[0] != dst.shape[0] or src.shape[1] != full_i:
            raise ValueError(
                f"{what}: expert {e} down tensor has shape {tuple(src.shape)}, "
                f"expected {(dst.shape[0], full_i)}"
            )
        with torch.no_grad():
            dst.copy_(src.narrow(1, rank * i_rank, i_rank))

    def forward(
        self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        return self.quant_method.apply(self, x, topk_weights, topk_ids)


class _SharedExpert(nn.Module):
    """The shared expert's gated MLP, left unreduced (the block reduces once)."""

    def __init__(
        self, hidden: int, intermediate: int, build: BuildContext, prefix: str, act: nn.Module
    ) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden, [intermediate] * 2, build=build, prefix=f"{prefix}.gate_up_proj"
        )
        self.down_proj = RowParallelLinear(
            intermediate, hidden, reduce_results=False, build=build, prefix=f"{prefix}.down_proj"
        )
        self.act_fn = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.gate_up_proj(x), act=self.act_fn)


class FusedMoE(nn.Module):
    """A mixture-of-experts MLP block ``[T, H] -> [T, H]`` (see the module docstring).

    ``router`` picks each token's experts (:class:`RouterSpec`: softmax top-k with or without
    renormalisation, sigmoid with a correction bias and grouped top-k, softmax over the
    selected logits; a routed scaling factor). ``activation`` is ``"silu"`` (SwiGLU),
    ``"swiglu_clamp"`` (gpt-oss: clamped at ``swiglu_limit``, ``alpha`` ``swiglu_alpha``,
    usually with ``expert_bias``) or ``"gelu_tanh"`` (GeGLU, Gemma 4). ``reduce_results=False`` leaves the sum over
    tensor-parallel ranks to the caller (under expert parallelism too: each rank's output
    then holds its share of the tokens and zeros elsewhere, plus its shared-expert part).
    """

    def __init__(
        self,
        num_experts: int,
        hidden_size: int,
        intermediate_size: int,
        *,
        router: RouterSpec,
        build: BuildContext | None = None,
        prefix: str = "",
        router_bias: bool = False,
        correction_bias: bool = False,
        activation: str = "silu",
        expert_bias: bool = False,
        swiglu_alpha: float = 1.702,
        swiglu_limit: float = 7.0,
        shared_intermediate_size: int = 0,
        shared_gate: bool = False,
        reduce_results: bool = True,
    ) -> None:
        super().__init__()
        build = build if build is not None else BuildContext()
        if activation not in ACTIVATIONS:
            raise ValueError(
                f"FusedMoE: activation must be one of {', '.join(ACTIVATIONS)}, got {activation!r}"
            )
        if router.top_k > num_experts:
            raise ValueError(f"FusedMoE: top_k {router.top_k} > {num_experts} experts")
        if correction_bias and router.scoring != "sigmoid":
            raise ValueError("FusedMoE: a correction bias goes with sigmoid scoring")
        if shared_gate and not shared_intermediate_size:
            raise ValueError(
                "FusedMoE: shared_gate needs a shared expert (shared_intermediate_size)"
            )
        self.router = router
        self.tp_size = build.tp_size
        self.reduce_results = reduce_results
        # the router is small and every rank needs all of its logits: replicated
        self.gate = ReplicatedLinear(
            hidden_size, num_experts, router_bias, build=build, prefix=f"{prefix}.gate"
        )
        if correction_bias:
            bias = nn.Parameter(
                torch.zeros(num_experts, dtype=torch.float32, device=build.device),
                requires_grad=False,
            )
            self.gate.register_parameter("e_score_correction_bias", bias)
        self.experts = FusedExperts(
            num_experts,
            hidden_size,
            intermediate_size,
            bias=expert_bias,
            activation=activation,
            swiglu_alpha=swiglu_alpha,
            swiglu_limit=swiglu_limit,
            build=build,
            prefix=f"{prefix}.experts",
        )
        self.shared_expert = (
            _SharedExpert(
                hidden_size,
                shared_intermediate_size,
                build,
                f"{prefix}.shared_expert",
                SiluAndMul(),
            )
            if shared_intermediate_size
            else None
        )
        self.shared_expert_gate = (
            ReplicatedLinear(hidden_size, 1, build=build, prefix=f"{prefix}.shared_expert_gate")
            if shared_gate
            else None
        )

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights float32 ``[T, top_k]``, expert ids int64 ``[T, top_k]``) of ``x``."""
        return select_experts(
            self.gate(x), self.router, getattr(self.gate, "e_score_correction_bias", None)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        if self.experts.placement.size > 1:
            out = self._expert_parallel(x)
        else:
            weights, ids = self.route(x)
            out = self.experts(x, weights, ids)
        if self.shared_expert is not None:
            shared = self.shared_expert(x)
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(x)) * shared
            out = out + shared
        if self.reduce_results:
            out = all_reduce(out, self.tp_size)
        return out.view(shape)

    def _expert_parallel(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's share of the tokens through the experts of every rank
        (:func:`~tallow.layers.moe_dispatch.dispatch_combine`), in a zero ``[T, H]``."""
        tokens = x.shape[0]
        placement = self.experts.placement
        start, end = token_shard(tokens, placement.rank, placement.size)
        weights, ids = self.route(x[start:end])
        # a captured CUDA graph cannot read split sizes on the host: fixed-size exchange
        capacity = (
            -(-tokens // placement.size) * self.router.top_k
            if x.is_cuda and torch.cuda.is_current_stream_capturing()
            else None
        )
        out = x.new_zeros(x.shape)
        out[start:end] = dispatch_combine(
            x[start:end], weights, ids, placement, self.experts, capacity=capacity
        )
        return out

    @staticmethod
    def gguf_weight_rules(block: str, prefix: str) -> list[WeightRule]:
        """Rules mapping llama.cpp's GGUF expert tensors of block template ``block`` (such as
        ``"blk.{i}"``) onto the layer at ``prefix`` (``"model.layers.{i}.mlp"``): the router
        ``ffn_gate_inp`` ``[E, H]`` and the stacked experts ``ffn_gate_exps`` /
        ``ffn_up_exps`` ``[E, I, H]`` and ``ffn_down_exps`` ``[E, H, I]`` (float, or still
        block-quantized for a scheme that keeps them). Shared experts are the model's to map
        (their names and gates differ between families)."""
        experts = f"{prefix}.experts"
        return [
            WeightRule(f"{block}.ffn_gate_inp.weight", f"{prefix}.gate.weight"),
            WeightRule(
                f"{block}.ffn_gate_exps.weight", f"{experts}.w13_weight", shard=("*", "gate")
            ),
            WeightRule(f"{block}.ffn_up_exps.weight", f"{experts}.w13_weight", shard=("*", "up")),
            WeightRule(f"{block}.ffn_down_exps.weight", f"{experts}.w2_weight"),
        ]

    @staticmethod
    def hf_weight_rules(prefix: str) -> list[WeightRule]:
        """Rules mapping a checkpoint's routed-expert tensors under ``prefix`` (a template such
        as ``"model.layers.{i}.mlp"``) onto the stacked parameters: per-expert
        ``experts.{e}.gate_proj|up_proj|down_proj.weight|bias`` and the stacked
        ``experts.gate_up_proj``, ``experts.down_proj`` (and their ``_bias``). The router
        (``gate.*``) and shared-expert names are the model's to map like any linear layer's."""
        rules = [
            WeightRule(
                prefix + ".experts.{e}." + name + ".{kind}",
                prefix + ".experts." + stacked + "_{kind}",
                shard=("{e}", part),
            )
            for name, (stacked, part) in _EXPERT_PARTS.items()
        ]
        for name, stacked in (("gate_up_proj", "w13"), ("down_proj", "w2")):
            rules.append(
                WeightRule(f"{prefix}.experts.{name}", f"{prefix}.experts.{stacked}_weight")
            )
            rules.append(
                WeightRule(f"{prefix}.experts.{name}_bias", f"{prefix}.experts.{stacked}_bias")
            )
        return rules
