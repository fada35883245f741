"""Sampling, in one place: what a request asks for and how its tokens are drawn.

* :mod:`.params` — :class:`~tallow.engine.sampling.params.SamplingParams`: every setting validated once, when it is built; the
  greedy rule (:attr:`~tallow.engine.sampling.params.SamplingParams.greedy`) and the other facts the engine derives from it.
* :mod:`.structured` — :class:`StructuredOutputsParams`: what a request's output must match.
* :mod:`.batch` — :class:`~tallow.engine.sampling.batch.SamplingBatch`: one step's rows laid out as tensors.
* :mod:`.filters` — top-k, top-p and min-p on scaled logits.
* :mod:`.sampler` — :class:`~tallow.engine.sampling.sampler.Sampler`: the processing order and the draw; :func:`~tallow.engine.sampling.sampler.takes_argmax`,
  the engine's test for rows that need nothing but an argmax, and :class:`~tallow.engine.sampling.sampler.StepRows`, what
  that test and the grammars say of a step's rows, decided once.
* :mod:`.grammar` — :class:`~tallow.engine.sampling.grammar.StructuredOutputs`: the grammar backend, compiled grammars, each
  constrained sequence's matcher (:class:`~tallow.engine.sampling.grammar.GrammarState`) and the step's token masks.

The kernels the sampler runs (logit edits, Gumbel noise and argmax, token masks) are in
:mod:`tallow.kernels.sampling` and :mod:`tallow.kernels.token_bitmask`, each with its torch
reference.
"""

from typing import Any

from .params import GREEDY_TEMPERATURE, MAX_LOGPROBS, InvalidParameter
from .structured import StructuredOutputsParams

# SamplingParams is imported from where it is defined, .params (publicly: `from tallow import
# SamplingParams`). The tensor side is imported on first use: building SamplingParams (what a
# client of the engine does) imports no torch.
_LAZY = {
    "RowParams": ".batch",
    "SamplingBatch": ".batch",
    "apply_min_p": ".filters",
    "apply_top_k": ".filters",
    "apply_top_p": ".filters",
    "Sampler": ".sampler",
    "SamplerOutput": ".sampler",
    "takes_argmax": ".sampler",
    "GrammarState": ".grammar",
    "StructuredOutputs": ".grammar",
    "StepRows": ".sampler",
}

__all__ = [
    "GREEDY_TEMPERATURE",
    "MAX_LOGPROBS",
    "InvalidParameter",
    "StructuredOutputsParams",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value
    return value
