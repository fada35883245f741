"""Paged attention in plain torch that reads each sequence's keys and values through its
block table and runs ``torch.nn.functional.scaled_dot_product_attention`` with a causal
(and sliding-window or chunk) mask, or none for bidirectional layers. Serves every device torch runs
on and every KV codec, through the codec's reference ``encode`` and ``decode``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from tallow.plugin import AttentionBackend


class DenseTorchBackend(AttentionBackend):
    name: ClassVar[str] = "{{ cookiecutter.component_name }}"
    # stores and reads any codec's cache with the codec's own torch reference
    uses_codec_reference: ClassVar[bool] = True
    # forward masks chunked local attention (Llama 4's attention_chunk_size)
    supports_chunked_attention: ClassVar[bool] = True

    def __init__(self, config: Any = None) -> None:
        self.config = config

    @classmethod
    def validate(cls, config: Any) -> list[str]:
        return []

    def forward(self, layer: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                kv_cache: Any, meta: Any) -> torch.Tensor:
        codec = kv_cache.codec
        codec.encode(kv_cache, k, v, meta.slot_mapping)
        starts = meta.query_start_loc_cpu or meta.query_start_loc.tolist()
        lens = meta.seq_lens_cpu or meta.seq_lens.tolist()
        out = torch.zeros_like(q)
        group = layer.num_heads // layer.num_kv_heads
        for i, seq_len in enumerate(lens):
            start, end = starts[i], starts[i + 1]
            if end == start:
                continue
            blocks = meta.block_tables[i, :-(-seq_len // kv_cache.block_size)].long()
            keys, values = codec.decode(kv_cache, blocks)
            n = end - start
            q_pos = torch.arange(seq_len - n, seq_len, device=q.device)[:, None]
            k_pos = torch.arange(seq_len, device=q.device)[None, :]
            # an encoder layer (causal False) sees its whole sequence
            allowed = k_pos <= q_pos if layer.causal else k_pos < seq_len
            if layer.sliding_window:
                allowed &= q_pos - k_pos < layer.sliding_window
            chunk = getattr(layer, "attention_chunk_size", None)
            if chunk:  # chunked local attention (Llama 4): only the query's own chunk
                allowed &= k_pos // chunk == q_pos // chunk
            scores_q = q[start:end].float().transpose(0, 1)  # [Hq, n, D]
            keys = keys[:seq_len].repeat_interleave(group, 1).transpose(0, 1)
            values = values[:seq_len].repeat_interleave(group, 1).transpose(0, 1)
            if layer.logit_softcap:
                raise NotImplementedError("logit softcap")  # refused in supports_layer
            o = F.scaled_dot_product_attention(scores_q, keys, values, attn_mask=allowed,
                                               scale=layer.scale)
            out[start:end] = o.transpose(0, 1).to(q.dtype)
        return out

    def supports_layer(self, layer: Any) -> list[str]:
        reasons = []
        if layer.logit_softcap:
            reasons.append("logit softcap is not implemented")
        if getattr(layer, "sinks", None) is not None:  # gpt-oss: SDPA has no sink term
            reasons.append("attention sinks are not implemented")
        return reasons
