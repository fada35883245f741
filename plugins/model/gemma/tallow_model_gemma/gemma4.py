"""Gemma 4 (text) on the building blocks of :mod:`tallow.layers`.

What Gemma 4 changes from Gemma 3 (layer by layer: :mod:`tallow_model_gemma.gemma4_config`):

- RMSNorm scales by ``weight`` (no ``1 +``), values are normalised too (``v_norm``, without a
  scale), and attention scores are not scaled (``scale`` 1: the q/k norms set their size);
- full-attention layers may have their own head size and KV heads, and with
  ``attention_k_eq_v`` no value projection: the values are the key projection, normalised
  without scale and not rotated;
- RoPE per layer kind; full layers rotate only part of each head (``proportional``);
- per-layer inputs (``hidden_size_per_layer_input`` > 0): a second embedding table
  ``[vocab_size_per_layer_input, layers * P]`` plus a projection of the embedded prompt give
  every token one ``P``-vector per layer; each layer ends with a gated projection of it added to
  its residual stream (``per_layer_input_gate``, ``per_layer_projection``,
  ``post_per_layer_input_norm``);
- every layer's output is multiplied by a learned ``layer_scalar``;
- ``enable_moe_block``: a mixture of experts beside the dense MLP, routed from the residual
  stream (router norm without scale, ``scale``, softmax top-k renormalised, ``per_expert_scale``),
  GeGLU experts (:class:`~tallow.layers.FusedExperts`), the two branches normed and added;
- KV sharing (``num_kv_shared_layers``): the last layers compute no K/V and attend over the
  cache of an earlier layer (:class:`~tallow.layers.SharedKVAttention`), with a double-width
  MLP under ``use_double_wide_mlp``;
- final logits soft-capped (``final_logit_softcapping``).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from tallow.layers import (
    ArchConfig,
    Attention,
    BuildContext,
    CausalLM,
    ColumnParallelLinear,
    FusedExperts,
    LMHead,
    QKVParallelLinear,
    ReplicatedLinear,
    RMSNorm,
    RotaryEmbedding,
    RouterSpec,
    RowParallelLinear,
    SharedKVAttention,
    VocabEmbedding,
    WeightNameMap,
    apply_rotary,
    get_act,
    select_experts,
)

from . import gemma4_config as g4
from .config import text_model_config
from .gemma4_gguf import Gemma4GGUFNames
from .gemma4_gguf import config_from_gguf as gemma4_config_from_gguf
from .gemma4_naming import Gemma4Names, Gemma4TextModelNames
from .model import GemmaMLP


def _positive(config: ArchConfig, key: str) -> int:
    value = config.get(key)
    if value is None or isinstance(value, bool) or int(value) < 1:
        raise ValueError(f"model config: {key!r} must be a positive integer, got {value!r}")
    return int(value)


def unit_rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension without a scale, in float32 (Gemma 4's ``v_norm`` and
    router norm)."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rotary(
    inv_freq: torch.Tensor, head_dim: int, max_position: int, device: torch.device
) -> RotaryEmbedding:
    # rotary_dim is the whole head: unrotated pairs have frequency 0 (cos 1, sin 0)
    return RotaryEmbedding(
        head_dim, head_dim, max_position, 0.0, True, inv_freq, 1.0, max_position, device
    )


class Gemma4Attention(nn.Module):
    """One layer's attention in one of three forms: own q/k/v (``qkv_proj``), own q and k with
    values from k (``q_proj``, ``k_proj``; ``attention_k_eq_v`` on full layers), or q only over
    an earlier layer's cache (``q_proj``; KV sharing)."""

    def __init__(
        self,
        config: ArchConfig,
        plan: g4.LayerPlan,
        rotary: RotaryEmbedding,
        build: BuildContext,
        prefix: str,
        source: Attention | None,
    ) -> None:
        super().__init__()
        hidden = int(config.hidden_size)
        heads = int(config.num_attention_heads)
        bias = bool(config.get("attention_bias", False))
        d, kv = plan.head_dim, plan.num_kv_heads
        self.head_dim = d
        self.eps = float(config.rms_norm_eps)
        self.rotary_emb = rotary
        self.plan = plan
        self.q_norm = RMSNorm(d, self.eps, build=build)
        self.o_proj = RowParallelLinear(
            heads * d, hidden, bias, build=build, prefix=f"{prefix}.o_proj"
        )
        self.qkv_proj: QKVParallelLinear | None = None
        self.q_proj: ColumnParallelLinear | None = None
        self.k_proj: ColumnParallelLinear | None = None
        self.k_norm: RMSNorm | None = None
        tp = build.tp_size
        if plan.shared_from is None and not plan.k_eq_v:
            self.qkv_proj = QKVParallelLinear(
                hidden, d, heads, kv, bias, build=build, prefix=f"{prefix}.qkv_proj"
            )
            local_heads, local_kv = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        else:
            if heads % tp or (plan.shared_from is None and kv % tp):
                raise ValueError(
                    f"{prefix}: {heads} query / {kv} KV heads do not split evenly over "
                    f"{tp} tensor-parallel ranks"
                )
            self.q_proj = ColumnParallelLinear(
                hidden, heads * d, bias, build=build, prefix=f"{prefix}.q_proj"
            )
            local_heads, local_kv = heads // tp, max(kv // tp, 1)
            if plan.shared_from is None:
                self.k_proj = ColumnParallelLinear(
                    hidden, kv * d, bias, build=build, prefix=f"{prefix}.k_proj"
                )
        self.attn: Attention | SharedKVAttention
        if plan.shared_from is None:
            self.k_norm = RMSNorm(d, self.eps, build=build)
            self.attn = Attention(
                plan.index,
                local_heads,
                local_kv,
                d,
                scale=1.0,
                sliding_window=int(config.sliding_window) if plan.kind == g4.SLIDING else None,
            )
        else:
            assert source is not None
            self.attn = SharedKVAttention(plan.index, source, local_heads, scale=1.0)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        n, d = hidden.shape[0], self.head_dim
        if self.qkv_proj is not None:
            q, k, v = self.qkv_proj.split(self.qkv_proj(hidden))
        else:
            assert self.q_proj is not None
            q = self.q_proj(hidden)
            if self.k_proj is None:  # KV sharing: the source layer stored K/V this step
                q = self.q_norm(q.reshape(n, -1, d)).reshape(n, -1)
                cos, sin = self.rotary_emb.cos_sin(positions, q.dtype)
                q = apply_rotary(q, cos, sin, d, d, True)
                return self.o_proj(self.attn(q))
            k = self.k_proj(hidden)
            v = k  # attention_k_eq_v: the raw key projection, normed below, not rotated
        assert self.k_norm is not None and isinstance(self.attn, Attention)
        v = unit_rms_norm(v.reshape(n, -1, d), self.eps).reshape(n, -1)
        q, k = self.rotary_emb(positions, q, k, qk_norm=(self.q_norm, self.k_norm))
        return self.o_proj(self.attn(q, k, v))


