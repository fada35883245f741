"""Prompt lookup: propose what followed the last occurrence of the sequence's final n tokens.

Outputs that copy their input — an edited function, a quoted passage, code repeated with a
change — are predicted by their own context: when the last ``n`` tokens occurred earlier in the
prompt or the output, the tokens that followed them there are a good guess for what follows
now. The longest suffix (``prompt_lookup_max`` tokens) is tried first, down to
``prompt_lookup_min``; among earlier occurrences of a suffix the most recent one is taken (a
continuation being copied is usually the one just read). No model, no state: a proposal costs
one vectorised scan of the token ids.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from tallow.plugin import PluginSettingsError, SpeculationContext, Speculator

from .settings import settings_of


def lookup(tokens: np.ndarray, k: int, max_n: int, min_n: int) -> list[int]:
    """Up to ``k`` tokens that followed the latest earlier occurrence of the longest suffix of
    ``tokens`` (between ``max_n`` and ``min_n`` long) that occurred before; [] when none did."""
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = tokens[length - n :]
        # windows starting at 0 .. length - n - 1: every occurrence but the suffix itself
        windows = sliding_window_view(tokens[: length - 1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return tokens[start : start + k].tolist()
    return []


class NgramSpeculator(Speculator):
    """``ngram``: prompt lookup (settings ``prompt_lookup_max``, ``prompt_lookup_min`` under
    ``plugins.settings.tallow-speculator-ngram``)."""

    name = "ngram"

    def __init__(self, config: Any = None) -> None:
        super().__init__(config)
        settings = settings_of(config)
        self.max_n = settings.prompt_lookup_max
        self.min_n = settings.prompt_lookup_min

    @classmethod
    def validate(cls, config: Any) -> list[str]:
        try:
            settings_of(config)
        except PluginSettingsError as exc:
            return [str(exc)]
        return []

    def propose(self, token_ids: Sequence[int], k: int, context: SpeculationContext) -> list[int]:
        if len(token_ids) < self.min_n + 1:
            return []
        return lookup(np.asarray(token_ids, dtype=np.int64), k, self.max_n, self.min_n)
