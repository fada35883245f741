"""How a step's rows are sampled (tallow.engine.sampling.StepRows): decided in one pass over
the rows when the step is launched, and that decision is what the draw and the
tensor-parallel broadcast read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from tallow import SamplingParams
from tallow.engine.sampling import StepRows
from tallow.engine.sampling import sampler as sampler_module


@dataclass
class _Seq:
    params: SamplingParams
    num_output_tokens: int = 0
    grammar: Any = None


GREEDY = SamplingParams(temperature=0.0)


@pytest.mark.parametrize(
    "seqs, all_argmax, any_grammar",
    [
        ([], True, False),
        ([_Seq(GREEDY), _Seq(GREEDY, 5)], True, False),
        ([_Seq(GREEDY), _Seq(SamplingParams(temperature=0.7))], False, False),
        ([_Seq(GREEDY), _Seq(SamplingParams(temperature=0.0, logprobs=2))], False, False),
        # min_tokens not reached yet: the EOS tokens are masked, so not a bare argmax
        ([_Seq(SamplingParams(temperature=0.0, min_tokens=3), 2)], False, False),
        ([_Seq(SamplingParams(temperature=0.0, min_tokens=3), 3)], True, False),
        # a grammar's mask still lets the row take the argmax, but not unmasked
        ([_Seq(GREEDY, grammar=object()), _Seq(GREEDY)], True, True),
        ([_Seq(SamplingParams(temperature=0.7), grammar=object())], False, True),
    ],
)
def test_rows_are_classified(seqs, all_argmax, any_grammar):
    rows = StepRows.of(seqs)
    assert (rows.all_argmax, rows.any_grammar) == (all_argmax, any_grammar)
    assert rows.plain_argmax == (all_argmax and not any_grammar)
    assert rows.steps == tuple(seq.num_output_tokens for seq in seqs)


def test_a_step_asks_each_row_once(monkeypatch):
    """One engine step over three greedy requests asks :func:`takes_argmax` once per row:
    the launch decides, the draw reuses the decision."""
    from tallow.config import config_from_mapping
    from tallow.engine.llm_engine import LLMEngine

    engine = LLMEngine.from_config(
        config_from_mapping(
            {
                "model": {
                    "source": "random:tiny-llama",
                    "dtype": "float32",
                    "device": "cpu",
                    "max_model_len": 64,
                },
                "cache": {"num_blocks": 32},
                "scheduler": {"async_scheduling": False},
            }
        )
    )
    asked: list[int] = []
    real = sampler_module.takes_argmax

    def counting(params: SamplingParams, num_output_tokens: int) -> bool:
        asked.append(num_output_tokens)
        return real(params, num_output_tokens)

    monkeypatch.setattr(sampler_module, "takes_argmax", counting)
    for prompt in ([5, 6, 7], [8, 9], [10, 11, 12, 13]):
        engine.add_request(
            engine.next_request_id(), prompt, SamplingParams(temperature=0.0, max_tokens=2)
        )
    engine.step()
    assert asked == [0, 0, 0]


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async-scheduling"])
def test_rows_beside_a_grammar_row_sample_as_they_do_alone(tiny_llama, async_scheduling):
    """A step with a grammar-constrained row is drawn once its grammars are up to date, after
    the scheduler has appended the step's placeholders: the other rows still draw at their
    launch step (a seeded row's tokens do not depend on the rest of the batch) and their
    penalties read only the tokens before it (no placeholder)."""
    from tallow import LLM, StructuredOutputsParams

    llm = LLM(
        model=str(tiny_llama),
        dtype="float32",
        device="cpu",
        num_blocks=256,
        block_size=4,
        async_scheduling=async_scheduling,
    )
    grammar = SamplingParams(
        temperature=0.0,
        max_tokens=8,
        structured_outputs=(
            StructuredOutputsParams(json={"type": "array", "items": {"type": "integer"}})
        ),
    )
    prompt = "def add(a, b):"
    greedy = llm.generate([prompt], [SamplingParams(temperature=0.0, max_tokens=8)])
    fourth = greedy[0].outputs[0].token_ids[3]
    for params in (
        SamplingParams(temperature=1.0, seed=7, max_tokens=8),
        SamplingParams(temperature=0.0, max_tokens=8, frequency_penalty=0.5),
        # the token greedy decoding writes fourth is masked up to the fourth
        SamplingParams(temperature=0.0, max_tokens=8, min_tokens=4, stop_token_ids=[fourth]),
    ):
        alone = llm.generate([prompt], [params])[0].outputs[0].token_ids
        beside = llm.generate([prompt, "The quick"], [params, grammar])[0].outputs[0].token_ids
        assert beside == alone, params
