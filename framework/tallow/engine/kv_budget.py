"""The KV cache's size: how many blocks the budget holds, and what a block costs.

The budget is ``cache.num_blocks`` when it is set, else ``cache.mem_mb``, else a share
(``cache.kv_fraction``) of what the GPU has free after the weights, or on a CPU what the
configured sequences need, capped. :func:`with_latent_groups` adds the latent (MLA) cache
groups' rows to the attention layers' cost, so that one figure prices a block of every group.
"""

from __future__ import annotations

import logging

import torch

from tallow.config import TallowConfig
from tallow.kernels import kv_cache
from tallow.layers import LatentCacheSpec, VisionLanguageModel

from .cache_groups import CacheGroup
from .loader import LoadedModel

log = logging.getLogger("tallow.engine")

_CPU_KV_CAP = 1 << 30  # never take more than this much RAM for the KV cache on a CPU


def kv_budget_blocks(
    config: TallowConfig,
    loaded: LoadedModel,
    bytes_per_block: int,
    max_model_len: int,
    fixed_bytes: int = 0,
) -> int:
    """Blocks of ``bytes_per_block`` (all layers) that the KV budget holds, after
    ``fixed_bytes`` of per-layer tensors that do not depend on the block count."""
    cache = config.cache
    if cache.num_blocks:
        return int(cache.num_blocks)
    if cache.mem_mb:
        budget = (int(cache.mem_mb) << 20) - fixed_bytes
    elif loaded.device.type == "cuda":
        torch.cuda.synchronize(loaded.device)
        free, total = torch.cuda.mem_get_info(loaded.device)
        # kv_fraction of what the card has left after weights and the activations of a step
        # (a margin for them and for CUDA graphs is kept back).
        reserve = min(4 << 30, int(0.05 * total))
        if isinstance(loaded.model, VisionLanguageModel):
            # the encoder cache's budget is not the KV cache's to take
            reserve += int(cache.encoder_cache_mb) << 20
        budget = int(cache.kv_fraction * max(0, free - reserve)) - fixed_bytes
    else:
        need = (
            config.scheduler.max_num_seqs
            * max_model_len
            * bytes_per_block
            // max(1, config.cache.block_size)
        )
        budget = min(_CPU_KV_CAP, need)
    blocks = max(0, budget) // bytes_per_block
    min_blocks = -(-max_model_len // config.cache.block_size)
    if blocks < min_blocks:
        log.warning(
            "KV budget of %d blocks cannot hold one %d-token sequence; using %d blocks",
            blocks,
            max_model_len,
            min_blocks,
        )
        blocks = min_blocks
    return int(blocks)


def with_latent_groups(
    cost: kv_cache.KVFootprint, groups: list[CacheGroup], block_bytes: list[int]
) -> kv_cache.KVFootprint:
    """``cost`` (the attention layers' K/V) with the latent (MLA) groups' rows added:
    ``block_bytes`` are the paged groups' bytes per block, in order; a 16-bit latent row is
    the reference of a latent layer."""
    paged = [g for g in groups if g.paged]
    extra = sum(b for g, b in zip(paged, block_bytes) if isinstance(g.spec, LatentCacheSpec))
    if not extra:
        return cost
    reference = sum(
        len(g.layers) * g.spec.width * kv_cache.REFERENCE_BYTES
        for g in paged
        if isinstance(g.spec, LatentCacheSpec)
    )
    return kv_cache.KVFootprint(
        cost.bytes_per_block + extra,
        cost.fixed_bytes,
        cost.block_size,
        cost.reference_bytes_per_token + reference,
    )
