"""What every calibration runs the model over, and how: windows of a text's token ids,
prefilled a few at a time on scratch caches.

Both calibrations use it: the weights' (:mod:`tallow.engine.calibration`, a quant scheme's
:class:`~tallow.plugin.CalibrationRequest`) and the KV codec's
(:mod:`tallow.engine.kv_calibration`). Each keeps its own text and window shape.
"""

from __future__ import annotations

import logging
import math
from typing import Callable

import torch

from tallow.kernels import kv_cache
from tallow.kernels.kv_cast import AutoKVCodec
from tallow.layers import Attention, AttentionMetadata, forward_context
from tallow.layers.torch_attention import TorchAttentionBackend

log = logging.getLogger("tallow.engine")

#: a tokenizer that reads a calibration text as fewer distinct ids does not know its words
MIN_DISTINCT_IDS = 32
#: tokens of K/V per scratch cache block
_BLOCK = 16
#: most tokens in one forward pass (several windows each)
_STEP_TOKENS = 4096


def calibration_windows(ids: list[int], sequences: int, tokens: int) -> list[list[int]]:
    """``sequences`` windows of ``tokens`` consecutive ``ids``, their starts spread evenly from
    the first id to the last whole window (they overlap only when the text is shorter than
    ``sequences * tokens``); ``ValueError`` when the text is shorter than one window."""
    if len(ids) < tokens:
        raise ValueError(
            f"the calibration text has {len(ids)} tokens, fewer than one window of {tokens}"
        )
    last = len(ids) - tokens
    starts = (
        [0] if sequences == 1 else [round(i * last / (sequences - 1)) for i in range(sequences)]
    )
    return [ids[s : s + tokens] for s in starts]


def text_windows(
    text: str,
    encode: Callable[[str], list[int]],
    vocab_size: int,
    *,
    sequences: int,
    tokens: int,
    repeat: bool = False,
) -> list[list[int]]:
    """``sequences`` windows of ``tokens`` ids of ``text`` under ``encode`` (a tokenizer's),
    spread over the text (:func:`calibration_windows`). Ids outside the model's vocabulary (a
    tokenizer larger than the model's embedding) are dropped. With ``repeat`` a text shorter
    than one window is repeated to fill it; without, it is a ``ValueError``.

    A tokenizer that reads the text as fewer than :data:`MIN_DISTINCT_IDS` distinct ids (a
    ``random:`` model's synthetic vocabulary reads every word as its unknown token) gets
    windows of ids drawn evenly from the vocabulary instead, seeded, so every engine of the
    model calibrates alike: statistics of one token repeated would fit the calibration to the
    positions alone, far from any served text."""
    ids = [i for i in encode(text) if 0 <= i < vocab_size]
    distinct = len(set(ids))
    if distinct < MIN_DISTINCT_IDS:
        log.info(
            "the tokenizer reads the calibration text as %d distinct ids: calibrating "
            "on %d x %d ids drawn from the vocabulary",
            distinct,
            sequences,
            tokens,
        )
        generator = torch.Generator().manual_seed(0)
        drawn = torch.randint(0, vocab_size, (sequences * tokens,), generator=generator)
        return [drawn[i * tokens : (i + 1) * tokens].tolist() for i in range(sequences)]
    if repeat:
        while len(ids) < tokens:
            ids = ids + ids
    return calibration_windows(ids, sequences, tokens)


@torch.no_grad()
def run_windows(
    model: torch.nn.Module,
    windows: list[list[int]],
    device: torch.device,
    dtype: torch.dtype,
    backend: TorchAttentionBackend | None = None,
    one_pass: bool = False,
) -> None:
    """Prefill each window as a sequence of its own, a few per forward pass (all of them in
    one with ``one_pass``), with the core's torch attention (``backend``: it or a subclass that
    looks at what passes through) on KV caches made for them and removed afterwards: the
    attention layers get their own caches back, untouched."""
    longest = max(len(w) for w in windows)
    per_step = len(windows) if one_pass else max(1, _STEP_TOKENS // longest)
    blocks_per_seq = math.ceil(longest / _BLOCK)
    attentions = [m for m in model.modules() if isinstance(m, Attention)]
    saved = [getattr(m, "kv_cache", None) for m in attentions]
    caches = kv_cache.allocate(
        AutoKVCodec(),
        [m.layer for m in attentions],
        num_blocks=min(per_step, len(windows)) * blocks_per_seq,
        block_size=_BLOCK,
        model_dtype=dtype,
        device=device,
    )
    for m, cache in zip(attentions, caches):
        m.kv_cache = cache
    backend = backend if backend is not None else TorchAttentionBackend()
    try:
        for first in range(0, len(windows), per_step):
            batch = windows[first : first + per_step]
            meta, ids, positions = _prefill_metadata(batch, blocks_per_seq, device)
            with forward_context(meta, backend):
                model(ids, positions)
    finally:
        for m, kept in zip(attentions, saved):
            m.kv_cache = kept


def _prefill_metadata(
    batch: list[list[int]], blocks_per_seq: int, device: torch.device
) -> tuple[AttentionMetadata, torch.Tensor, torch.Tensor]:
    """The metadata of one step prefilling every window of ``batch`` from its start, window
    ``i`` in cache blocks ``i * blocks_per_seq ...``."""
    starts, lens, ids = [0], [], []
    slots: list[int] = []
    positions: list[int] = []
    for i, window in enumerate(batch):
        n = len(window)
        ids.extend(window)
        positions.extend(range(n))
        slots.extend(i * blocks_per_seq * _BLOCK + p for p in range(n))
        starts.append(starts[-1] + n)
        lens.append(n)
    tables = [list(range(i * blocks_per_seq, (i + 1) * blocks_per_seq)) for i in range(len(batch))]
    meta = AttentionMetadata(
        num_seqs=len(batch),
        num_tokens=len(ids),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(lens, dtype=torch.int32, device=device),
        block_tables=torch.tensor(tables, dtype=torch.int32, device=device),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        max_query_len=max(lens),
        max_seq_len=max(lens),
        block_size=_BLOCK,
        query_start_loc_cpu=starts,
        seq_lens_cpu=lens,
    )
    return (
        meta,
        torch.tensor(ids, dtype=torch.int64, device=device),
        torch.tensor(positions, dtype=torch.int64, device=device),
    )