class Gemma4Router(nn.Module):
    """Routes each token from the residual stream: ``proj(unit_norm(x) * scale / sqrt(H))``,
    softmax, top-k renormalised, each weight times its expert's ``per_expert_scale``."""

    def __init__(
        self, hidden: int, experts: int, top_k: int, eps: float, build: BuildContext, prefix: str
    ) -> None:
        super().__init__()
        self.eps = eps
        self.root = hidden**-0.5
        self.spec = RouterSpec(top_k=top_k, renormalize=True)
        self.proj = ReplicatedLinear(hidden, experts, build=build, prefix=f"{prefix}.proj")
        self.scale = nn.Parameter(
            torch.ones(hidden, dtype=build.dtype, device=build.device), requires_grad=False
        )
        self.per_expert_scale = nn.Parameter(
            torch.ones(experts, dtype=build.dtype, device=build.device), requires_grad=False
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.proj(unit_rms_norm(x, self.eps) * self.scale * self.root)
        weights, ids = select_experts(logits, self.spec)
        return weights * self.per_expert_scale[ids].float(), ids


class Gemma4DecoderLayer(nn.Module):
    """Attention, MLP (and experts), per-layer input, each around Gemma's pre/post norms, on
    a residual stream; the output scaled by ``layer_scalar``."""

    def __init__(
        self,
        config: ArchConfig,
        plan: g4.LayerPlan,
        attn: Gemma4Attention,
        build: BuildContext,
        prefix: str,
    ) -> None:
        super().__init__()
        hidden = int(config.hidden_size)
        eps = float(config.rms_norm_eps)
        act = config.get("hidden_activation") or "gelu_pytorch_tanh"

        def norm(size: int = hidden) -> RMSNorm:
            return RMSNorm(size, eps, build=build)

        self.self_attn = attn
        inter = int(config.intermediate_size) * (2 if plan.double_mlp else 1)
        self.mlp = GemmaMLP(hidden, inter, act, build, f"{prefix}.mlp")
        self.input_layernorm = norm()
        self.post_attention_layernorm = norm()
        self.pre_feedforward_layernorm = norm()
        self.post_feedforward_layernorm = norm()
        self.layer_scalar = nn.Parameter(
            torch.ones(1, dtype=build.dtype, device=build.device), requires_grad=False
        )
        self.router: Gemma4Router | None = None
        self.experts: FusedExperts | None = None
        if config.get("enable_moe_block"):
            if build.tp_size > 1:
                # the routed branch would need a sum over ranks of its own
                raise ValueError(
                    "model config: enable_moe_block (Gemma 4's experts) is not served "
                    "with tensor parallelism yet"
                )
            num_experts = _positive(config, "num_experts")
            self.router = Gemma4Router(
                hidden,
                num_experts,
                _positive(config, "top_k_experts"),
                eps,
                build,
                f"{prefix}.router",
            )
            self.experts = FusedExperts(
                num_experts,
                hidden,
                _positive(config, "moe_intermediate_size"),
                bias=False,
                activation="gelu_tanh",
                swiglu_alpha=0.0,
                swiglu_limit=0.0,
                build=build,
                prefix=f"{prefix}.experts",
            )
            self.post_feedforward_layernorm_1 = norm()
            self.post_feedforward_layernorm_2 = norm()
            self.pre_feedforward_layernorm_2 = norm()
        per_layer = int(config.get("hidden_size_per_layer_input") or 0)
        self.per_layer_input_gate: ReplicatedLinear | None = None
        if per_layer:
            self.per_layer_act = get_act(act)
            self.per_layer_input_gate = ReplicatedLinear(
                hidden, per_layer, build=build, prefix=f"{prefix}.per_layer_input_gate"
            )
            self.per_layer_projection = ReplicatedLinear(
                per_layer, hidden, build=build, prefix=f"{prefix}.per_layer_projection"
            )
            self.post_per_layer_input_norm = norm()

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, per_layer_input: torch.Tensor | None
    ) -> torch.Tensor:
        attn = self.self_attn(positions, self.input_layernorm(hidden))
        x, residual = self.pre_feedforward_layernorm(self.post_attention_layernorm(attn), hidden)
        x = self.mlp(x)
        if self.router is not None:
            assert self.experts is not None
            weights, ids = self.router(residual)
            routed = self.experts(self.pre_feedforward_layernorm_2(residual), weights, ids)
            x = self.post_feedforward_layernorm_1(x) + self.post_feedforward_layernorm_2(routed)
        hidden = residual + self.post_feedforward_layernorm(x)
        if self.per_layer_input_gate is not None:
            assert per_layer_input is not None
            gate = self.per_layer_act(self.per_layer_input_gate(hidden)) * per_layer_input
            hidden = hidden + self.post_per_layer_input_norm(self.per_layer_projection(gate))
        return hidden * self.layer_scalar


