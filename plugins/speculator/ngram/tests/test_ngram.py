"""The ``ngram`` and ``replay`` speculators on their own, and chosen through the configuration
on a tiny random model."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tallow import LLM, SamplingParams
from tallow.plugin import PluginSettingsError, SpeculationContext
from tallow_speculator_ngram.ngram import NgramSpeculator, lookup
from tallow_speculator_ngram.replay import ReplaySpeculator

DIST = "tallow-speculator-ngram"


class Config:
    """What the speculators read of a TallowConfig: the plugin settings."""

    def __init__(self, **settings: object) -> None:
        self.plugins = type("P", (), {"settings": {DIST: settings}})()


def ctx(prompt_len: int, request_id: str = "r") -> SpeculationContext:
    return SpeculationContext(request_id=request_id, index=0, num_prompt_tokens=prompt_len)


def test_lookup_takes_the_longest_suffix_and_its_latest_occurrence() -> None:
    t = np.array([1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 2, 3])
    # suffix [2, 3] occurs at 1 and 5; the latest (5) is followed by 7, 8, 5
    assert lookup(t, 3, 4, 1) == [7, 8, 5]
    # a longer suffix wins over a later short one: [1, 2, 3] at 0 and 4 -> after 4: 7, 8
    t = np.array([1, 2, 3, 4, 4, 1, 2, 3, 7, 8, 2, 3, 1, 2, 3])
    assert lookup(t, 2, 3, 1) == [7, 8]
    # what follows may be shorter than k (the match ends near the end)
    assert lookup(np.array([5, 6, 5, 6]), 4, 2, 2) == [5, 6]
    assert lookup(np.array([1, 2, 3, 4]), 3, 3, 1) == []
    assert lookup(np.array([7, 7]), 3, 3, 1) == [7]


def test_ngram_speculator_respects_its_settings() -> None:
    spec = NgramSpeculator(Config(prompt_lookup_max=3, prompt_lookup_min=3))
    tokens = [1, 2, 3, 4, 5, 0, 2, 3]  # only a 2-token suffix recurs
    assert spec.propose(tokens, 3, ctx(4)) == []
    spec = NgramSpeculator(Config(prompt_lookup_min=2))
    assert spec.propose(tokens, 3, ctx(4)) == [4, 5, 0]
    assert NgramSpeculator.validate(Config(prompt_lookup_min=5, prompt_lookup_max=2))
    with pytest.raises(PluginSettingsError, match="prompt_lookup_max"):
        NgramSpeculator(Config(prompt_lookup_max=0))
    assert NgramSpeculator.validate(None) == []


def test_replay_tracks_its_acceptance_rate(tmp_path) -> None:
    prompt, output = [10, 11, 12], list(range(100, 140))
    path = tmp_path / "recorded.json"
    path.write_text(json.dumps([{"prompt": prompt, "output": output}]))
    spec = ReplaySpeculator(Config(replay={"acceptance_rate": 0.5, "file": str(path)}))
    tokens, right, proposed = list(prompt), 0, 0
    for _ in range(8):
        got = spec.propose(tokens, 4, ctx(3))
        truth = output[len(tokens) - 3 :][:4]
        kept = 0
        while kept < len(got) and got[kept] == truth[kept]:
            kept += 1
        assert got[kept:] == [t + 1 for t in truth[kept:]]  # the rest is wrong
        right += kept
        proposed += len(got)
        tokens += truth[: kept + 1]
    assert right == proposed // 2
    assert spec.propose([1, 2, 3], 4, ctx(3)) == []  # an unrecorded prompt
    assert ReplaySpeculator.validate(Config())  # nothing recorded: a reason


def test_ngram_through_the_configuration_keeps_greedy_outputs(tmp_path) -> None:
    settings = dict(
        model="random:tiny-llama", device="cpu", dtype="float32", num_blocks=64, max_model_len=256
    )
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8] * 3 + [1, 2], [5, 6, 7] * 4, list(range(10, 40))]
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    base = LLM(**settings)
    want = [o.outputs[0].token_ids for o in base.generate(prompts, params)]
    llm = LLM(
        **settings, speculative={"method": "ngram", "num_speculative_tokens": 3, "adaptive": True}
    )
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == want
    assert llm.engine.core.stats()["spec_num_proposals"] > 0
    with pytest.raises(ValueError, match="registered: .*ngram"):
        LLM(**settings, speculative={"method": "no-such-speculator"})
