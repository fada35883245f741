"""DeepSeek-V2 and DeepSeek-V3 (and R1, which is V3's architecture): multi-head latent
attention (:class:`tallow.layers.MLAAttention`) and a mixture of experts with shared experts,
on tallow-model-llama's decoder (embedding, pre-norm residual layers, final norm, head).

=========== ================================ ==========================================
model       router                           attention
=========== ================================ ==========================================
V2 / V2.5   softmax; ``topk_method``          MLA; queries straight from the hidden state
            ``greedy`` or                     (``q_lora_rank`` None, V2-Lite) or through
            ``group_limited_greedy`` (groups  a low-rank ``q_a_proj`` / ``q_b_proj``;
            by their best expert); no         YaRN with ``mscale_all_dim`` folded into the
            renormalisation                   softmax scale
V3 / R1     sigmoid plus                     the same (``rope_interleave``: the rotary
            ``e_score_correction_bias`` for   pairs are interleaved; False: rotate-half)
            the choice; groups by their two
            best; ``norm_topk_prob``
GLM-4.7-    V3's                             V3's; the rope over all ``qk_rope_head_dim``
Flash                                         features (``partial_rotary_factor`` 1)
=========== ================================ ==========================================

All: the first ``first_k_dense_replace`` layers have a dense SwiGLU MLP of
``intermediate_size``, the others (every ``moe_layer_freq``-th) the MoE block of
``n_routed_experts`` experts of ``moe_intermediate_size``, ``num_experts_per_tok`` per token,
weights times ``routed_scaling_factor``, plus ``n_shared_experts`` shared experts (one MLP of
``n_shared_experts * moe_intermediate_size``) every token goes through. GLM-4.7-Flash
(``Glm4MoeLiteForCausalLM``) is V3's architecture whose config may list each layer's MLP in
``mlp_layer_types`` (``dense`` / ``sparse``) instead.

Attention of one layer (``H`` heads, ``R`` = ``kv_lora_rank``, ``Dn``/``Dr``/``Dv`` =
``qk_nope_head_dim``/``qk_rope_head_dim``/``v_head_dim``)::

    q      = q_b_proj(q_a_layernorm(q_a_proj(x)))  or  q_proj(x)     [T, H, Dn + Dr]
    c, kpe = kv_a_proj_with_mqa(x)                                    [T, R], [T, Dr]
    latent = [kv_a_layernorm(c), rope(kpe)]      (cached: one row per token for all heads)
    out    = o_proj(MLA(q with rope(q_pe), latent; kv_b_proj's W_UK, W_UV))

Under tensor parallelism the heads are split (``q_proj``/``q_b_proj``/``kv_b_proj`` by
column, ``o_proj`` by row), the latent projections are replicated and every rank caches the
whole latent. Checkpoint names: :mod:`tallow_model_deepseek.naming`; the multi-token
prediction layers of V3 checkpoints (``model.layers.{num_hidden_layers}...``) are skipped,
unless ``build.mtp`` (``speculative.method: mtp``) asks for the first of them, the head of
:mod:`tallow_model_deepseek.mtp` (``mtp_head()``).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Iterable

import torch
from torch import nn

from tallow.layers import (
    ArchConfig,
    BuildContext,
    ColumnParallelLinear,
    FusedMoE,
    MLAAttention,
    QuantizedWeight,
    ReplicatedLinear,
    RMSNorm,
    RotaryEmbedding,
    RouterSpec,
    RowParallelLinear,
)
from tallow_model_llama.model import LlamaForCausalLM

from .mtp import DeepseekMTPHead
from .naming import hf_name_map, mtp_layer

#: transformers' epsilon of the q and kv low-rank norms (not the config's rms_norm_eps)
LORA_NORM_EPS = 1e-6


def _int(config: ArchConfig, key: str) -> int:
    value = config.get(key)
    if value is None:
        raise ValueError(f"model config: {key!r} is required for DeepSeek latent attention")
    return int(value)


def softmax_scale(config: ArchConfig) -> float:
    """``(Dn + Dr) ** -0.5``, times ``mscale(factor, mscale_all_dim) ** 2`` under YaRN with
    ``mscale_all_dim`` (the scale of every dimension of q.k, not only the rotated ones)."""
    scale = (_int(config, "qk_nope_head_dim") + _int(config, "qk_rope_head_dim")) ** -0.5
    params = {**(config.get("rope_scaling") or {}), **(config.get("rope_parameters") or {})}
    rope_type = params.get("rope_type") or params.get("type") or "default"
    all_dim = params.get("mscale_all_dim") or 0
    factor = float(params.get("factor") or 1.0)
    if rope_type != "default" and all_dim and factor > 1:
        mscale = 0.1 * float(all_dim) * math.log(factor) + 1.0
        scale *= mscale * mscale
    return scale


def sigmoid_router(config: ArchConfig) -> RouterSpec:
    """DeepSeek-V3's router (GLM-4.5's too): sigmoid scores, the choice over the
    ``topk_group`` of ``n_group`` groups (by their two best biased scores), weights
    renormalised with ``norm_topk_prob`` and times ``routed_scaling_factor``."""
    return RouterSpec(
        top_k=_int(config, "num_experts_per_tok"),
        scoring="sigmoid",
        renormalize=bool(config.get("norm_topk_prob", True)),
        num_groups=int(config.get("n_group") or 1),
        topk_groups=int(config.get("topk_group") or 1),
        routed_scaling_factor=float(config.get("routed_scaling_factor") or 1.0),
    )


def moe_block(
    config: ArchConfig, build: BuildContext, prefix: str, router: RouterSpec, correction_bias: bool
) -> FusedMoE:
    """The MoE block of one layer: ``n_routed_experts`` SwiGLU experts of
    ``moe_intermediate_size`` and ``n_shared_experts`` shared ones (one MLP)."""
    if config.get("hidden_act", "silu") not in ("silu", "swish"):
        raise ValueError(
            f"model config: hidden_act {config.get('hidden_act')!r} is not "
            "supported by the experts (SwiGLU)"
        )
    inter = _int(config, "moe_intermediate_size")
    shared = int(config.get("n_shared_experts") or 0) * inter
    return FusedMoE(
        _int(config, "n_routed_experts"),
        int(config.hidden_size),
        inter,
        router=router,
        correction_bias=correction_bias,
        shared_intermediate_size=shared,
        build=build,
        prefix=prefix,
    )


class DeepseekAttention(nn.Module):
    """Latent attention of one decoder layer (see the module docstring)."""

    def __init__(
        self,
        config: ArchConfig,
        build: BuildContext,
        layer_index: int,
        rotary: RotaryEmbedding,
        prefix: str,
    ) -> None:
        super().__init__()
        hidden = int(config.hidden_size)
        heads = int(config.num_attention_heads)
        if heads % build.tp_size:
            raise ValueError(
                f"model config: num_attention_heads {heads} does not split over "
                f"{build.tp_size} tensor-parallel ranks"
            )
        self.rank = _int(config, "kv_lora_rank")
        self.nope = _int(config, "qk_nope_head_dim")
        self.rope = _int(config, "qk_rope_head_dim")
        v_dim = _int(config, "v_head_dim")
        bias = bool(config.get("attention_bias", False))
        q_rank = config.get("q_lora_rank")
        q_width = heads * (self.nope + self.rope)
        self.q_proj = self.q_a_proj = self.q_a_layernorm = self.q_b_proj = None
        if q_rank:
            self.q_a_proj = ReplicatedLinear(
                hidden, int(q_rank), bias, build=build, prefix=f"{prefix}.q_a_proj"
            )
            self.q_a_layernorm = RMSNorm(int(q_rank), LORA_NORM_EPS, build=build)
            self.q_b_proj = ColumnParallelLinear(
                int(q_rank), q_width, False, build=build, prefix=f"{prefix}.q_b_proj"
            )
        else:
            self.q_proj = ColumnParallelLinear(
                hidden, q_width, False, build=build, prefix=f"{prefix}.q_proj"
            )
        self.kv_a_proj_with_mqa = ReplicatedLinear(
            hidden, self.rank + self.rope, bias, build=build, prefix=f"{prefix}.kv_a_proj_with_mqa"
        )
        self.kv_a_layernorm = RMSNorm(self.rank, LORA_NORM_EPS, build=build)
        self.kv_b_proj = ColumnParallelLinear(
            self.rank, heads * (self.nope + v_dim), False, build=build, prefix=f"{prefix}.kv_b_proj"
        )
        self.o_proj = RowParallelLinear(
            heads * v_dim, hidden, bias, build=build, prefix=f"{prefix}.o_proj"
        )
        self.rotary_emb = rotary
        self.attn = MLAAttention(
            layer_index,
            heads // build.tp_size,
            kv_lora_rank=self.rank,
            qk_nope_head_dim=self.nope,
            qk_rope_head_dim=self.rope,
            v_head_dim=v_dim,
            scale=softmax_scale(config),
            device=build.device,
            dtype=build.dtype,
        )

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        n = hidden.shape[0]
        if self.q_proj is not None:
            q = self.q_proj(hidden)
        else:
            assert self.q_a_proj is not None and self.q_a_layernorm is not None
            assert self.q_b_proj is not None
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden)))
        q = q.view(n, -1, self.nope + self.rope)
        latent = self.kv_a_proj_with_mqa(hidden)
        c = self.kv_a_layernorm(latent[:, : self.rank].contiguous())
        # the rotary layer may rotate in place: give it copies of the rope parts
        q_pe, k_pe = self.rotary_emb(
            positions, q[..., self.nope :].reshape(n, -1), latent[:, self.rank :].contiguous()
        )
        q = torch.cat([q[..., : self.nope], q_pe.view(n, -1, self.rope)], dim=-1)
        out = self.attn(q.reshape(n, -1), torch.cat([c, k_pe], dim=-1))
        return self.o_proj(out)


class DeepseekV2ForCausalLM(LlamaForCausalLM):
    """DeepSeek-V2, V2-Lite, V2.5, Coder-V2 (see the module docstring)."""

    hf_architectures: ClassVar[tuple[str, ...]] = ("DeepseekV2ForCausalLM",)
    gguf_architectures: ClassVar[tuple[str, ...]] = ()
    model_type: ClassVar[str] = "deepseek_v2"
    tasks: ClassVar[tuple[str, ...]] = ("generate",)
    weight_name_maps = {"hf": hf_name_map()}
    base_model_prefix = None

    def __init__(self, config: ArchConfig | dict[str, Any], build: BuildContext) -> None:
        super().__init__(ArchConfig(self.config_from_hf(dict(config))), build)
        # not a submodule: the model's forward and KV cache know nothing of it
        self._mtp: list[DeepseekMTPHead] = []
        if build.mtp and int(self.config.get("num_nextn_predict_layers") or 0) > 0:
            self._mtp.append(DeepseekMTPHead(self, self.config, build))

    def mtp_head(self) -> DeepseekMTPHead | None:
        return self._mtp[0] if self._mtp else None

    @property  # type: ignore[override]
    def rope_neox_style(self) -> bool:
        """V2 rotates interleaved pairs; V3 too unless ``rope_interleave`` is False."""
        return not bool(self.config.get("rope_interleave", True))

    def build_attention(
        self,
        config: ArchConfig,
        build: BuildContext,
        layer: int,
        rotary: RotaryEmbedding,
        head_dim: int,
        prefix: str,
    ) -> nn.Module:
        return DeepseekAttention(config, build, layer, rotary, prefix)

    def is_moe_layer(self, config: ArchConfig, layer: int) -> bool:
        """The original rule: from ``first_k_dense_replace`` on, every ``moe_layer_freq``-th
        layer (transformers keeps only the first part; released configs have freq 1)."""
        if not int(config.get("n_routed_experts") or 0):
            return False
        first = int(config.get("first_k_dense_replace") or 0)
        return layer >= first and layer % int(config.get("moe_layer_freq") or 1) == 0

    def router(self, config: ArchConfig) -> RouterSpec:
        """V2: softmax, greedy or group-limited greedy (groups by their best expert), no
        renormalisation (as transformers' DeepseekV2 router)."""
        method = config.get("topk_method") or "greedy"
        if method not in ("greedy", "group_limited_greedy"):
            raise ValueError(
                f"model config: topk_method {method!r} is not supported for "
                "DeepSeek-V2 (expected greedy or group_limited_greedy)"
            )
        grouped = method == "group_limited_greedy"
        return RouterSpec(
            top_k=_int(config, "num_experts_per_tok"),
            scoring="softmax",
            num_groups=int(config.get("n_group") or 1) if grouped else 1,
            topk_groups=int(config.get("topk_group") or 1) if grouped else 1,
            routed_scaling_factor=float(config.get("routed_scaling_factor") or 1.0),
            group_score="max",
        )

    correction_bias: ClassVar[bool] = False

    def build_mlp(
        self, config: ArchConfig, build: BuildContext, layer: int, prefix: str
    ) -> nn.Module:
        if not self.is_moe_layer(config, layer):
            return super().build_mlp(config, build, layer, prefix)
        return moe_block(config, build, prefix, self.router(config), self.correction_bias)

    # -- loading ---------------------------------------------------------------------------
    def load_weights(
        self, tensors: Iterable[tuple[str, torch.Tensor | QuantizedWeight]], naming: str = "hf"
    ) -> set[str]:
        layers = int(self.config.num_hidden_layers)
        head = self.mtp_head()
        # the head's tensors (its first layer's; later MTP layers are not run) are kept
        # aside while the model's stream past, then loaded into the head
        own: list[tuple[str, torch.Tensor | QuantizedWeight]] = []

        def model_tensors() -> Iterable[tuple[str, torch.Tensor | QuantizedWeight]]:
            for name, t in tensors:
                if not mtp_layer(name, layers):
                    yield name, t
                elif (
                    head is not None and mtp_layer(name, layers) and not mtp_layer(name, layers + 1)
                ):
                    own.append((name, t))

        loaded = super().load_weights(model_tensors(), naming)
        if head is not None:
            head.load_weights(own, naming)
        return loaded

    def process_weights_after_loading(self) -> None:
        super().process_weights_after_loading()
        for module in self.modules():
            if isinstance(module, DeepseekAttention):
                module.attn.absorb(module.kv_b_proj)

    def resolve_missing(self, missing: set[str], naming: str) -> set[str]:
        return set()

    @classmethod
    def config_from_hf(cls, config: dict[str, Any]) -> dict[str, Any]:
        """The rotary layer turns ``qk_rope_head_dim`` features (what transformers' config
        calls ``head_dim``)."""
        cfg = dict(config)
        if cfg.get("qk_rope_head_dim"):
            cfg["head_dim"] = int(cfg["qk_rope_head_dim"])
        return cfg

    @classmethod
    def config_from_gguf(cls, metadata: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
        raise ValueError(f"{cls.__name__} does not load GGUF files")


class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM):
    """DeepSeek-V3 and R1: sigmoid routing with a correction bias over groups of experts."""

    hf_architectures = ("DeepseekV3ForCausalLM",)
    model_type = "deepseek_v3"
    correction_bias = True

    def router(self, config: ArchConfig) -> RouterSpec:
        return sigmoid_router(config)


class Glm4MoeLiteForCausalLM(DeepseekV3ForCausalLM):
    """GLM-4.7-Flash: DeepSeek-V3's latent attention and router; which layers are MoE comes
    from ``mlp_layer_types`` when the config lists it (transformers' rule), else from
    ``first_k_dense_replace`` (a dense first layer when neither says, as transformers)."""

    hf_architectures = ("Glm4MoeLiteForCausalLM",)
    model_type = "glm4_moe_lite"

    def is_moe_layer(self, config: ArchConfig, layer: int) -> bool:
        if not int(config.get("n_routed_experts") or 0):
            return False
        types = config.get("mlp_layer_types")
        if layer >= int(config.num_hidden_layers):  # the multi-token prediction layer
            return True
        if types is None:
            return layer >= int(config.get("first_k_dense_replace", 1) or 0)
        if len(types) != int(config.num_hidden_layers) or set(types) - {"dense", "sparse"}:
            raise ValueError(
                f"model config: mlp_layer_types must list 'dense' or 'sparse' for "
                f"each of the {config.num_hidden_layers} layers, got {types!r}"
            )
        return types[layer] == "sparse"

    @classmethod
    def config_from_hf(cls, config: dict[str, Any]) -> dict[str, Any]:
        """As V3; a ``partial_rotary_factor`` other than 1 is refused: the latent's rope part
        is ``qk_rope_head_dim`` wide and transformers' attention rotates all of it."""
        cfg = super().config_from_hf(config)
        params = cfg.get("rope_parameters") or {}
        factor = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
        if float(factor if factor is not None else 1.0) != 1.0:
            raise ValueError(
                f"model config: partial_rotary_factor {factor} is not supported "
                "for GLM-4.7-Flash latent attention (expected 1.0)"
            )
        return cfg
