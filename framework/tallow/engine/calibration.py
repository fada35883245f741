"""Runs a freshly loaded model over calibration text when its quant scheme asks for it
(:mod:`tallow.plugin.calibration`): the scheme's layers see their inputs, then the scheme
quantizes. It happens inside :func:`tallow.engine.loader.load_model`, before the model is
returned, so nothing else runs the model while its weights are still float."""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import torch

from tallow.kernels import kv_cache
from tallow.kernels.kv_cast import AutoKVCodec
from tallow.layers import Attention, AttentionMetadata, forward_context
from tallow.layers.torch_attention import TorchAttentionBackend
from tallow.plugin import CalibrationRequest, Checkpoint

log = logging.getLogger("tallow.engine")

#: tokens of K/V per cache block while calibrating
_BLOCK = 16
#: most tokens in one forward pass (several windows each)
_STEP_TOKENS = 4096


def default_calibration_text() -> str:
    """tallow's own Python source, file by file in path order: code with English docstrings
    and comments, present wherever tallow is installed, the same for a given version of it,
    and no benchmark's evaluation text."""
    root = Path(__file__).resolve().parents[1]
    files = sorted(root.rglob("*.py"))
    if not files:
        raise ValueError(f"no Python source under {root} to calibrate on; give the quant scheme "
                         "a calibration text")
    return "\n\n".join(f.read_text(encoding="utf-8") for f in files)


def builtin_calibration_text(corpus: str) -> str:
    """The text of a built-in calibration corpus (:data:`tallow.plugin.calibration.CORPORA`):
    ``source`` (:func:`default_calibration_text`) or a public-domain corpus of ``tallow bench
    perplexity``; ``ValueError`` naming the package to install when its package is missing."""
    if corpus == "source":
        return default_calibration_text()
    from tallow.bench.perplexity import CorpusError, corpus_text

    try:
        return corpus_text(corpus)
    except CorpusError as exc:
        raise ValueError(f"calibration corpus {corpus!r}: {exc}") from None


def calibration_windows(ids: list[int], sequences: int, tokens: int) -> list[list[int]]:
    """``sequences`` windows of ``tokens`` consecutive ``ids``, their starts spread evenly from
    the first id to the last whole window (they overlap only when the text is shorter than
    ``sequences * tokens``); ``ValueError`` when the text is shorter than one window."""
    if len(ids) < tokens:
        raise ValueError(f"the calibration text has {len(ids)} tokens, fewer than one window "
                         f"of {tokens}")
    last = len(ids) - tokens
    starts = [0] if sequences == 1 else [
        round(i * last / (sequences - 1)) for i in range(sequences)]
    return [ids[s:s + tokens] for s in starts]


def calibrate(model: torch.nn.Module, quant: Any, checkpoint: Checkpoint,
              device: torch.device, dtype: torch.dtype, max_tokens: int | None = None) -> bool:
    """Run ``model`` over the text ``quant`` asks for and tell it so; False when it asks for
    none. The text is tokenized by the checkpoint's tokenizer; windows are cut to the model's
    context, ``max_tokens``."""
    ask = getattr(quant, "calibration_request", None)
    request: CalibrationRequest | None = ask() if ask is not None else None
    if request is None:
        return False
    from .tokenizer import Tokenizer

    started = time.perf_counter()
    try:
        tokenizer = Tokenizer.from_checkpoint(checkpoint)
    except ValueError as exc:
        raise ValueError(f"quant scheme {quant.name!r} calibrates on text, which needs the "
                         f"checkpoint's tokenizer: {exc}") from None
    try:
        text = (request.text if request.text is not None
                else builtin_calibration_text(request.corpus))
    except ValueError as exc:
        raise ValueError(f"quant scheme {quant.name!r}: {exc}") from None
    ids = tokenizer.encode(text, add_special_tokens=False)
    tokens = min(request.tokens, max_tokens or request.tokens)
    try:
        windows = calibration_windows(ids, request.sequences, tokens)
    except ValueError as exc:
        raise ValueError(f"quant scheme {quant.name!r}: {exc}") from None
    run_windows(model, windows, device, dtype)
    quant.calibrated()
    log.info("calibrated %s on %d windows of %d tokens in %.1fs", quant.name, len(windows),
             tokens, time.perf_counter() - started)
    return True


@torch.no_grad()
def run_windows(model: torch.nn.Module, windows: list[list[int]], device: torch.device,
                dtype: torch.dtype) -> None:
    """Prefill each window as a sequence of its own, a few per forward pass, with the core's
    torch attention on a KV cache made for them and removed afterwards (the engine's runner
    allocates its own later)."""
    longest = max(len(w) for w in windows)
    per_step = max(1, _STEP_TOKENS // longest)
    blocks_per_seq = math.ceil(longest / _BLOCK)
    attentions = [m for m in model.modules() if isinstance(m, Attention)]
    saved = [getattr(m, "kv_cache", None) for m in attentions]
    caches = kv_cache.allocate(AutoKVCodec(), [m.layer for m in attentions],
                               num_blocks=per_step * blocks_per_seq, block_size=_BLOCK,
                               model_dtype=dtype, device=device)
    for m, cache in zip(attentions, caches):
        m.kv_cache = cache
    backend = TorchAttentionBackend()
    try:
        for first in range(0, len(windows), per_step):
            batch = windows[first:first + per_step]
            meta, ids, positions = _prefill_metadata(batch, blocks_per_seq, device)
            with forward_context(meta, backend):
                model(ids, positions)
    finally:
        for m, cache in zip(attentions, saved):
            m.kv_cache = cache


def _prefill_metadata(batch: list[list[int]], blocks_per_seq: int,
                      device: torch.device) -> tuple[AttentionMetadata, torch.Tensor,
                                                     torch.Tensor]:
    """The metadata of one step prefilling every window of ``batch`` from its start, window
    ``i`` in cache blocks ``i * blocks_per_seq ...``."""
    starts, lens, slots, positions, ids = [0], [], [], [], []
    for i, window in enumerate(batch):
        n = len(window)
        ids.extend(window)
        positions.extend(range(n))
        slots.extend(i * blocks_per_seq * _BLOCK + p for p in range(n))
        starts.append(starts[-1] + n)
        lens.append(n)
    tables = [list(range(i * blocks_per_seq, (i + 1) * blocks_per_seq))
              for i in range(len(batch))]
    meta = AttentionMetadata(
        num_seqs=len(batch), num_tokens=len(ids),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(lens, dtype=torch.int32, device=device),
        block_tables=torch.tensor(tables, dtype=torch.int32, device=device),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        max_query_len=max(lens), max_seq_len=max(lens), block_size=_BLOCK,
        query_start_loc_cpu=starts, seq_lens_cpu=lens)
    return (meta, torch.tensor(ids, device=device),
            torch.tensor(positions, device=device))