class Gemma4Model(nn.Module):
    """Scaled embedding, per-layer inputs, decoder layers, final norm."""

    def __init__(self, config: ArchConfig, build: BuildContext) -> None:
        super().__init__()
        hidden = _positive(config, "hidden_size")
        vocab = _positive(config, "vocab_size")
        _positive(config, "num_attention_heads")
        _positive(config, "intermediate_size")
        # "vision": image tokens attend both ways, text causally; text-only serving is causal
        if config.get("use_bidirectional_attention") not in (None, "vision"):
            raise ValueError(
                "model config: use_bidirectional_attention is "
                f"{config.get('use_bidirectional_attention')!r}; tallow runs Gemma 4 causally "
                "only (null, or 'vision' with text-only prompts)"
            )
        _positive(config, "sliding_window")
        plans = g4.layer_plans(config)
        self.plans = plans
        self.embed_tokens = VocabEmbedding(vocab, hidden, build=build, prefix="model.embed_tokens")
        self.register_buffer(
            "normalizer",
            torch.tensor(hidden**0.5, dtype=build.dtype, device=build.device),
            persistent=False,
        )
        max_position = _positive(config, "max_position_embeddings")
        rotaries = {
            kind: _rotary(g4.rope_inv_freq(config, kind, dim), dim, max_position, build.device)
            for kind, dim in g4.kind_head_dims(plans).items()
        }
        self.rotary = nn.ModuleDict(rotaries)
        self.num_layers = len(plans)
        self.per_layer = int(config.get("hidden_size_per_layer_input") or 0)
        if self.per_layer:
            width = self.num_layers * self.per_layer
            self.embed_tokens_per_layer = VocabEmbedding(
                _positive(config, "vocab_size_per_layer_input"),
                width,
                build=build,
                prefix="model.embed_tokens_per_layer",
            )
            self.register_buffer(
                "per_layer_normalizer",
                torch.tensor(self.per_layer**0.5, dtype=build.dtype, device=build.device),
                persistent=False,
            )
            self.per_layer_model_projection = ReplicatedLinear(
                hidden, width, build=build, prefix="model.per_layer_model_projection"
            )
            self.per_layer_projection_norm = RMSNorm(
                self.per_layer, float(config.rms_norm_eps), build=build
            )
        self.hidden_root = hidden**-0.5
        layers: list[Gemma4DecoderLayer] = []
        for plan in plans:
            prefix = f"model.layers.{plan.index}"
            source = None
            if plan.shared_from is not None:
                owner = layers[plan.shared_from].self_attn.attn
                assert isinstance(owner, Attention)
                source = owner
            attn = Gemma4Attention(
                config, plan, rotaries[plan.kind], build, f"{prefix}.self_attn", source
            )
            layers.append(Gemma4DecoderLayer(config, plan, attn, build, prefix))
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(hidden, float(config.rms_norm_eps), build=build)

    def per_layer_inputs(self, input_ids: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """``[T, layers, P]``: the per-layer table's rows of the tokens and the projection of
        their embeddings, each normalised, averaged by ``1 / sqrt(2)``."""
        n = input_ids.shape[0]
        table = self.embed_tokens_per_layer(input_ids) * self.per_layer_normalizer
        proj = self.per_layer_model_projection(embeds) * self.hidden_root
        proj = self.per_layer_projection_norm(proj.reshape(n, self.num_layers, self.per_layer))
        return (proj + table.reshape(n, self.num_layers, self.per_layer)) * 2**-0.5

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids) * self.normalizer
        per_layer = self.per_layer_inputs(input_ids, hidden) if self.per_layer else None
        for i, layer in enumerate(self.layers):
            hidden = layer(positions, hidden, per_layer[:, i] if per_layer is not None else None)
        return self.norm(hidden)


