"""Replay: propose a recorded continuation, right for a chosen share of the proposed tokens.

For benchmarks of the verify step: record the target's own greedy outputs once, then serve the
same prompts with this speculator, and the cost of a step is measured at an acceptance rate
chosen in advance (``acceptance_rate``), independently of any real proposer. Each proposal is
``k`` tokens whose first ``m`` are the recorded ones and the rest are wrong (the recorded token
plus one), ``m`` chosen so that the kept share of all proposed tokens tracks
``acceptance_rate``: a running credit per sequence gains ``acceptance_rate * k`` per proposal
and pays for the tokens made right. A sequence whose prompt was not recorded gets no proposal.
"""

from __future__ import annotations

import json
import math
from typing import Any, Sequence

from tallow.plugin import PluginSettingsError, SpeculationContext, Speculator

from .settings import ReplayEntry, settings_of


class ReplaySpeculator(Speculator):
    """``replay`` (settings under ``plugins.settings.tallow-speculator-ngram.replay``)."""

    name = "replay"

    def __init__(self, config: Any = None) -> None:
        super().__init__(config)
        settings = settings_of(config).replay
        entries = list(settings.continuations)
        if settings.file is not None:
            with open(settings.file, encoding="utf-8") as f:
                entries.extend(ReplayEntry.model_validate(e) for e in json.load(f))
        self.acceptance_rate = settings.acceptance_rate
        self.recorded = {tuple(e.prompt): list(e.output) for e in entries}
        self._credit: dict[tuple[str, int], float] = {}

    @classmethod
    def validate(cls, config: Any) -> list[str]:
        try:
            settings = settings_of(config).replay
        except PluginSettingsError as exc:
            return [str(exc)]
        if not settings.continuations and settings.file is None:
            return [
                "replay needs recorded continuations (plugins.settings."
                "tallow-speculator-ngram.replay.continuations or .file)"
            ]
        return []

    def propose(self, token_ids: Sequence[int], k: int, context: SpeculationContext) -> list[int]:
        n = context.num_prompt_tokens
        output = self.recorded.get(tuple(token_ids[:n]))
        if output is None:
            return []
        done = len(token_ids) - n
        truth = output[done : done + k]
        if not truth:
            return []
        key = (context.request_id, context.index)
        credit = self._credit.get(key, 0.0) + self.acceptance_rate * len(truth)
        right = min(len(truth), math.floor(credit + 1e-9))
        self._credit[key] = credit - right
        return truth[:right] + [t + 1 for t in truth[right:]]

    def finished(self, request_id: str, index: int) -> None:
        self._credit.pop((request_id, index), None)
