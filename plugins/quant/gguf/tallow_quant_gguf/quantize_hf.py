"""A Hugging Face checkpoint (config.json, tokenizer.json, safetensors) as GGUF metadata and
GGUF tensor names, for llama and qwen2 models, as llama.cpp's ``convert_hf_to_gguf.py`` writes
them: the same keys, the same tensor names (through ``gguf``'s own name map), the Q/K row
permutation of ``llama`` files and the ``rope_freqs`` tensor of Llama 3 rope scaling.

Tokenizers must be byte-level BPE (Qwen2, Llama 3, GPT-2 style): the vocabulary, merges and
added tokens of ``tokenizer.json`` become ``tokenizer.ggml.*`` with model ``gpt2``, and the
pre-tokenizer's split pattern names ``tokenizer.ggml.pre``.
"""

from __future__ import annotations

import json
import math
from typing import Any, Iterator

import numpy as np

#: HF architectures → GGUF general.architecture
ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}

# tokenizer.json split patterns → tokenizer.ggml.pre (llama.cpp's names for them)
_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
PRE_TOKENIZERS = {
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+": "qwen2",
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+": "llama-bpe",
}

# gguf.TokenType
_NORMAL, _CONTROL, _USER_DEFINED, _UNUSED = 1, 3, 4, 5


class ConversionError(ValueError):
    """The checkpoint cannot be written as GGUF (an architecture or tokenizer not handled)."""


def gguf_architecture(checkpoint: Any) -> str:
    arch = ARCHITECTURES.get(checkpoint.architecture)
    if arch is None:
        raise ConversionError(
            f"{checkpoint.source}: architecture {checkpoint.architecture!r} cannot be written as "
            f"GGUF by tallow (supported: {', '.join(ARCHITECTURES)})"
        )
    return arch


def _rope_theta(config: dict[str, Any]) -> float:
    params = config.get("rope_parameters") or {}
    return float(config.get("rope_theta") or params.get("rope_theta") or 10000.0)


def _rope_scaling(config: dict[str, Any]) -> dict[str, Any] | None:
    scaling = config.get("rope_scaling") or config.get("rope_parameters") or None
    if not scaling:
        return None
    kind = scaling.get("rope_type") or scaling.get("type")
    return None if kind in (None, "default") else dict(scaling, rope_type=kind)


def head_dim(config: dict[str, Any]) -> int:
    return int(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])


def add_model_metadata(writer: Any, checkpoint: Any, arch: str) -> None:
    """The ``general.*`` and ``<arch>.*`` hyper-parameter keys from config.json."""
    import gguf

    c = checkpoint.config
    writer.add_name(str(c.get("_name_or_path") or checkpoint.source))
    writer.add_context_length(int(c.get("max_position_embeddings", 4096)))
    writer.add_embedding_length(int(c["hidden_size"]))
    writer.add_block_count(int(c["num_hidden_layers"]))
    writer.add_feed_forward_length(int(c["intermediate_size"]))
    writer.add_head_count(int(c["num_attention_heads"]))
    writer.add_head_count_kv(int(c.get("num_key_value_heads") or c["num_attention_heads"]))
    writer.add_rope_freq_base(_rope_theta(c))
    writer.add_layer_norm_rms_eps(float(c.get("rms_norm_eps", 1e-6)))
    dim = head_dim(c)
    writer.add_rope_dimension_count(dim)
    if dim != c["hidden_size"] // c["num_attention_heads"]:
        writer.add_key_length(dim)
        writer.add_value_length(dim)
    scaling = _rope_scaling(c)
    if scaling is None or scaling["rope_type"] == "llama3":
        return  # llama3 scaling travels as the rope_freqs tensor
    if scaling["rope_type"] == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(scaling["factor"]))
    elif scaling["rope_type"] == "yarn":
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(float(scaling["factor"]))
        writer.add_rope_scaling_orig_ctx_len(int(scaling["original_max_position_embeddings"]))
    else:
        raise ConversionError(
            f"{checkpoint.source}: rope scaling {scaling['rope_type']!r} is "
            "not written to GGUF by tallow (supported: linear, yarn, llama3)"
        )


def llama3_rope_factors(config: dict[str, Any]) -> np.ndarray | None:
    """The ``rope_freqs.weight`` divisors that encode Llama 3 rope scaling, or None."""
    scaling = _rope_scaling(config)
    if scaling is None or scaling["rope_type"] != "llama3":
        return None
    dim = head_dim(config)
    factor = float(scaling.get("factor", 8.0))
    low = float(scaling.get("low_freq_factor", 1.0))
    high = float(scaling.get("high_freq_factor", 4.0))
    old_ctx = float(scaling.get("original_max_position_embeddings", 8192))
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    factors = []
    for i in range(0, dim, 2):
        wavelen = 2 * math.pi * _rope_theta(config) ** (i / dim)
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            factors.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.asarray(factors, dtype=np.float32)