class Gemma4ForCausalLM(CausalLM):
    """Gemma 4 text models (see the module docstring)."""

    hf_architectures: ClassVar[tuple[str, ...]] = ("Gemma4ForCausalLM",)
    gguf_architectures: ClassVar[tuple[str, ...]] = ("gemma4",)
    weight_name_maps: ClassVar[dict[str, WeightNameMap]] = {}

    def __init__(self, config: ArchConfig | dict[str, Any], build: BuildContext) -> None:
        super().__init__(ArchConfig(self.config_from_hf(dict(config))), build)
        cfg = self.config
        cap = cfg.get("final_logit_softcapping")
        if cap is not None and float(cap) <= 0:
            raise ValueError(
                f"model config: 'final_logit_softcapping' must be positive or null, got {cap}"
            )
        self.final_softcap = float(cap) if cap is not None else None
        self.model = Gemma4Model(cfg, build)
        tie = bool(cfg.get("tie_word_embeddings", True))
        self.lm_head = LMHead(
            int(cfg.vocab_size),
            int(cfg.hidden_size),
            tie_with=self.model.embed_tokens if tie else None,
            build=build,
            prefix="lm_head",
        )

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The head's logits, soft-capped in float32 when the config says so."""
        logits = self.lm_head(hidden)
        if self.final_softcap is None:
            return logits
        cap = self.final_softcap
        return torch.tanh(logits.float() / cap) * cap

    def weight_names(self, naming: str) -> WeightNameMap:
        if naming == "gguf":
            return Gemma4GGUFNames(Gemma4Names(self.model.plans))  # type: ignore[return-value]
        if naming != "hf":
            return super().weight_names(naming)
        return Gemma4Names(self.model.plans)  # type: ignore[return-value]

    def load_rope_freqs(self, tensor: torch.Tensor, groups: dict[str, str]) -> None:
        """A GGUF file's ``rope_freqs``: divisors of the full layers' frequencies (1e30 for
        the pairs that stay unrotated: llama.cpp's way of writing proportional RoPE)."""
        rotary = self.model.rotary[g4.FULL] if g4.FULL in self.model.rotary else None
        if rotary is None:
            raise ValueError("GGUF tensor rope_freqs: the model has no full-attention layer")
        rotary.set_freq_factors(tensor.float())

    def resolve_missing(self, missing: set[str], naming: str) -> set[str]:
        if "lm_head.weight" in missing:
            self.lm_head.tie(self.model.embed_tokens)
            return {"lm_head.weight"}
        return set()

    @classmethod
    def config_from_hf(cls, config: dict[str, Any]) -> dict[str, Any]:
        """``config`` completed with ``Gemma4TextConfig``'s defaults."""
        return g4.with_defaults(config)

    @classmethod
    def config_from_gguf(cls, metadata: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
        """The config of a llama.cpp ``gemma4`` file (:mod:`tallow_model_gemma.gemma4_gguf`)."""
        return gemma4_config_from_gguf(metadata, config)


class Gemma4ForConditionalGeneration(Gemma4ForCausalLM):
    """The text model of a multimodal Gemma 4 checkpoint (its ``text_config``); the vision
    and audio towers are not loaded, and prompts are text only."""

    hf_architectures = ("Gemma4ForConditionalGeneration",)
    gguf_architectures = ()

    def weight_names(self, naming: str) -> WeightNameMap:
        names = super().weight_names(naming)
        return Gemma4TextModelNames(names) if naming == "hf" else names  # type: ignore[return-value,arg-type]

    @classmethod
    def config_from_hf(cls, config: dict[str, Any]) -> dict[str, Any]:
        """The ``text_config`` with ``Gemma4TextConfig``'s defaults and what only the outer
        config states (dtype, special token ids, tying)."""
        return super().config_from_hf(text_model_config(config, cls.hf_architectures[0]))
