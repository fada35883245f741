"""Calibration of a KV codec: the keys and values a model computes over a fixed text.

A codec that sets :attr:`tallow.plugin.KVCodec.calibrated` derives per-layer tensors from the
statistics of a model's K/V (the offset that every key of a head shares, a scale per head).
Once the KV cache is allocated and before anything is stored in it, the engine runs the model
once over :data:`CALIBRATION_TEXT` with the plain-torch attention on scratch caches of its own,
records every layer's Q, K and V as the attention layer receives them, and hands them to
:meth:`~tallow.plugin.KVCodec.calibrate` layer by layer. The serving caches are untouched
until then and the prefix cache is empty, so every stored token sees the calibrated tensors.
"""

from __future__ import annotations

import logging
import time

import torch

from tallow.layers import AttentionMetadata
from tallow.layers.torch_attention import TorchAttentionBackend
from tallow.types import AttentionLayer, KVCodec, LayerKVCache

from .calibration_pass import MIN_DISTINCT_IDS, run_windows, text_windows
from .model_runner import ModelRunner
from .tokenizer import Tokenizer

log = logging.getLogger("tallow.engine")

#: Prose, dialogue, a list, numbers and code: the kinds of text a server sees, so that the
#: recorded statistics are those of ordinary tokens rather than of one register.
CALIBRATION_TEXT = """\
The harbour town woke slowly. Fishing boats came in on the grey tide, gulls circled the
market, and the baker on the corner set out loaves that had been rising since four. Nobody
hurried; the ferry would not leave before ten, and everyone knew it.

"Did you read the letter?" Mara asked, pulling her coat tighter.
"Twice," said Tomas. "They want the survey finished by the end of the month. Forty-two
sites, three people, one truck that starts when it feels like it."
"Then we start with the cliffs. The weather turns in a week."

Checklist for the survey:
1. Measure water depth at each marker, at low and high tide.
2. Record temperature (in degrees Celsius) and salinity (parts per thousand).
3. Photograph the shoreline from the same point every visit.

In 1998 the average depth at marker 17 was 12.4 metres; by 2021 it had fallen to 9.8, a
change of about 21 percent over 23 years.

def average_depth(readings: list[float]) -> float:
    \"\"\"Mean of the readings, ignoring missing values.\"\"\"
    values = [r for r in readings if r is not None]
    if not values:
        raise ValueError("no readings")
    return sum(values) / len(values)

SELECT site, AVG(depth) AS mean_depth FROM readings WHERE year >= 2015 GROUP BY site;

The report, when it came, was short: the channel is silting up, the old breakwater slows
the current, and dredging every second summer would keep the harbour open for another
fifty years. The council thanked the surveyors, filed the report, and argued about the
cost until winter.
"""

#: at most this many calibration tokens (the text is repeated when shorter)
MAX_TOKENS = 512

__all__ = [
    "CALIBRATION_TEXT",
    "MAX_TOKENS",
    "MIN_DISTINCT_IDS",
    "calibrate_kv_codec",
    "calibration_ids",
    "record_qkv",
]


def calibration_ids(
    tokenizer: Tokenizer, vocab_size: int, max_tokens: int = MAX_TOKENS
) -> list[int]:
    """Token ids of :data:`CALIBRATION_TEXT` under ``tokenizer``, repeated to fill
    ``max_tokens``: one window of :func:`tallow.engine.calibration_pass.text_windows` (ids
    outside the model's vocabulary dropped; ids drawn from the vocabulary when the tokenizer
    reads the text as fewer than :data:`MIN_DISTINCT_IDS` distinct ids)."""
    return text_windows(
        CALIBRATION_TEXT, tokenizer.encode, vocab_size, sequences=1, tokens=max_tokens, repeat=True
    )[0]


Recorded = dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


class _Recorder(TorchAttentionBackend):
    """The torch reference backend, keeping each layer's Q, K and V on the way through."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: Recorded = {}

    def forward(
        self,
        layer: AttentionLayer,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: LayerKVCache,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        if layer.kv_shared_from is None:  # a KV-sharing layer's k/v are placeholders
            self.seen[layer.layer_index] = (
                q.float().clone(),
                k.float().clone(),
                v.float().clone(),
            )
        return super().forward(layer, q, k, v, kv_cache, meta)


@torch.inference_mode()
def record_qkv(runner: ModelRunner, ids: list[int]) -> Recorded:
    """Each layer's Q [len(ids), Hq, D], K and V [len(ids), Hkv, D] (float32) over the
    prompt ``ids``, computed with the torch reference attention on scratch caches
    (:func:`tallow.engine.calibration_pass.run_windows`); the runner's caches and attention
    backend are left as they were."""
    recorder = _Recorder()
    run_windows(runner.model, [ids], runner.device, runner.dtype, backend=recorder)
    return recorder.seen


def calibrate_kv_codec(
    runner: ModelRunner, codec: KVCodec, tokenizer: Tokenizer, vocab_size: int
) -> None:
    """Run the calibration pass and hand every layer's Q/K/V to ``codec.calibrate``."""
    started = time.perf_counter()
    ids = calibration_ids(tokenizer, vocab_size)
    seen = record_qkv(runner, ids)
    for attn, cache in zip(runner.layers, runner.kv_caches):
        assert cache is not None  # the runner allocated every layer's cache
        codec.calibrate(cache, *seen[attn.layer.layer_index])
    log.info(
        "KV codec %s calibrated on %d tokens in %.1fs",
        codec.name,
        len(ids),
        time.perf_counter() - started,
    )
