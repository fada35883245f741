"""Llama 4 text models (Llama-4-Scout-17B-16E, Llama-4-Maverick-17B-128E): tallow-model-llama's
decoder with three kinds of attention layer and interleaved mixture-of-experts blocks.

Attention (:class:`Llama4Attention`), per layer ``i`` (:func:`layer_plan`):

- ``no_rope_layers[i] == 1`` (default: all but every ``no_rope_layer_interval``-th layer):
  RoPE on q and k (GPT-J pairing, ``2j`` with ``2j+1``), then with ``use_qk_norm`` a
  weightless RMS norm of every head of q and k (``rms_norm_eps``); these layers use chunked
  local attention when ``attention_chunk_size`` is set (``layer_types``
  ``"chunked_attention"``): a token sees only the earlier tokens of its own chunk;
- the other layers: no rotation, full causal attention; with ``attn_temperature_tuning`` the
  query of position ``p`` is scaled by ``log1p(floor((p + 1) / floor_scale)) * attn_scale + 1``.

MLP: layer ``i`` in ``moe_layers`` (default every ``interleave_moe_layer_step``-th, the last
of each step) is :class:`Llama4MoE`: the router's ``num_experts_per_tok`` best logits
(top-1 in the published models) through a sigmoid, each chosen expert fed its token
*pre-scaled* by that weight (``expert(w * x)``, not ``w * expert(x)``), plus a shared SwiGLU
expert of ``intermediate_size`` every token goes through. The other layers are dense SwiGLU
MLPs of ``intermediate_size_mlp``. Checkpoint names: :mod:`tallow_model_llama4.naming`.

``Llama4ForConditionalGeneration`` checkpoints (the published Scout and Maverick) serve their
text model: the config's ``text_config``, the tensors under ``language_model.``; the vision
tower is skipped, so prompts are text only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

import torch
from torch import nn

from tallow.layers import (
    ArchConfig,
    Attention,
    BuildContext,
    FusedExperts,
    FusedMoE,
    QKVParallelLinear,
    RotaryEmbedding,
    RouterSpec,
    RowParallelLinear,
    WeightNameMap,
)
from tallow_model_llama.model import LlamaForCausalLM, LlamaMLP

from .naming import TextModelNames, hf_name_map


@dataclass(frozen=True)
class LayerPlan:
    """What kind of decoder layer ``index`` is."""

    index: int
    use_rope: bool
    chunk_size: int | None
    moe: bool


def _int_list(config: ArchConfig, key: str, n_layers: int) -> list[int] | None:
    value = config.get(key)
    if not value:  # Llama 4 configs write [] for "the default"
        return None
    if len(value) != n_layers:
        raise ValueError(
            f"model config: {key} has {len(value)} entries, expected one per layer ({n_layers})"
        )
    return [int(v) for v in value]


def layer_plan(config: ArchConfig) -> list[LayerPlan]:
    """Each layer's rope, chunking and MoE, with ``Llama4TextConfig``'s defaults for what the
    config leaves out."""
    n = int(config.require("num_hidden_layers"))
    rope = _int_list(config, "no_rope_layers", n)
    if rope is None:
        interval = int(config.get("no_rope_layer_interval", 4))
        rope = [int((i + 1) % interval != 0) for i in range(n)]
    moe_layers = config.get("moe_layers")
    if moe_layers is None:
        step = int(config.get("interleave_moe_layer_step", 1))
        if step < 1:
            raise ValueError(f"model config: interleave_moe_layer_step must be >= 1, got {step}")
        moe_layers = list(range(step - 1, n, step))
    chunk = config.get("attention_chunk_size")
    types = config.get("layer_types")
    if types is None:
        types = ["chunked_attention" if r and chunk is not None else "full_attention" for r in rope]
    if len(types) != n:
        raise ValueError(f"model config: layer_types has {len(types)} entries, expected {n}")
    plans = []
    for i, kind in enumerate(types):
        if kind not in ("chunked_attention", "full_attention"):
            raise ValueError(
                f"model config: layer_types[{i}] is {kind!r}, expected "
                "'chunked_attention' or 'full_attention'"
            )
        chunk_size = None
        if kind == "chunked_attention":
            if not chunk:
                raise ValueError(
                    f"model config: layer {i} is 'chunked_attention' but "
                    "attention_chunk_size is not set"
                )
            chunk_size = int(chunk)
        plans.append(LayerPlan(i, bool(rope[i]), chunk_size, i in moe_layers))
    return plans


def _rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """RMS norm without a weight over the last dim, in float32 (transformers' order)."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class Llama4Attention(nn.Module):
    """qkv projection, RoPE + weightless q/k norm or temperature tuning (see the module
    docstring), paged attention (chunked on the chunked layers), output projection."""

    def __init__(
        self,
        config: ArchConfig,
        build: BuildContext,
        plan: LayerPlan,
        rotary: RotaryEmbedding,
        head_dim: int,
        prefix: str,
    ) -> None:
        super().__init__()
        hidden = int(config.hidden_size)
        heads = int(config.num_attention_heads)
        kv_heads = int(config.get("num_key_value_heads") or heads)
        bias = bool(config.get("attention_bias", False))
        self.head_dim = head_dim
        self.qkv_proj = QKVParallelLinear(
            hidden, head_dim, heads, kv_heads, bias, build=build, prefix=f"{prefix}.qkv_proj"
        )
        self.o_proj = RowParallelLinear(
            heads * head_dim, hidden, bias, build=build, prefix=f"{prefix}.o_proj"
        )
        self.rotary_emb = rotary if plan.use_rope else None
        self.qk_norm_eps = (
            float(config.get("rms_norm_eps", 1e-5))
            if plan.use_rope and config.get("use_qk_norm", True)
            else None
        )
        tuning = not plan.use_rope and bool(config.get("attn_temperature_tuning", True))
        self.floor_scale = float(config.get("floor_scale", 8192)) if tuning else None
        self.attn_scale = float(config.get("attn_scale", 0.1))
        self.attn = Attention(
            plan.index,
            self.qkv_proj.num_heads,
            self.qkv_proj.num_kv_heads,
            head_dim,
            attention_chunk_size=plan.chunk_size,
        )

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj.split(self.qkv_proj(hidden))
        n, d = q.shape[0], self.head_dim
        if self.rotary_emb is not None:
            q, k = self.rotary_emb(positions, q, k)
        if self.qk_norm_eps is not None:
            q = _rms(q.reshape(n, -1, d), self.qk_norm_eps).reshape(n, -1)
            k = _rms(k.reshape(n, -1, d), self.qk_norm_eps).reshape(n, -1)
        if self.floor_scale is not None:
            # longer contexts sharpen the softmax of the layers without position encoding
            scale = torch.log1p(torch.floor((positions.float() + 1.0) / self.floor_scale))
            q = (q * (scale * self.attn_scale + 1.0)[:, None]).to(q.dtype)
        return self.o_proj(self.attn(q, k, v))


class _InputScaledExperts(FusedExperts):
    """Llama 4's routed experts: each chosen expert runs on its token multiplied by the
    router weight, ``sum_k expert_k(w_k * x)``. Every (token, choice) pair becomes one row
    with weight 1, so the stacked parameters and the MoE methods stay those of
    :class:`~tallow.layers.FusedExperts`."""

    def forward(
        self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        tokens, top_k = topk_ids.shape
        scaled = (x[:, None, :] * topk_weights[..., None].to(x.dtype)).reshape(-1, x.shape[-1])
        ones = torch.ones(tokens * top_k, 1, dtype=torch.float32, device=x.device)
        out = super().forward(scaled, ones, topk_ids.reshape(-1, 1))
        return out.view(tokens, top_k, -1).sum(1)


class Llama4MoE(FusedMoE):
    """Llama 4's MoE block: sigmoid top-k router, input-scaled routed experts, a shared
    expert (see the module docstring)."""

    def __init__(self, config: ArchConfig, build: BuildContext, prefix: str) -> None:
        if config.get("hidden_act", "silu") not in ("silu", "swish"):
            raise ValueError(
                f"model config: hidden_act {config.get('hidden_act')!r} is not "
                "supported by the experts (SwiGLU)"
            )
        if build.expert_parallel and build.tp_size > 1:
            raise ValueError(
                "Llama 4's MoE block does not run under expert parallelism yet "
                "(its experts take router-scaled inputs); use tensor parallelism"
            )
        inter = int(config.require("intermediate_size"))
        super().__init__(
            int(config.require("num_local_experts")),
            int(config.hidden_size),
            inter,
            router=RouterSpec(top_k=int(config.get("num_experts_per_tok", 1)), scoring="sigmoid"),
            build=build,
            prefix=prefix,
            shared_intermediate_size=inter,
        )
        # same parameters and loader, a forward that scales the inputs instead of the outputs
        self.experts.__class__ = _InputScaledExperts


class Llama4ForCausalLM(LlamaForCausalLM):
    """Llama 4 text model (``Llama4ForCausalLM``)."""

    hf_architectures: ClassVar[tuple[str, ...]] = ("Llama4ForCausalLM",)
    gguf_architectures: ClassVar[tuple[str, ...]] = ()
    model_type: ClassVar[str] = "llama4_text"
    rope_neox_style: ClassVar[bool] = False  # Llama 4 rotates adjacent pairs (complex form)
    weight_name_maps = {"hf": hf_name_map()}

    def __init__(self, config: ArchConfig | dict[str, Any], build: BuildContext) -> None:
        cfg = config if isinstance(config, ArchConfig) else ArchConfig(config)
        self.plans = layer_plan(cfg)
        super().__init__(cfg, build)

    def build_attention(
        self,
        config: ArchConfig,
        build: BuildContext,
        layer: int,
        rotary: RotaryEmbedding,
        head_dim: int,
        prefix: str,
    ) -> nn.Module:
        return Llama4Attention(config, build, self.plans[layer], rotary, head_dim, prefix)

    def build_mlp(
        self, config: ArchConfig, build: BuildContext, layer: int, prefix: str
    ) -> nn.Module:
        if self.plans[layer].moe:
            return Llama4MoE(config, build, prefix)
        return LlamaMLP(
            int(config.hidden_size),
            int(config.require("intermediate_size_mlp")),
            config.get("hidden_act", "silu"),
            False,
            build,
            prefix,
        )

    def experts_to_rows(self, tensor: torch.Tensor, groups: dict[str, str]) -> torch.Tensor:
        """transformers' stacked experts ``[E, in, out]`` as tallow's ``[E, out, in]``."""
        if tensor.dim() != 3:
            raise ValueError(
                f"Llama 4 experts: expected a stacked [experts, in, out] tensor, "
                f"got shape {tuple(tensor.shape)}"
            )
        return tensor.transpose(1, 2)


class Llama4ForConditionalGeneration(Llama4ForCausalLM):
    """The text model of a multimodal Llama 4 checkpoint (``text_config``; the vision tower
    and its projector are skipped, so prompts are text only)."""

    hf_architectures = ("Llama4ForConditionalGeneration",)

    def __init__(self, config: ArchConfig | dict[str, Any], build: BuildContext) -> None:
        super().__init__(self.config_from_hf(dict(config)), build)

    def weight_names(self, naming: str) -> WeightNameMap:
        names = super().weight_names(naming)
        return TextModelNames(names) if naming == "hf" else names  # type: ignore[return-value]

    @classmethod
    def config_from_hf(cls, config: dict[str, Any]) -> dict[str, Any]:
        """The ``text_config``, with what only the outer config states (dtype, special token
        ids, tied embeddings)."""
        text = config.get("text_config")
        if text is None and "hidden_size" in config:
            return config  # already the text model's config
        if not isinstance(text, Mapping):
            raise ValueError(
                "model config: a Llama4ForConditionalGeneration config needs a "
                f"'text_config' object, got {type(text).__name__}"
            )
        flat = dict(text)
        for key in (
            "torch_dtype",
            "dtype",
            "eos_token_id",
            "bos_token_id",
            "pad_token_id",
            "tie_word_embeddings",
        ):
            if key in config and key not in flat:
                flat[key] = config[key]
        flat["architectures"] = list(config.get("architectures") or cls.hf_architectures)
        return flat
