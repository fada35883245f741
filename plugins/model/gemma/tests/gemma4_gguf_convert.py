"""The GGUF files llama.cpp's converter (``convert_hf_to_gguf.py``, its ``Gemma4Model`` class)
writes for a transformers Gemma 4 text model, for the plugin's tests.

Metadata: the generic keys (:func:`tallow.plugin.testing.gguf_files.gguf_metadata`) with the
converter's Gemma 4 changes: ``attention.key_length`` / ``value_length`` are the full layers'
head size (``global_head_dim``), ``*_swa`` the sliding layers'; ``attention.sliding_window_pattern``
one flag per layer; ``attention.head_count_kv`` per layer when the config has
``num_global_key_value_heads``; ``feed_forward_length`` per layer under ``use_double_wide_mlp``;
``attention.shared_kv_layers``; ``embedding_length_per_layer_input``; ``rope.freq_base`` (full
layers) and ``rope.freq_base_swa``; ``rope.dimension_count`` the full head and
``rope.dimension_count_swa`` the sliding head; expert counts and width.

Tensors: named by the ``gguf`` package's map, norms as they are (no ``+ 1``), the router's
``scale`` as ``ffn_gate_inp.scale`` and ``per_expert_scale`` as ``ffn_down_exps.scale``,
``experts.gate_up_proj`` whole as ``ffn_gate_up_exps``, no ``output.weight`` for a tied head,
and ``rope_freqs``: 1 for each of the full layers' rotated frequency pairs, 1e30 for the rest.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from tallow.plugin.testing.gguf_files import gguf_metadata

ARCH = "gemma4"


def full_layer_shape(cfg: Any) -> tuple[int, int]:
    """(head size, KV heads) of the full layers: transformers 5 keeps them per layer
    (``per_layer_config``), where the released configs state ``global_head_dim`` and
    ``num_global_key_value_heads``, the keys the converter reads."""
    full = cfg.layer_types.index("full_attention")
    layer = cfg.per_layer_config[full]
    return int(layer.head_dim), int(layer.num_key_value_heads)


def gemma4_metadata(cfg: Any) -> dict[str, Any]:
    """The ``gemma4.*`` keys (without the prefix) the converter writes for text config ``cfg``."""
    full_dim, full_kv = full_layer_shape(cfg)
    # the config's own (sliding layers') values; per-layer ones are read per layer above
    cfg = SimpleNamespace(**cfg.to_dict())
    n = cfg.num_hidden_layers
    swa = [t == "sliding_attention" for t in cfg.layer_types]
    full_rope = cfg.rope_parameters["full_attention"]
    sliding_rope = cfg.rope_parameters["sliding_attention"]
    keys: dict[str, Any] = {
        "attention.key_length": full_dim,
        "attention.value_length": full_dim,
        "attention.key_length_swa": cfg.head_dim,
        "attention.value_length_swa": cfg.head_dim,
        "attention.sliding_window": cfg.sliding_window,
        "attention.sliding_window_pattern": swa,
        "attention.shared_kv_layers": cfg.num_kv_shared_layers,
        "embedding_length_per_layer_input": cfg.hidden_size_per_layer_input or 0,
        "rope.freq_base": float(full_rope["rope_theta"]),
        "rope.freq_base_swa": float(sliding_rope["rope_theta"]),
        "rope.dimension_count": full_dim,
        "rope.dimension_count_swa": cfg.head_dim,
    }
    if cfg.final_logit_softcapping:
        keys["final_logit_softcapping"] = float(cfg.final_logit_softcapping)
    if full_kv != cfg.num_key_value_heads:
        keys["attention.head_count_kv"] = [cfg.num_key_value_heads if s else full_kv for s in swa]
    if cfg.use_double_wide_mlp:
        first_shared = n - cfg.num_kv_shared_layers
        ff = cfg.intermediate_size
        keys["feed_forward_length"] = [ff if i < first_shared else 2 * ff for i in range(n)]
    if cfg.enable_moe_block:
        keys.update(
            expert_count=cfg.num_experts,
            expert_used_count=cfg.top_k_experts,
            expert_feed_forward_length=cfg.moe_intermediate_size,
        )
    return {k: v for k, v in gguf_metadata(cfg, **keys).items() if v is not None}


def rope_freqs(cfg: Any) -> np.ndarray:
    """The ``rope_freqs`` tensor: the full layers' frequency divisors."""
    full = cfg.rope_parameters["full_attention"]
    full_dim = full_layer_shape(cfg)[0]
    pairs = full_dim // 2
    rotated = int(full_dim * full["partial_rotary_factor"] / 2)
    return np.array([1.0] * rotated + [1e30] * (pairs - rotated), dtype=np.float32)


def gemma4_tensors(hf: Any) -> list[tuple[str, str | None, np.ndarray]]:
    """``(gguf name, hf name, float32 array)`` of every tensor the converter writes for
    ``hf`` (hf name None for ``rope_freqs``), named by the ``gguf`` package's map."""
    import gguf

    cfg = hf.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA4, cfg.num_hidden_layers)
    out: list[tuple[str, str | None, np.ndarray]] = []
    tied = cfg.tie_word_embeddings
    for name, tensor in hf.state_dict().items():
        if name == "lm_head.weight" and tied:
            continue
        array = np.ascontiguousarray(tensor.detach().float().numpy())
        if name.endswith(".router.scale"):
            mapped: str | None = name.replace("model.layers.", "blk.").replace(
                "router.scale", "ffn_gate_inp.scale"
            )
        elif name.endswith(".router.per_expert_scale"):
            mapped = name.replace("model.layers.", "blk.").replace(
                "router.per_expert_scale", "ffn_down_exps.scale"
            )
        else:
            if name.endswith((".weight", ".bias")):
                mapped = names.get_name(name, try_suffixes=(".weight", ".bias"))
            else:  # layer_scalar, experts.gate_up_proj / down_proj: given a ".weight"
                base = names.get_name(name)
                mapped = base + ".weight" if base else None
            if mapped is None:
                raise KeyError(f"the gguf name map of {ARCH!r} does not know {name!r}")
        out.append((mapped, name, array))
    out.append(("rope_freqs.weight", None, rope_freqs(cfg)))
    return out


def hf_weights_of(hf: Any, decoded: dict[str, np.ndarray]) -> None:
    """Load ``decoded`` arrays (by hf name) into ``hf`` (the weights a quantized file holds)."""
    state = {k: torch.from_numpy(v).view(hf.state_dict()[k].shape) for k, v in decoded.items()}
    hf.load_state_dict(state, strict=False)
    if hf.config.tie_word_embeddings:
        hf.tie_weights()
