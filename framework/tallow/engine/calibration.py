"""Runs a freshly loaded model over calibration text when its quant scheme asks for it
(:mod:`tallow.plugin.calibration`): the scheme's layers see their inputs, then the scheme
quantizes. It happens inside :func:`tallow.engine.loader.load_model`, before the model is
returned, so nothing else runs the model while its weights are still float."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from tallow.plugin import CalibrationRequest, Checkpoint, QuantScheme

from .calibration_pass import calibration_windows, run_windows, text_windows
from .corpora import CorpusError, corpus_text

log = logging.getLogger("tallow.engine")

__all__ = [
    "builtin_calibration_text",
    "calibrate",
    "calibration_windows",
    "default_calibration_text",
]


def default_calibration_text() -> str:
    """tallow's own Python source, file by file in path order: code with English docstrings
    and comments, present wherever tallow is installed, the same for a given version of it,
    and no benchmark's evaluation text."""
    root = Path(__file__).resolve().parents[1]
    files = sorted(root.rglob("*.py"))
    if not files:
        raise ValueError(
            f"no Python source under {root} to calibrate on; give the quant scheme "
            "a calibration text"
        )
    return "\n\n".join(f.read_text(encoding="utf-8") for f in files)


def builtin_calibration_text(corpus: str) -> str:
    """The text of a built-in calibration corpus (:data:`tallow.plugin.calibration.CORPORA`):
    ``source`` (:func:`default_calibration_text`) or a public-domain corpus of ``tallow bench
    perplexity`` (:mod:`tallow.engine.corpora`); ``ValueError`` naming the package to install
    when its package is missing."""
    if corpus == "source":
        return default_calibration_text()
    try:
        return corpus_text(corpus)
    except CorpusError as exc:
        raise ValueError(f"calibration corpus {corpus!r}: {exc}") from None


def calibrate(
    model: torch.nn.Module,
    quant: QuantScheme | None,
    checkpoint: Checkpoint,
    device: torch.device,
    dtype: torch.dtype,
    max_tokens: int | None = None,
    vocab_size: int | None = None,
) -> bool:
    """Run ``model`` over the text ``quant`` asks for and tell it so; False when it asks for
    none. The text is tokenized by the checkpoint's tokenizer (:func:`text_windows`: ids
    past the model's ``vocab_size``, the tokenizer's when None, are dropped); windows are cut
    to the model's context, ``max_tokens``."""
    ask = getattr(quant, "calibration_request", None)
    request: CalibrationRequest | None = ask() if ask is not None else None
    if request is None:
        return False
    assert quant is not None  # only a scheme asks for calibration text
    from .tokenizer import Tokenizer

    started = time.perf_counter()
    try:
        tokenizer = Tokenizer.from_checkpoint(checkpoint)
    except ValueError as exc:
        raise ValueError(
            f"quant scheme {quant.name!r} calibrates on text, which needs the "
            f"checkpoint's tokenizer: {exc}"
        ) from None
    try:
        text = (
            request.text if request.text is not None else builtin_calibration_text(request.corpus)
        )
    except ValueError as exc:
        raise ValueError(f"quant scheme {quant.name!r}: {exc}") from None
    tokens = min(request.tokens, max_tokens or request.tokens)
    try:
        windows = text_windows(
            text,
            lambda t: tokenizer.encode(t, add_special_tokens=False),
            int(vocab_size or tokenizer.vocab_size),
            sequences=request.sequences,
            tokens=tokens,
        )
    except ValueError as exc:
        raise ValueError(f"quant scheme {quant.name!r}: {exc}") from None
    if request.paired:
        windows = windows + windows
    run_windows(model, windows, device, dtype, one_pass=request.sequential)
    quant.calibrated()
    log.info(
        "calibrated %s on %d windows of %d tokens%s in %.1fs",
        quant.name,
        len(windows),
        tokens,
        " (paired)" if request.paired else " (sequential)" if request.sequential else "",
        time.perf_counter() - started,
    )
    return True
