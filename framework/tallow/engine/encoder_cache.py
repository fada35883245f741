"""The encoder cache and the multimodal inputs of a step.

The encoder (vision tower + projector) of an image runs on the device inside the step that
first computes one of the image's tokens; its output ``[num_tokens, hidden]`` is kept in an
LRU cache keyed by the image's hash with its own memory budget (``cache.encoder_cache_mb``),
so the next chunk of the same prompt, a recompute after preemption and another request with
the same image reuse it. An image whose tokens a prefix-cache hit already covers is never
encoded. The step's token budget counts image tokens like any prompt tokens; the encoder runs
whole for an image even when the step computes only part of its tokens (a chunk boundary may
fall inside an image: the next chunk takes its rows from the cache).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Sequence

import torch

from tallow.layers import MultimodalStep, VisionLanguageModel

from .multimodal import PromptImage
from .scheduler import ScheduledSeq

__all__ = ["EncoderCache", "EncoderStats", "MultimodalRunner"]


@dataclass
class EncoderStats:
    """Counters of the encoder cache since the engine started."""

    hits: int = 0
    misses: int = 0
    images_encoded: int = 0
    evictions: int = 0


@dataclass
class EncoderCache:
    """Encoder outputs by image hash, least recently used evicted beyond ``budget_bytes``."""

    budget_bytes: int
    stats: EncoderStats = field(default_factory=EncoderStats)
    _entries: OrderedDict[bytes, torch.Tensor] = field(default_factory=OrderedDict)
    _bytes: int = 0

    @property
    def used_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, digest: bytes) -> torch.Tensor | None:
        out = self._entries.get(digest)
        if out is None:
            self.stats.misses += 1
            return None
        self.stats.hits += 1
        self._entries.move_to_end(digest)
        return out

    def put(self, digest: bytes, embeds: torch.Tensor) -> None:
        """Keep ``embeds``, evicting older entries to stay within the budget; an output larger
        than the whole budget is not kept (it is used by its step only)."""
        size = embeds.numel() * embeds.element_size()
        if size > self.budget_bytes:
            return
        old = self._entries.pop(digest, None)
        if old is not None:
            self._bytes -= old.numel() * old.element_size()
        while self._entries and self._bytes + size > self.budget_bytes:
            _, evicted = self._entries.popitem(last=False)
            self._bytes -= evicted.numel() * evicted.element_size()
            self.stats.evictions += 1
        self._entries[digest] = embeds
        self._bytes += size


class MultimodalRunner:
    """Builds each step's :class:`~tallow.layers.MultimodalStep` for a vision-language model:
    encoder outputs of the step's image tokens (from the cache, or encoded now) and, for a
    model with several position axes, the positions of every row."""

    def __init__(
        self, model: VisionLanguageModel, cache: EncoderCache, device: torch.device
    ) -> None:
        self.model = model
        self.cache = cache
        self.device = device
        self.axes = int(model.position_axes)

    def stats(self) -> dict[str, float]:
        """The encoder cache's counters for ``engine.stats()`` (and ``/metrics``)."""
        st = self.cache.stats
        return {
            "encoder_cache_hits": st.hits,
            "encoder_cache_misses": st.misses,
            "images_encoded": st.images_encoded,
            "encoder_cache_evictions": st.evictions,
            "encoder_cache_bytes": self.cache.used_bytes,
        }

    def _embeds(self, image: PromptImage, step_outputs: dict[bytes, torch.Tensor]) -> torch.Tensor:
        known = step_outputs.get(image.digest)
        if known is not None:
            return known
        out = self.cache.get(image.digest)
        if out is None:
            out = self.model.encode_image(image.processed)
            if out.shape[0] != image.processed.num_tokens:
                raise RuntimeError(
                    f"the encoder made {out.shape[0]} embeddings for an image "
                    f"of {image.processed.num_tokens} tokens"
                )
            self.cache.stats.images_encoded += 1
            self.cache.put(image.digest, out)
        step_outputs[image.digest] = out
        return out

    def step_inputs(self, scheduled: Sequence[ScheduledSeq]) -> MultimodalStep | None:
        """The step's inputs, or None when no scheduled sequence has images."""
        if not any(item.seq.mm is not None for item in scheduled):
            return None
        pieces: list[torch.Tensor] = []
        rows: list[torch.Tensor] = []
        positions: list[torch.Tensor] = []
        step_outputs: dict[bytes, torch.Tensor] = {}
        t = 0
        for item in scheduled:
            start, n, mm = item.start, item.num_tokens, item.seq.mm
            end = start + n
            if mm is None:
                if self.axes > 1:
                    positions.append(torch.arange(start, end).expand(self.axes, -1))
                t += n
                continue
            if self.axes > 1:
                positions.append(mm.positions_of(start, end))
            for image in mm.overlapping(start, end):
                lo, hi = max(start, image.offset), min(end, image.end)
                out = self._embeds(image, step_outputs)
                pieces.append(out[lo - image.offset : hi - image.offset])
                rows.append(torch.arange(t + lo - start, t + hi - start))
            t += n
        step = MultimodalStep()
        if pieces:
            step.embeds = torch.cat(pieces)
            step.rows = torch.cat(rows).to(self.device)
        if positions:
            step.positions = torch.cat(positions, dim=1).to(self.device)
        return step
