"""Gemma 2 and Gemma 3 (text) on the building blocks of :mod:`tallow.layers`.

What sets the family apart from Llama:

- RMSNorm scales by ``1 + weight`` in float32 (``RMSNorm(offset=True)``), and each block is
  wrapped in two norms: ``post_attention_layernorm`` after attention, ``pre_`` and
  ``post_feedforward_layernorm`` around the MLP;
- the token embedding is multiplied by ``sqrt(hidden_size)``, rounded to the activation dtype
  first (as transformers does, so bfloat16 models use 55.5 for 3072, not 55.43);
- attention scores are scaled by ``query_pre_attn_scalar ** -0.5``, not ``head_dim ** -0.5``;
- layers alternate between a sliding window and global attention (:mod:`tallow_model_gemma.config`);
- the MLP is GeGLU (``gelu_pytorch_tanh``);
- Gemma 2 soft-caps attention scores (``attn_logit_softcapping``) and the final logits
  (``final_logit_softcapping``): ``cap * tanh(x / cap)``;
- Gemma 3 normalises every q and k head (``q_norm``, ``k_norm``, also ``1 + weight``) before
  RoPE, and rotates local layers with their own base (``rope_local_base_freq``) while global
  layers use ``rope_theta`` and the rope scaling. Like transformers and llama.cpp it applies no
  attention softcap.

Checkpoint names are mapped in :mod:`tallow_model_gemma.naming`.
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

import torch
from torch import nn

from tallow.layers import (
    ArchConfig,
    Attention,
    BuildContext,
    CausalLM,
    LMHead,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RMSNorm,
    RotaryEmbedding,
    RowParallelLinear,
    VocabEmbedding,
    WeightNameMap,
    compute_inv_freq,
    get_act_and_mul,
    get_rope,
    rope_parameters,
)

from . import config as gemma_config
from .naming import TextModelNames, gguf_name_map, hf_name_map, norm_from_gguf


def _require(config: ArchConfig, key: str) -> Any:
    value = config.get(key)
    if value is None:
        raise ValueError(f"model config: {key!r} is required")
    return value


def _optional_float(config: ArchConfig, key: str) -> float | None:
    value = config.get(key)
    if value is None:
        return None
    value = float(value)
    if value <= 0:
        raise ValueError(f"model config: {key!r} must be positive or null, got {value}")
    return value


def build_rotary(
    head_dim: int,
    max_position: int,
    base: float,
    scaling: Mapping[str, Any] | None,
    device: torch.device,
) -> RotaryEmbedding:
    """RoPE over whole heads. Linear scaling keeps a table of ``max_position`` rows: Gemma 3's
    ``max_position_embeddings`` already counts the scaled context (131072 for a factor of 8),
    so extending the table by the factor, as ``get_rope`` does for checkpoints that state the
    original context, would cost a GiB for nothing."""
    kind = (scaling or {}).get("rope_type") or (scaling or {}).get("type")
    if kind == "linear":
        inv_freq, attention_scaling = compute_inv_freq(head_dim, max_position, base, scaling)
        return RotaryEmbedding(
            head_dim,
            head_dim,
            max_position,
            base,
            True,
            inv_freq,
            attention_scaling,
            max_position,
            device,
        )
    return get_rope(
        head_dim, head_dim, max_position, base, scaling, is_neox_style=True, device=device
    )


class GemmaMLP(nn.Module):
    """``down(gelu_tanh(gate(x)) * up(x))`` with gate and up stored as one matrix."""

    def __init__(
        self, hidden: int, intermediate: int, act: str, build: BuildContext, prefix: str
    ) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden, [intermediate] * 2, False, build=build, prefix=f"{prefix}.gate_up_proj"
        )
        self.down_proj = RowParallelLinear(
            intermediate, hidden, False, build=build, prefix=f"{prefix}.down_proj"
        )
        self.act_fn = get_act_and_mul(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.gate_up_proj(x), act=self.act_fn)


class GemmaAttention(nn.Module):
    """qkv projection, Gemma 3's per-head q/k norms, RoPE, paged attention (window and softcap
    per layer), output projection."""

    def __init__(
        self,
        config: ArchConfig,
        build: BuildContext,
        layer_index: int,
        rotary: RotaryEmbedding,
        *,
        head_dim: int,
        qk_norm: bool,
        sliding_window: int | None,
        softcap: float | None,
        prefix: str,
    ) -> None:
        super().__init__()
        hidden = int(config.hidden_size)
        heads = int(config.num_attention_heads)
        kv_heads = int(config.get("num_key_value_heads") or heads)
        bias = bool(config.get("attention_bias", False))
        self.qkv_proj = QKVParallelLinear(
            hidden, head_dim, heads, kv_heads, bias, build=build, prefix=f"{prefix}.qkv_proj"
        )
        self.o_proj = RowParallelLinear(
            heads * head_dim, hidden, bias, build=build, prefix=f"{prefix}.o_proj"
        )
        eps = float(config.rms_norm_eps)
        if qk_norm:
            self.q_norm = RMSNorm(head_dim, eps, offset=True, build=build)
            self.k_norm = RMSNorm(head_dim, eps, offset=True, build=build)
        else:
            self.q_norm = self.k_norm = None
        self.rotary_emb = rotary
        scalar = float(_require(config, "query_pre_attn_scalar"))
        if scalar <= 0:
            raise ValueError(
                f"model config: 'query_pre_attn_scalar' must be positive, got {scalar}"
            )
        # typed as a module: Gemma 3 with images wraps it (tallow_model_gemma.image_attention)
        self.attn: nn.Module = Attention(
            layer_index,
            self.qkv_proj.num_heads,
            self.qkv_proj.num_kv_heads,
            head_dim,
            scale=scalar**-0.5,
            sliding_window=sliding_window,
            logit_softcap=softcap,
        )

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj.split(self.qkv_proj(hidden))
        norms = (self.q_norm, self.k_norm) if self.q_norm is not None else None
        q, k = self.rotary_emb(positions, q, k, qk_norm=norms)
        return self.o_proj(self.attn(q, k, v))


class GemmaDecoderLayer(nn.Module):
    """Attention and MLP, each between a pre-norm and a post-norm, on a residual stream (the
    residual add is fused into the next pre-norm)."""

    def __init__(
        self, attn: GemmaAttention, mlp: GemmaMLP, hidden: int, eps: float, build: BuildContext
    ) -> None:
        super().__init__()
        self.self_attn = attn
        self.mlp = mlp

        def norm() -> RMSNorm:
            return RMSNorm(hidden, eps, offset=True, build=build)

        self.input_layernorm = norm()
        self.post_attention_layernorm = norm()
        self.pre_feedforward_layernorm = norm()
        self.post_feedforward_layernorm = norm()

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.post_attention_layernorm(self.self_attn(positions, hidden))
        hidden, residual = self.pre_feedforward_layernorm(hidden, residual)
        hidden = self.post_feedforward_layernorm(self.mlp(hidden))
        return hidden, residual


class GemmaModel(nn.Module):
    """Scaled embedding, decoder layers, final norm."""

    def __init__(self, owner: "Gemma2ForCausalLM", config: ArchConfig, build: BuildContext) -> None:
        super().__init__()
        hidden = int(_require(config, "hidden_size"))
        vocab = int(_require(config, "vocab_size"))
        heads = int(_require(config, "num_attention_heads"))
        intermediate = int(_require(config, "intermediate_size"))
        eps = float(config.rms_norm_eps)
        head_dim = int(config.get("head_dim") or hidden // heads)
        self.embed_tokens = VocabEmbedding(vocab, hidden, build=build, prefix="model.embed_tokens")
        # sqrt(hidden) in the activation dtype, as transformers rounds it
        self.register_buffer(
            "normalizer",
            torch.tensor(hidden**0.5, dtype=build.dtype, device=build.device),
            persistent=False,
        )
        max_position = int(_require(config, "max_position_embeddings"))
        rotaries = {
            kind: build_rotary(head_dim, max_position, base, scaling, build.device)
            for kind, (base, scaling) in owner.rope_by_layer_kind(config).items()
        }
        # registered once each (a dict of modules), shared by the layers of their kind
        self.rotary = nn.ModuleDict(rotaries)
        if config.get("use_bidirectional_attention"):
            raise ValueError(
                "model config: use_bidirectional_attention is true (an embedding "
                "model such as EmbeddingGemma); tallow runs Gemma causally only"
            )
        window = config.get("sliding_window")
        if window is not None and (isinstance(window, bool) or int(window) < 1):
            raise ValueError(
                f"model config: 'sliding_window' must be a positive integer or null, got {window!r}"
            )
        softcap = owner.attention_softcap(config)
        act = config.get("hidden_activation") or config.get("hidden_act") or "gelu_pytorch_tanh"
        layers = []
        for i, sliding in enumerate(gemma_config.sliding_layers(config)):
            prefix = f"model.layers.{i}"
            kind = gemma_config.SLIDING if sliding else gemma_config.FULL
            attn = GemmaAttention(
                config,
                build,
                i,
                rotaries.get(kind) or rotaries[gemma_config.FULL],
                head_dim=head_dim,
                qk_norm=owner.qk_norm,
                sliding_window=int(window) if sliding and window else None,
                softcap=softcap,
                prefix=f"{prefix}.self_attn",
            )
            mlp = GemmaMLP(hidden, intermediate, act, build, f"{prefix}.mlp")
            layers.append(GemmaDecoderLayer(attn, mlp, hidden, eps, build))
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(hidden, eps, offset=True, build=build)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids) * self.normalizer
        residual = None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class Gemma2ForCausalLM(CausalLM):
    """Gemma 2: attention and final-logit softcaps, one RoPE for every layer."""

    hf_architectures: ClassVar[tuple[str, ...]] = ("Gemma2ForCausalLM",)
    gguf_architectures: ClassVar[tuple[str, ...]] = ("gemma2",)
    defaults: ClassVar[dict[str, Any]] = gemma_config.GEMMA2_DEFAULTS
    qk_norm: ClassVar[bool] = False
    weight_name_maps = {"hf": hf_name_map(), "gguf": gguf_name_map()}

    def __init__(self, config: ArchConfig | dict[str, Any], build: BuildContext) -> None:
        super().__init__(ArchConfig(self.config_from_hf(dict(config))), build)
        cfg = self.config
        self.final_softcap = _optional_float(cfg, "final_logit_softcapping")
        self.model = GemmaModel(self, cfg, build)
        tie = bool(cfg.get("tie_word_embeddings", True))
        self.lm_head = LMHead(
            int(cfg.vocab_size),
            int(cfg.hidden_size),
            tie_with=self.model.embed_tokens if tie else None,
            build=build,
            prefix="lm_head",
        )

    # -- what tells Gemma 2 and 3 apart ---------------------------------------------------
    def rope_by_layer_kind(
        self, config: ArchConfig
    ) -> dict[str, tuple[float, dict[str, Any] | None]]:
        base, scaling, partial = rope_parameters(config)
        if partial != 1.0:
            raise ValueError(
                f"model config: partial_rotary_factor {partial} is not supported "
                "by Gemma models (they rotate whole heads)"
            )
        return {gemma_config.FULL: (base, scaling)}

    def attention_softcap(self, config: ArchConfig) -> float | None:
        return _optional_float(config, "attn_logit_softcapping")

    # -- running ---------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The head's logits; with ``final_logit_softcapping`` capped in float32 (a tanh of
        16-bit logits would tie near the cap)."""
        logits = self.lm_head(hidden)
        if self.final_softcap is None:
            return logits
        cap = self.final_softcap
        return torch.tanh(logits.float() / cap) * cap

    # -- loading ---------------------------------------------------------------------------
    def norm_from_gguf(self, tensor: torch.Tensor, groups: dict[str, str]) -> torch.Tensor:
        return norm_from_gguf(tensor)

    def resolve_missing(self, missing: set[str], naming: str) -> set[str]:
        # GGUF files of tied models simply have no output.weight
        if "lm_head.weight" in missing:
            self.lm_head.tie(self.model.embed_tokens)
            return {"lm_head.weight"}
        return set()

    @classmethod
    def config_from_hf(cls, config: dict[str, Any]) -> dict[str, Any]:
        """``config`` completed with the family's defaults (see :mod:`tallow_model_gemma.config`)."""
        return gemma_config.with_defaults(config, cls.defaults)

    @classmethod
    def config_from_gguf(cls, metadata: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
        return gemma_config.config_from_gguf(
            metadata, config, hf_architecture=cls.hf_architectures[0]
        )


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    """Gemma 3 (text): per-head q/k norms, local and global RoPE, no attention softcap."""

    hf_architectures = ("Gemma3ForCausalLM",)
    gguf_architectures = ("gemma3",)
    defaults = gemma_config.GEMMA3_DEFAULTS
    qk_norm = True

    def rope_by_layer_kind(
        self, config: ArchConfig
    ) -> dict[str, tuple[float, dict[str, Any] | None]]:
        return gemma_config.gemma3_rope(config)

    def attention_softcap(self, config: ArchConfig) -> float | None:
        return None


class Gemma3ForConditionalGeneration(Gemma3ForCausalLM):
    """The text model of a multimodal Gemma 3 checkpoint (``text_config``; the vision tower
    and its projector are skipped, so prompts are text only)."""

    hf_architectures = ("Gemma3ForConditionalGeneration",)
    gguf_architectures = ()

    def weight_names(self, naming: str) -> WeightNameMap:
        names = super().weight_names(naming)
        return TextModelNames(names) if naming == "hf" else names  # type: ignore[return-value]

    @classmethod
    def config_from_hf(cls, config: dict[str, Any]) -> dict[str, Any]:
        """The ``text_config``, with the defaults of ``Gemma3TextConfig`` and what only the
        outer config states (dtype, end-of-sequence ids)."""
        flat = gemma_config.text_model_config(config, cls.hf_architectures[0])
        return super().config_from_hf(flat)
