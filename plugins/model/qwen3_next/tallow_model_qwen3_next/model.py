"""Qwen3-Next: a decoder whose layers mix gated full attention with Gated DeltaNet linear
attention, each followed by a mixture of experts with a gated shared expert.

Per layer ``i`` (``layer_types[i]``; when absent, every ``full_attention_interval``-th layer
is full attention, the others linear):

- ``full_attention``: :class:`GatedAttention`: q (with a per-head output gate, one projection
  of ``2 * D`` per head), k, v; RMSNorm over each q and k head (the ``1 + weight`` form);
  RoPE over ``partial_rotary_factor`` of each head; paged attention; the output times
  ``sigmoid(gate)`` into ``o_proj``;
- ``linear_attention``: :class:`~tallow_model_qwen3_next.gated_deltanet.GatedDeltaNet` on the
  engine's recurrent-state slots.

The MLP is :class:`tallow.layers.FusedMoE` (softmax top-k, ``norm_topk_prob``, a shared
expert scaled by ``sigmoid(shared_expert_gate(x))``) when the layer is not in
``mlp_only_layers`` and ``(i + 1)`` is a multiple of ``decoder_sparse_step``, else a dense
SwiGLU MLP of ``intermediate_size``. Every RMSNorm of the residual stream and the final norm
scale by ``1 + weight``. Checkpoint names: :mod:`tallow_model_qwen3_next.naming`; llama.cpp's
GGUF files (``qwen3next``): :mod:`tallow_model_qwen3_next.gguf_layout`.
"""

from __future__ import annotations

from typing import Any, ClassVar, Iterable

import torch
from torch import nn

from tallow.layers import (
    ArchConfig,
    Attention,
    BuildContext,
    CausalLM,
    ColumnParallelLinear,
    FusedMoE,
    LMHead,
    MergedColumnParallelLinear,
    QuantizedWeight,
    RMSNorm,
    RotaryEmbedding,
    RouterSpec,
    RowParallelLinear,
    VocabEmbedding,
    WeightLoadError,
    WeightNameMap,
    get_act_and_mul,
    rope_from_config,
)

from .gated_deltanet import GatedDeltaNet
from .gguf_layout import GGUFLayout, hybrid_config_from_gguf, recording
from .mtp import Qwen3NextMTPHead
from .naming import gguf_name_map, hf_name_map

LAYER_TYPES = ("full_attention", "linear_attention")


def layer_types(config: ArchConfig) -> list[str]:
    """Each layer's token mixer (see the module docstring)."""
    n = int(config.require("num_hidden_layers"))
    types = config.get("layer_types")
    if not types:
        interval = int(config.get("full_attention_interval") or 4)
        types = [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)
        ]
    if len(types) != n or any(t not in LAYER_TYPES for t in types):
        raise ValueError(
            f"model config: layer_types must list {n} entries, each one of "
            f"{LAYER_TYPES}; got {types!r}"
        )
    return list(types)


def is_moe_layer(config: ArchConfig, layer: int) -> bool:
    """Whether decoder layer ``layer`` has the MoE block (transformers' rule)."""
    step = int(config.get("decoder_sparse_step") or 1)
    return (
        layer not in (config.get("mlp_only_layers") or [])
        and int(config.get("num_experts") or 0) > 0
        and (layer + 1) % step == 0
    )


