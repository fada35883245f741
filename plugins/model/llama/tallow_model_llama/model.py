"""The Llama family: Llama 2/3/3.1/3.2, Mistral, Qwen2 and Qwen3 on one decoder.

They differ only in small switches, each a class attribute or a short method:

=========== ================== ============ ============ =================================
model       q/k/v bias         o_proj bias  q/k norm     sliding window
=========== ================== ============ ============ =================================
Llama       ``attention_bias`` same         no           no
Mistral     no                 no           no           ``sliding_window``, every layer
Qwen2       yes                no           no           ``layer_types`` / ``use_sliding_window``
Qwen3       ``attention_bias`` same         per head     ``layer_types`` / ``use_sliding_window``
=========== ================== ============ ============ =================================

Checkpoint names are mapped in :mod:`tallow_model_llama.naming`; GGUF configs are completed in
:mod:`tallow_model_llama.gguf_config`.
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
    LMHead,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RMSNorm,
    RotaryEmbedding,
    RowParallelLinear,
    VocabEmbedding,
    get_act_and_mul,
    rope_from_config,
)

from .gguf_config import arch_value, llama_family_config, mixtral_config
from .naming import gguf_name_map, hf_name_map, unpermute_rows


def _require(config: ArchConfig, key: str) -> Any:
    value = config.get(key)
    if value is None:
        raise ValueError(f"model config: {key!r} is required")
    return value


class LlamaMLP(nn.Module):
    """``down(act(gate(x)) * up(x))`` with gate and up stored as one matrix."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        hidden_act: str,
        bias: bool,
        build: BuildContext,
        prefix: str,
    ) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden_size, [intermediate_size] * 2, bias, build=build, prefix=f"{prefix}.gate_up_proj"
        )
        self.down_proj = RowParallelLinear(
            intermediate_size, hidden_size, bias, build=build, prefix=f"{prefix}.down_proj"
        )
        self.act_fn = get_act_and_mul(hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the activation goes into the down projection: one GEMV at batch 1 on a GPU
        return self.down_proj(self.gate_up_proj(x), act=self.act_fn)


class LlamaAttention(nn.Module):
    """qkv projection, optional per-head q/k RMSNorm, RoPE, paged attention, output projection."""

    def __init__(
        self,
        config: ArchConfig,
        build: BuildContext,
        layer_index: int,
        rotary: RotaryEmbedding,
        *,
        head_dim: int,
        qkv_bias: bool,
        o_bias: bool,
        qk_norm: bool,
        sliding_window: int | None,
        prefix: str,
        scale: float | None = None,
    ) -> None:
        super().__init__()
        hidden = int(config.hidden_size)
        heads = int(config.num_attention_heads)
        kv_heads = int(config.get("num_key_value_heads") or heads)
        self.head_dim = head_dim
        self.qkv_proj = QKVParallelLinear(
            hidden, head_dim, heads, kv_heads, qkv_bias, build=build, prefix=f"{prefix}.qkv_proj"
        )
        self.o_proj = RowParallelLinear(
            heads * head_dim, hidden, o_bias, build=build, prefix=f"{prefix}.o_proj"
        )
        eps = float(config.get("rms_norm_eps", 1e-6))
        if qk_norm:
            self.q_norm = RMSNorm(head_dim, eps, build=build)
            self.k_norm = RMSNorm(head_dim, eps, build=build)
        else:
            self.q_norm = self.k_norm = None
        self.rotary_emb = rotary
        self.attn = Attention(
            layer_index,
            self.qkv_proj.num_heads,
            self.qkv_proj.num_kv_heads,
            head_dim,
            scale=head_dim**-0.5 if scale is None else scale,
            sliding_window=sliding_window,
        )

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj.split(self.qkv_proj(hidden))
        # Qwen3's per-head q/k norms run inside the rotary layer (one launch on a GPU).
        norms = (self.q_norm, self.k_norm) if self.q_norm is not None else None
        q, k = self.rotary_emb(positions, q, k, qk_norm=norms)
        return self.o_proj(self.attn(q, k, v))


class LlamaDecoderLayer(nn.Module):
    """Pre-norm attention and MLP blocks on a residual stream (the add is fused into the norm).

    What a block's output goes through before it joins the stream is ``attention_output`` /
    ``mlp_output``: scaling by ``residual_multiplier`` (Granite) here, a norm in families that
    have one there (GLM-4).
    """

    def __init__(
        self,
        attn: LlamaAttention,
        mlp: LlamaMLP,
        hidden: int,
        eps: float,
        build: BuildContext,
        residual_multiplier: float = 1.0,
    ) -> None:
        super().__init__()
        self.self_attn = attn
        self.mlp = mlp
        self.residual_multiplier = float(residual_multiplier)
        self.input_layernorm = RMSNorm(hidden, eps, build=build)
        self.post_attention_layernorm = RMSNorm(hidden, eps, build=build)

    def attention_output(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._scaled(hidden)

    def mlp_output(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._scaled(hidden)

    def _scaled(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.residual_multiplier == 1.0:
            return hidden
        return hidden * self.residual_multiplier

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.attention_output(self.self_attn(positions, hidden))
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp_output(self.mlp(hidden)), residual


class LlamaModel(nn.Module):
    """Embedding, decoder layers, final norm.

    The owning model class builds each layer's attention and the layer itself
    (``build_attention``, ``build_decoder_layer``), so families that differ only there reuse
    the rest.
    """

    def __init__(self, owner: "LlamaForCausalLM", config: ArchConfig, build: BuildContext) -> None:
        super().__init__()
        hidden = int(_require(config, "hidden_size"))
        vocab = int(_require(config, "vocab_size"))
        n_layers = int(_require(config, "num_hidden_layers"))
        heads = int(_require(config, "num_attention_heads"))
        eps = float(config.get("rms_norm_eps", 1e-6))
        head_dim = int(config.get("head_dim") or hidden // heads)
        self.rotary_emb = rope_from_config(
            config, head_dim, is_neox_style=owner.rope_neox_style, device=build.device
        )
        self.embed_tokens = VocabEmbedding(vocab, hidden, build=build, prefix="model.embed_tokens")
        self.embedding_multiplier = owner.embedding_multiplier(config)
        layers = []
        for i in range(n_layers):
            prefix = f"model.layers.{i}"
            attn = owner.build_attention(
                config, build, i, self.rotary_emb, head_dim, f"{prefix}.self_attn"
            )
            mlp = owner.build_mlp(config, build, i, f"{prefix}.mlp")
            layers.append(owner.build_decoder_layer(config, build, attn, mlp))
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(hidden, eps, build=build)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        if self.embedding_multiplier != 1.0:
            hidden = hidden * self.embedding_multiplier
        residual = None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class LlamaForCausalLM(CausalLM):
    """Llama 2, 3, 3.1, 3.2 (RoPE scaling llama3, linear, dynamic, yarn)."""

    hf_architectures: ClassVar[tuple[str, ...]] = ("LlamaForCausalLM",)
    gguf_architectures: ClassVar[tuple[str, ...]] = ("llama",)
    model_type: ClassVar[str] = "llama"
    qk_norm: ClassVar[bool] = False
    rope_neox_style: ClassVar[bool] = True
    weight_name_maps = {"hf": hf_name_map(), "gguf": gguf_name_map(interleaved_qk=True)}
    # embedding checkpoints (Qwen3-Embedding) are saved from the bare decoder: layers.0...
    base_model_prefix = "model"

    def __init__(self, config: ArchConfig | dict[str, Any], build: BuildContext) -> None:
        super().__init__(config, build)
        cfg = self.config
        self.model = LlamaModel(self, cfg, build)
        self.lm_head: LMHead | None = None
        if build.task != "embed":  # embeddings pool hidden states: no head needed
            tie = bool(cfg.get("tie_word_embeddings", False))
            self.lm_head = LMHead(
                int(cfg.vocab_size),
                int(cfg.hidden_size),
                tie_with=self.model.embed_tokens if tie else None,
                build=build,
                prefix="lm_head",
            )

    # -- the switches that tell the family apart -----------------------------------------
    def qkv_bias(self, config: ArchConfig) -> bool:
        return bool(config.get("attention_bias", False))

    def o_bias(self, config: ArchConfig) -> bool:
        return bool(config.get("attention_bias", False))

    def mlp_bias(self, config: ArchConfig) -> bool:
        return bool(config.get("mlp_bias", False))

    def layer_sliding_window(self, config: ArchConfig, layer: int) -> int | None:
        return None

    def attention_scale(self, config: ArchConfig, head_dim: int) -> float | None:
        """The softmax scale of q·k; None for ``1 / sqrt(head_dim)``."""
        return None

    def embedding_multiplier(self, config: ArchConfig) -> float:
        return 1.0

    def residual_multiplier(self, config: ArchConfig) -> float:
        return 1.0

    def build_attention(
        self,
        config: ArchConfig,
        build: BuildContext,
        layer: int,
        rotary: RotaryEmbedding,
        head_dim: int,
        prefix: str,
    ) -> nn.Module:
        """The attention block of decoder layer ``layer``."""
        return LlamaAttention(
            config,
            build,
            layer,
            rotary,
            head_dim=head_dim,
            qkv_bias=self.qkv_bias(config),
            o_bias=self.o_bias(config),
            qk_norm=self.qk_norm,
            sliding_window=self.layer_sliding_window(config, layer),
            prefix=prefix,
            scale=self.attention_scale(config, head_dim),
        )

    def build_mlp(
        self, config: ArchConfig, build: BuildContext, layer: int, prefix: str
    ) -> nn.Module:
        """The MLP block of decoder layer ``layer`` (mixture-of-experts families return their
        MoE block on the layers that have one)."""
        return LlamaMLP(
            int(config.hidden_size),
            int(_require(config, "intermediate_size")),
            config.get("hidden_act", "silu"),
            self.mlp_bias(config),
            build,
            prefix,
        )

    def build_decoder_layer(
        self, config: ArchConfig, build: BuildContext, attn: nn.Module, mlp: nn.Module
    ) -> nn.Module:
        """One decoder layer around ``attn`` and ``mlp``: ``forward(positions, hidden,
        residual) -> (hidden, residual)``, the residual add deferred to the next norm."""
        return LlamaDecoderLayer(
            attn,
            mlp,
            int(config.hidden_size),
            float(config.get("rms_norm_eps", 1e-6)),
            build,
            self.residual_multiplier(config),
        )

    # -- running ---------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)

    # -- loading ---------------------------------------------------------------------------
    def unpermute_q(self, tensor: torch.Tensor, groups: dict[str, str]) -> torch.Tensor:
        return unpermute_rows(tensor, int(self.config.num_attention_heads))

    def unpermute_k(self, tensor: torch.Tensor, groups: dict[str, str]) -> torch.Tensor:
        cfg = self.config
        return unpermute_rows(
            tensor, int(cfg.get("num_key_value_heads") or cfg.num_attention_heads)
        )

    def load_rope_freqs(self, tensor: torch.Tensor, groups: dict[str, str]) -> None:
        self.model.rotary_emb.set_freq_factors(tensor)

    def resolve_missing(self, missing: set[str], naming: str) -> set[str]:
        # GGUF files of tied models simply have no output.weight.
        if naming == "gguf" and "lm_head.weight" in missing and self.lm_head is not None:
            self.lm_head.tie(self.model.embed_tokens)
            return {"lm_head.weight"}
        return set()

    @classmethod
    def config_from_gguf(cls, metadata: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
        """The config of a GGUF file; a ``llama`` file that holds experts
        (``llama.expert_count > 0``) is a Mixtral, as llama.cpp writes them: its config names
        ``MixtralForCausalLM`` (tallow-model-mixtral), which the engine then builds."""
        if metadata.get("general.architecture") == "llama" and arch_value(
            metadata, "expert_count", 0
        ):
            return mixtral_config(metadata, config)
        return llama_family_config(
            metadata, config, hf_architecture=cls.hf_architectures[0], model_type=cls.model_type
        )


def _layer_types_window(config: ArchConfig, layer: int) -> int | None:
    """Qwen's rule: ``layer_types`` when given, else ``use_sliding_window`` from
    ``max_window_layers`` on."""
    window = config.get("sliding_window")
    types = config.get("layer_types")
    if types:
        if layer >= len(types):
            raise ValueError(
                f"model config: layer_types has {len(types)} entries, but layer {layer} exists"
            )
        return window if types[layer] == "sliding_attention" else None
    if not config.get("use_sliding_window", False) or window is None:
        return None
    # 28 is transformers' default for Qwen2 and Qwen3 configs that do not say
    return window if layer >= int(config.get("max_window_layers", 28)) else None


class MistralForCausalLM(LlamaForCausalLM):
    """Mistral: Llama without biases, with ``sliding_window`` on every layer when set."""

    hf_architectures = ("MistralForCausalLM",)
    # llama.cpp writes Mistral checkpoints as GGUF architecture "llama" (served by Llama).
    gguf_architectures = ()
    model_type = "mistral"

    def qkv_bias(self, config: ArchConfig) -> bool:
        return False

    def o_bias(self, config: ArchConfig) -> bool:
        return False

    def mlp_bias(self, config: ArchConfig) -> bool:
        return False

    def layer_sliding_window(self, config: ArchConfig, layer: int) -> int | None:
        return config.get("sliding_window") or None


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Qwen2 / Qwen2.5: biased q/k/v projections."""

    hf_architectures = ("Qwen2ForCausalLM",)
    gguf_architectures = ("qwen2",)
    model_type = "qwen2"
    weight_name_maps = {"hf": hf_name_map(), "gguf": gguf_name_map(interleaved_qk=False)}

    def qkv_bias(self, config: ArchConfig) -> bool:
        return True

    def o_bias(self, config: ArchConfig) -> bool:
        return False

    def mlp_bias(self, config: ArchConfig) -> bool:
        return False

    def layer_sliding_window(self, config: ArchConfig, layer: int) -> int | None:
        return _layer_types_window(config, layer)


class Qwen3ForCausalLM(LlamaForCausalLM):
    """Qwen3: RMSNorm over each head of q and k before RoPE."""

    hf_architectures = ("Qwen3ForCausalLM",)
    gguf_architectures = ("qwen3",)
    model_type = "qwen3"
    qk_norm = True
    weight_name_maps = {"hf": hf_name_map(), "gguf": gguf_name_map(interleaved_qk=False)}

    def mlp_bias(self, config: ArchConfig) -> bool:
        return False

    def layer_sliding_window(self, config: ArchConfig, layer: int) -> int | None:
        return _layer_types_window(config, layer)
