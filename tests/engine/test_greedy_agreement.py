"""tallow.plugin.testing.engine.assert_greedy_agrees, the comparison of greedy completions up
to near-ties (CUDA graphs against eager steps): what it passes and what it catches, on made-up
completions and on the CPU engine's own completions of a batch against each prompt alone."""

from __future__ import annotations

import pytest
import torch

from tallow import LLM, SamplingParams
from tallow.engine.outputs import CompletionOutput, Logprob
from tallow.plugin.testing.engine import assert_greedy_agrees


def completion(steps: list[dict[int, float]]) -> CompletionOutput:
    """A greedy completion: at each position the best token of ``steps`` was chosen."""
    logprobs = [
        {
            t: Logprob(lp, rank=r)
            for r, (t, lp) in enumerate(sorted(s.items(), key=lambda x: -x[1]), 1)
        }
        for s in steps
    ]
    tokens = [max(s, key=s.__getitem__) for s in steps]
    return CompletionOutput(0, token_ids=tokens, logprobs=logprobs)


REF = [{1: -1.0, 2: -2.0}, {3: -1.0, 4: -1.0005}, {5: -0.5, 6: -3.0}]


def test_equal_completions_are_compared_in_full():
    assert assert_greedy_agrees([completion(REF)], [completion(REF)], tol=1e-3) == 3


def test_a_flip_at_a_near_tie_ends_the_comparison():
    flipped = [REF[0], {3: -1.0003, 4: -1.0002}, {7: -0.1, 6: -3.0}]  # then other inputs
    assert assert_greedy_agrees([completion(flipped)], [completion(REF)], tol=1e-3) == 1


def test_a_flip_past_the_margin_fails():
    # a token outside the reference's two best: no shared log-prob shows the drift
    flipped = [{9: -0.5, 1: -1.0}, *REF[1:]]
    with pytest.raises(AssertionError, match=r"position 0: token 9 != 1 .*1.000000 apart"):
        assert_greedy_agrees([completion(flipped)], [completion(REF)], tol=1e-3)
    # the two best swapped: their log-probs drift too far, whatever the tolerance allows
    swapped = [{1: -2.0, 2: -1.0}, *REF[1:]]
    with pytest.raises(AssertionError, match="log-prob of token"):
        assert_greedy_agrees([completion(swapped)], [completion(REF)], tol=1.5)


def test_log_prob_drift_fails_with_equal_tokens():
    drifted = [{1: -1.0, 2: -2.01}, *REF[1:]]
    with pytest.raises(AssertionError, match=r"position 0: log-prob of token 2"):
        assert_greedy_agrees([completion(drifted)], [completion(REF)], tol=1e-3)


def test_missing_logprobs_are_a_clear_error():
    bare = CompletionOutput(0, token_ids=[1])
    with pytest.raises(ValueError, match="logprobs=2"):
        assert_greedy_agrees([bare], [bare], tol=1e-3)


def test_a_batch_agrees_with_each_prompt_alone_on_the_cpu():
    """The GPU test's float32 comparison on the CPU engine: tiny-qwen3-next's 16 prompts of the
    GPU test's batch, together (decode batches of up to 16 rows on 16 state slots) and one at
    a time, agree within its tolerance over most positions."""
    llm = LLM(
        model="random:tiny-qwen3-next",
        device="cpu",
        dtype="float32",
        max_model_len=1024,
        num_blocks=512,
    )
    g = torch.Generator().manual_seed(0)
    prompts = [
        [
            torch.randint(0, 512, (int(n),), generator=g).tolist()
            for n in torch.randint(3, 400, (size,), generator=g)
        ]
        for size in (1, 4, 16)
    ][-1]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=2)
    together = [o.outputs[0] for o in llm.generate(prompts, params)]
    alone = [llm.generate([p], params)[0].outputs[0] for p in prompts]
    compared = assert_greedy_agrees(together, alone, tol=1e-3, what="batch of 16")
    assert compared >= 0.8 * 16 * 16, compared