def _pre_tokenizer_name(spec: dict[str, Any], source: str) -> str:
    pre = spec.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    for step in steps:
        if step.get("type") == "Split":
            pattern = (step.get("pattern") or {}).get("Regex")
            if pattern in PRE_TOKENIZERS:
                return PRE_TOKENIZERS[pattern]
            raise ConversionError(
                f"{source}: tokenizer.json splits text with the pattern "
                f"{pattern!r}, which tallow cannot name for GGUF (known: the "
                "Qwen2 and Llama 3 patterns, and GPT-2's ByteLevel split)"
            )
    if any(s.get("type") == "ByteLevel" and s.get("use_regex", True) for s in steps):
        return "gpt2"
    raise ConversionError(
        f"{source}: tokenizer.json has no byte-level pre-tokenizer; only "
        "byte-level BPE tokenizers (Qwen2, Llama 3, GPT-2 style) are written"
    )


def add_tokenizer_metadata(writer: Any, checkpoint: Any) -> None:
    """``tokenizer.ggml.*`` (model gpt2), special token ids and the chat template."""
    if checkpoint.tokenizer is None:
        raise ConversionError(
            f"{checkpoint.source}: no tokenizer.json; a GGUF file must carry its vocabulary"
        )
    spec = json.loads(checkpoint.tokenizer.to_str())
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        raise ConversionError(
            f"{checkpoint.source}: tokenizer model {model.get('type')!r}; only "
            "byte-level BPE tokenizers are written to GGUF"
        )
    pre = _pre_tokenizer_name(spec, checkpoint.source)
    ids: dict[int, tuple[str, int]] = {i: (t, _NORMAL) for t, i in model["vocab"].items()}
    for added in spec.get("added_tokens", []):
        ids[int(added["id"])] = (
            added["content"],
            _CONTROL if added.get("special") else _USER_DEFINED,
        )
    size = max(int(checkpoint.config.get("vocab_size") or 0), max(ids) + 1)
    tokens, types = [], []
    for i in range(size):
        token, kind = ids.get(i, (f"[PAD{i}]", _UNUSED))
        tokens.append(token)
        types.append(kind)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    index = {t: i for i, t in enumerate(tokens)}
    tc = checkpoint.tokenizer_config
    for key, add in (
        ("bos_token", writer.add_bos_token_id),
        ("eos_token", writer.add_eos_token_id),
        ("pad_token", writer.add_pad_token_id),
    ):
        token = tc.get(key)
        token = token.get("content") if isinstance(token, dict) else token
        token_id = index.get(token) if token else checkpoint.config.get(f"{key}_id")
        if isinstance(token_id, int):
            add(token_id)
    writer.add_add_bos_token(bool(tc.get("add_bos_token", False)))
    if checkpoint.chat_template:
        writer.add_chat_template(checkpoint.chat_template)


def permute_qk(weights: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's row order for ``llama`` Q/K projections (rotary pairs interleaved)."""
    rows = weights.shape[0]
    return (
        weights.reshape(n_head, 2, rows // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def gguf_tensors(checkpoint: Any, arch: str) -> Iterator[tuple[str, Any]]:
    """``(GGUF name, tensor)`` for every weight of ``checkpoint`` (HF names mapped through the
    ``gguf`` package's tensor name map), Q/K permuted for llama, ``lm_head`` dropped when tied,
    and ``rope_freqs.weight`` added for Llama 3 scaling."""
    import gguf
    import torch

    config = checkpoint.config
    n_layers = int(config["num_hidden_layers"])
    names = gguf.get_tensor_name_map(
        next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch), n_layers
    )
    tied = bool(config.get("tie_word_embeddings", False))
    n_head = int(config["num_attention_heads"])
    n_kv = int(config.get("num_key_value_heads") or n_head)
    factors = llama3_rope_factors(config)
    if factors is not None:
        yield "rope_freqs.weight", torch.from_numpy(factors)
    for hf_name, tensor in checkpoint.tensors():
        if tied and hf_name == "lm_head.weight":
            continue
        if hf_name.endswith("rotary_emb.inv_freq"):
            continue
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ConversionError(
                f"{checkpoint.source}: tensor {hf_name!r} has no GGUF name for architecture {arch}"
            )
        if arch == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = n_head if name.endswith("attn_q.weight") else n_kv
            tensor = torch.from_numpy(permute_qk(tensor.float().numpy(), heads))
        yield name, tensor