class GatedAttention(nn.Module):
    """Full attention with a sigmoid output gate per head (see the module docstring)."""

    def __init__(
        self,
        config: ArchConfig,
        build: BuildContext,
        layer_index: int,
        rotary: RotaryEmbedding,
        head_dim: int,
        prefix: str,
    ) -> None:
        super().__init__()
        hidden = int(config.hidden_size)
        heads = int(config.require("num_attention_heads"))
        kv_heads = int(config.get("num_key_value_heads") or heads)
        bias = bool(config.get("attention_bias", False))
        eps = float(config.get("rms_norm_eps", 1e-6))
        self.head_dim = head_dim
        # per head: D query features, then D gate features
        self.q_proj = ColumnParallelLinear(
            hidden, 2 * heads * head_dim, bias, build=build, prefix=f"{prefix}.q_proj"
        )
        self.kv_proj = MergedColumnParallelLinear(
            hidden, [kv_heads * head_dim] * 2, bias, build=build, prefix=f"{prefix}.kv_proj"
        )
        self.o_proj = RowParallelLinear(
            heads * head_dim, hidden, bias, build=build, prefix=f"{prefix}.o_proj"
        )
        self.q_norm = RMSNorm(head_dim, eps, offset=True, build=build)
        self.k_norm = RMSNorm(head_dim, eps, offset=True, build=build)
        self.rotary_emb = rotary
        self.num_heads = heads // build.tp_size
        self.num_kv_heads = max(1, kv_heads // build.tp_size)
        self.attn = Attention(
            layer_index, self.num_heads, self.num_kv_heads, head_dim, scale=head_dim**-0.5
        )

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        t, d = hidden.shape[0], self.head_dim
        q_gate = self.q_proj(hidden).view(t, self.num_heads, 2 * d)
        q, gate = q_gate[..., :d], q_gate[..., d:].reshape(t, -1)
        k, v = self.kv_proj(hidden).split(self.num_kv_heads * d, dim=-1)
        q = self.q_norm(q).reshape(t, -1)
        k = self.k_norm(k.reshape(t, self.num_kv_heads, d)).reshape(t, -1)
        q, k = self.rotary_emb(positions, q, k)
        out = self.attn(q, k, v) * torch.sigmoid(gate)
        return self.o_proj(out)


class DenseMLP(nn.Module):
    """``down(silu(gate(x)) * up(x))``, gate and up stored as one matrix."""

    def __init__(self, hidden: int, intermediate: int, build: BuildContext, prefix: str) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden, [intermediate] * 2, build=build, prefix=f"{prefix}.gate_up_proj"
        )
        self.down_proj = RowParallelLinear(
            intermediate, hidden, build=build, prefix=f"{prefix}.down_proj"
        )
        self.act_fn = get_act_and_mul("silu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.gate_up_proj(x), act=self.act_fn)


def moe_block(config: ArchConfig, build: BuildContext, prefix: str) -> FusedMoE:
    """Softmax top-k experts and the sigmoid-gated shared expert of one layer."""
    return FusedMoE(
        int(config.require("num_experts")),
        int(config.hidden_size),
        int(config.require("moe_intermediate_size")),
        router=RouterSpec(
            top_k=int(config.require("num_experts_per_tok")),
            renormalize=bool(config.get("norm_topk_prob", True)),
        ),
        shared_intermediate_size=int(config.require("shared_expert_intermediate_size")),
        shared_gate=True,
        build=build,
        prefix=prefix,
    )


class DecoderLayer(nn.Module):
    """Pre-norm token mixer and MLP on a residual stream (the add fused into the next norm).
    Exactly one of ``self_attn`` / ``linear_attn`` is set."""

    def __init__(
        self,
        config: ArchConfig,
        build: BuildContext,
        layer: int,
        kind: str,
        rotary: RotaryEmbedding,
        head_dim: int,
    ) -> None:
        super().__init__()
        prefix = f"model.layers.{layer}"
        hidden = int(config.hidden_size)
        eps = float(config.get("rms_norm_eps", 1e-6))
        self.self_attn = (
            GatedAttention(config, build, layer, rotary, head_dim, f"{prefix}.self_attn")
            if kind == "full_attention"
            else None
        )
        self.linear_attn = (
            GatedDeltaNet(config, build, f"{prefix}.linear_attn")
            if kind == "linear_attention"
            else None
        )
        self.mlp: nn.Module = (
            moe_block(config, build, f"{prefix}.mlp")
            if is_moe_layer(config, layer)
            else DenseMLP(hidden, int(config.require("intermediate_size")), build, f"{prefix}.mlp")
        )
        self.input_layernorm = RMSNorm(hidden, eps, offset=True, build=build)
        self.post_attention_layernorm = RMSNorm(hidden, eps, offset=True, build=build)

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        if self.self_attn is not None:
            hidden = self.self_attn(positions, hidden)
        else:
            assert self.linear_attn is not None
            hidden = self.linear_attn(hidden)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class Qwen3NextModel(nn.Module):
    """Embedding, decoder layers, final norm."""

    def __init__(self, config: ArchConfig, build: BuildContext) -> None:
        super().__init__()
        hidden = int(config.require("hidden_size"))
        heads = int(config.require("num_attention_heads"))
        head_dim = int(config.get("head_dim") or hidden // heads)
        self.rotary_emb = rope_from_config(config, head_dim, device=build.device)
        self.embed_tokens = VocabEmbedding(
            int(config.require("vocab_size")), hidden, build=build, prefix="model.embed_tokens"
        )
        self.layers = nn.ModuleList(
            [
                DecoderLayer(config, build, i, kind, self.rotary_emb, head_dim)
                for i, kind in enumerate(layer_types(config))
            ]
        )
        self.norm = RMSNorm(
            hidden, float(config.get("rms_norm_eps", 1e-6)), offset=True, build=build
        )

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        residual = None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class Qwen3NextForCausalLM(GGUFLayout, CausalLM):
    """Qwen3-Next (Qwen3-Next-80B-A3B): see the module docstring."""

    hf_architectures = ("Qwen3NextForCausalLM",)
    gguf_architectures = ("qwen3next",)
    model_type = "qwen3_next"
    tasks = ("generate",)
    weight_name_maps = {"hf": hf_name_map(), "gguf": gguf_name_map(tiled_v_heads=False)}
    #: whether the family always has experts (True), never (False), or the file says (None)
    gguf_experts: ClassVar[bool | None] = None

    def __init__(self, config: ArchConfig | dict[str, Any], build: BuildContext) -> None:
        super().__init__(config, build)
        cfg = self.config
        self.model = Qwen3NextModel(cfg, build)
        tie = bool(cfg.get("tie_word_embeddings", False))
        self.lm_head = LMHead(
            int(cfg.vocab_size),
            int(cfg.hidden_size),
            tie_with=self.model.embed_tokens if tie else None,
            build=build,
            prefix="lm_head",
        )
        # the MTP head (speculative.method mtp): not a submodule, the model's forward and
        # KV cache know nothing of it
        self._mtp: list[Qwen3NextMTPHead] = (
            [Qwen3NextMTPHead(self, cfg, build)] if build.mtp else []
        )

    def mtp_head(self) -> Qwen3NextMTPHead | None:
        return self._mtp[0] if self._mtp else None

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)

    @classmethod
    def config_from_gguf(cls, metadata: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
        return hybrid_config_from_gguf(
            metadata,
            config,
            hf_architecture=cls.hf_architectures[0],
            model_type=cls.model_type,
            experts=cls.gguf_experts,
        )

    def weight_names(self, naming: str) -> WeightNameMap:
        names = super().weight_names(naming)
        # the blocks past the decoder's are multi-token-prediction layers
        return self.gguf_names(names) if naming == "gguf" else names  # type: ignore[return-value]

    def load_weights(
        self, tensors: Iterable[tuple[str, torch.Tensor | QuantizedWeight]], naming: str = "hf"
    ) -> set[str]:
        """As :meth:`CausalLM.load_weights`; a GGUF file that lacks tensors its layers need
        is refused naming those tensors. With the MTP head built, the checkpoint's ``mtp.*``
        tensors load into it (a checkpoint without them leaves the model without a head)."""
        if naming != "gguf":
            head = self.mtp_head()
            if head is None:
                return super().load_weights(tensors, naming)
            own: list[tuple[str, torch.Tensor | QuantizedWeight]] = []

            def model_tensors() -> Iterable[tuple[str, torch.Tensor | QuantizedWeight]]:
                for name, tensor in tensors:
                    if name.startswith("mtp."):
                        own.append((name, tensor))
                    else:
                        yield name, tensor

            loaded = super().load_weights(model_tensors(), naming)
            if own:
                head.load_weights(own, naming)
            else:
                self._mtp.clear()
            return loaded
        seen: set[str] = set()
        try:
            return super().load_weights(recording(tensors, seen), naming)
        except WeightLoadError as exc:
            moe = [is_moe_layer(self.config, i) for i in range(len(self.model.layers))]
            self.check_gguf_tensors(seen, layer_types(self.config), moe, exc)
            raise

    # -- loading: the checkpoint layouts of the linear-attention projections ---------------
    def _linear_attn(self, groups: dict[str, str]) -> GatedDeltaNet:
        layer = self.model.layers[int(groups["i"])].linear_attn
        if layer is None:
            raise ValueError(
                f"layer {groups['i']} is a full-attention layer, but the "
                "checkpoint has linear-attention tensors for it"
            )
        return layer

    def qkvz_rows(self, tensor: torch.Tensor, groups: dict[str, str]) -> torch.Tensor:
        return self._linear_attn(groups).qkvz_rows(tensor)

    def ba_rows(self, tensor: torch.Tensor, groups: dict[str, str]) -> torch.Tensor:
        return self._linear_attn(groups).ba_rows(tensor)

    def qkvz_scale_rows(self, tensor: torch.Tensor, groups: dict[str, str]) -> torch.Tensor:
        gdn = self._linear_attn(groups)
        rows = 2 * gdn.key_dim + 2 * gdn.value_dim
        what = f"layer {groups['i']} in_proj_qkvz.{groups['s']}"
        return gdn.scale_rows(tensor, rows, what, gdn.qkvz_rows)

    def ba_scale_rows(self, tensor: torch.Tensor, groups: dict[str, str]) -> torch.Tensor:
        gdn = self._linear_attn(groups)
        what = f"layer {groups['i']} in_proj_ba.{groups['s']}"
        return gdn.scale_rows(tensor, 2 * gdn.num_v_heads, what, gdn.ba_rows)

    def conv_taps(self, tensor: torch.Tensor, groups: dict[str, str]) -> torch.Tensor:
        """``conv1d.weight`` ``[channels, 1, K]`` as ``[channels, K]``."""
        return tensor.reshape(tensor.shape[0], -1)
