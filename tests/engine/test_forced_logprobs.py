"""tallow.plugin.testing.forced_logprobs: teacher-forced log-probabilities equal those the
engine reported while generating the same tokens."""

from __future__ import annotations

import torch

from tallow import LLM, SamplingParams
from tallow.plugin.testing import forced_logprobs


def test_forced_logprobs_equal_those_of_generation(tiny: dict) -> None:
    llm = LLM(**tiny)
    prompt = [5, 17, 99, 3, 250]
    out = llm.generate(
        [prompt], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=1)
    )[0].outputs[0]
    generated = torch.tensor([pos[t].logprob for pos, t in zip(out.logprobs, out.token_ids)])
    forced = forced_logprobs(llm, prompt, out.token_ids)
    assert forced.shape == (6,) and bool((forced <= 0).all())
    torch.testing.assert_close(forced, generated, atol=1e-4, rtol=0)
