"""Start-up decisions of an engine built to embed (``model.task`` resolved to ``embed``).

Pooling and normalization come from ``model.pooling`` / ``model.normalize_embeddings`` when
set, else from the checkpoint's files (:class:`tallow.plugin.EmbeddingSpec`), else from the
architecture (``default_pooling``; normalized). The input limit is ``model.max_model_len``, else
the sentence-transformers ``max_seq_length`` (the length the model was trained for), else the
model's position limit. Because every input is computed whole in one step, a step must hold
the longest one, and at most two steps' worth of sequences (the one running and the one
planned beside it) ever hold KV blocks: the cache is sized for that, not for the device.
"""

from __future__ import annotations

import logging
import torch

from tallow.config import TallowConfig
from tallow.layers import Pooler

from .embedding import EmbeddingInfo
from .loader import LoadedModel

log = logging.getLogger("tallow.engine")


def embedding_info(config: TallowConfig, loaded: LoadedModel) -> EmbeddingInfo:
    """The served model's embeddings (see the module docstring)."""
    spec = loaded.checkpoint.embedding
    arch = loaded.config.text
    pooling: str = config.model.pooling
    if pooling == "auto":
        pooling = (
            spec.pooling
            if spec is not None and spec.pooling
            else getattr(type(loaded.model), "default_pooling", "last")
        )
    normalize = config.model.normalize_embeddings
    if normalize is None:
        normalize = (
            bool(spec.normalize) if spec is not None and spec.normalize is not None else True
        )
    size = int(arch.get("hidden_size") or 0)
    matryoshka = arch.get("matryoshka_dimensions")
    info = EmbeddingInfo(
        pooling=pooling,
        normalize=normalize,
        size=size,
        matryoshka_dimensions=tuple(int(d) for d in matryoshka) if matryoshka else None,
        lowercase=bool(spec.lowercase) if spec is not None else False,
    )
    log.info(
        "embeddings: %s pooling, %s, %d dimensions%s",
        pooling,
        "normalized" if normalize else "not normalized",
        size,
        f" (pooling settings from {spec.source})" if spec is not None and spec.source else "",
    )
    return info


def pooler_for(info: EmbeddingInfo) -> Pooler:
    return Pooler(info.pooling, info.normalize)


def embedding_max_model_len(config: TallowConfig, loaded: LoadedModel) -> int:
    """The longest input (see the module docstring)."""
    limit = position_limit(loaded.model)
    if config.model.max_model_len:
        length = int(config.model.max_model_len)
        if limit is not None and length > limit:
            raise ValueError(
                f"model.max_model_len {length} is more than the model's {limit} position embeddings"
            )
        return length
    spec = loaded.checkpoint.embedding
    arch = loaded.config.text
    candidates = [
        n
        for n in (
            spec.max_seq_length if spec is not None else None,
            limit,
            arch.get("max_position_embeddings"),
        )
        if n
    ]
    return int(min(candidates)) if candidates else 4096


def position_limit(model: torch.nn.Module) -> int | None:
    """The most positions a model with a learned position table can take (None: no such
    limit, e.g. rotary embeddings)."""
    limit = getattr(model, "position_limit", None)
    return limit() if callable(limit) else None


def step_token_budget(config: TallowConfig, max_model_len: int) -> int:
    """``scheduler.max_num_batched_tokens``, raised to hold one whole longest input."""
    budget = int(config.scheduler.max_num_batched_tokens)
    if budget < max_model_len:
        log.info(
            "embeddings: steps take up to %d tokens (max_model_len) instead of %d "
            "(scheduler.max_num_batched_tokens): an input is computed whole in one step",
            max_model_len,
            budget,
        )
        return max_model_len
    return budget


def cap_kv_blocks(
    blocks: int, config: TallowConfig, max_num_batched_tokens: int, max_model_len: int
) -> int:
    """KV blocks for two steps of embedding inputs at most (one block of slack per sequence),
    and never fewer than one longest input needs."""
    if config.cache.num_blocks:
        return blocks
    bs = config.cache.block_size
    per_step = -(-max_num_batched_tokens // bs) + config.scheduler.max_num_seqs
    return min(blocks, max(2 * per_step, -(-max_model_len // bs)))
