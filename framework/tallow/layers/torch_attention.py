"""The plain-torch attention backend: correct everywhere, fast nowhere. The CPU path.

It serves every KV codec through the codec's own torch reference: ``encode`` stores the step's
K/V, ``decode`` reads each sequence's blocks back for :func:`paged_attention_ref`.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from tallow.kernels.attention_ref import paged_attention_ref
from tallow.kernels.kv_cache import LayerKVCache
from tallow.kernels.mla_ref import mla_attention_ref, store_latent_ref
from tallow.types import AttentionBackend, MLALayer

from .attention import AttentionLayer, AttentionMetadata


class TorchAttentionBackend(AttentionBackend):
    name: ClassVar[str] = "torch"
    supports_cuda_graph: ClassVar[bool] = False
    fused_kv_codecs: ClassVar[frozenset[str]] = frozenset()
    uses_codec_reference: ClassVar[bool] = True
    #: reads each layer's own cache group view of a step (sliding-window groups whose blocks
    #: are freed, beside full ones): every call takes its block tables from the metadata given
    supports_cache_groups: ClassVar[bool] = True
    #: latent attention through the torch reference: expanded K/V for sequences with several
    #: queries, the absorbed form for single-query ones
    supports_mla: ClassVar[bool] = True
    #: KV-sharing layers attend over their source layer's cache and store nothing
    supports_kv_sharing: ClassVar[bool] = True
    #: chunked local attention: the torch reference masks keys outside the query's chunk
    supports_chunked_attention: ClassVar[bool] = True

    def forward(
        self,
        layer: AttentionLayer,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: LayerKVCache,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        if layer.kv_shared_from is None:  # a sharing layer's k/v are placeholders
            kv_cache.codec.encode(kv_cache, k, v, meta.slot_mapping)
        qsl = meta.query_start_loc_cpu or meta.query_start_loc.tolist()
        lens = meta.seq_lens_cpu or meta.seq_lens.tolist()
        return paged_attention_ref(
            q,
            kv_cache,
            query_start_loc=qsl,
            seq_lens=lens,
            block_tables=meta.block_tables,
            scale=layer.scale,
            sliding_window=layer.sliding_window,
            logit_softcap=layer.logit_softcap,
            causal=layer.causal,
            sinks=layer.sinks,
            attention_chunk_size=layer.attention_chunk_size,
        )

    def forward_mla(
        self,
        layer: MLALayer,
        q_nope: torch.Tensor,
        q_pe: torch.Tensor,
        latent: torch.Tensor,
        cache: torch.Tensor,
        w_uk: torch.Tensor,
        w_uv: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        store_latent_ref(cache, latent, meta.slot_mapping)
        qsl = meta.query_start_loc_cpu or meta.query_start_loc.tolist()
        lens = meta.seq_lens_cpu or meta.seq_lens.tolist()
        return mla_attention_ref(
            q_nope,
            q_pe,
            cache,
            w_uk=w_uk,
            w_uv=w_uv,
            query_start_loc=qsl,
            seq_lens=lens,
            block_tables=meta.block_tables,
            scale=layer.scale,
        )
