"""SamplingParams: validation names the field and the expectation; normalization; copies."""

from __future__ import annotations

import math

import pytest

from tallow.engine.errors import InvalidParameter
from tallow import SamplingParams
from tallow.engine.sampling.params import MAX_LOGPROBS


def test_defaults_are_vllm_defaults() -> None:
    p = SamplingParams()
    assert (p.n, p.temperature, p.top_p, p.top_k, p.min_p) == (1, 1.0, 1.0, 0, 0.0)
    assert (p.repetition_penalty, p.frequency_penalty, p.presence_penalty) == (1.0, 0.0, 0.0)
    assert p.max_tokens == 16 and p.min_tokens == 0 and p.seed is None
    assert p.stop == [] and p.stop_token_ids == [] and p.logit_bias is None
    assert p.logprobs is None and p.prompt_logprobs is None
    assert p.skip_special_tokens and p.spaces_between_special_tokens
    assert not p.ignore_eos and not p.include_stop_str_in_output
    assert not p.greedy


def test_message_example_from_the_contract() -> None:
    with pytest.raises(InvalidParameter) as info:
        SamplingParams(temperature=-1)
    assert info.value.field == "temperature"
    assert str(info.value) == "temperature must be >= 0, got -1"
    assert isinstance(info.value, ValueError)


BAD = [
    (dict(n=0), "n", ">= 1"),
    (dict(n=1.5), "n", "integer"),
    (dict(n=True), "n", "integer"),
    (dict(temperature="hot"), "temperature", "number"),
    (dict(temperature=math.nan), "temperature", "finite"),
    (dict(temperature=math.inf), "temperature", "finite"),
    (dict(top_p=0.0), "top_p", "(0, 1]"),
    (dict(top_p=1.01), "top_p", "(0, 1]"),
    (dict(top_k=-2), "top_k", "-1 or 0 (off) or a positive integer"),
    (dict(top_k=2.0), "top_k", "integer"),
    (dict(min_p=-0.1), "min_p", "[0, 1]"),
    (dict(min_p=1.5), "min_p", "[0, 1]"),
    (dict(repetition_penalty=0.0), "repetition_penalty", "> 0"),
    (dict(frequency_penalty=2.5), "frequency_penalty", "[-2, 2]"),
    (dict(presence_penalty=-3), "presence_penalty", "[-2, 2]"),
    (dict(logit_bias=[1, 2]), "logit_bias", "mapping"),
    (dict(logit_bias={"abc": 1.0}), "logit_bias", "token ids"),
    (dict(logit_bias={-1: 1.0}), "logit_bias", "token ids"),
    (dict(logit_bias={5: 101}), "logit_bias", "[-100, 100]"),
    (dict(logit_bias={5: "x"}), "logit_bias", "number"),
    (dict(seed=2**63), "seed", "64-bit"),
    (dict(seed="7"), "seed", "integer"),
    (dict(max_tokens=0), "max_tokens", ">= 1"),
    (dict(min_tokens=-1), "min_tokens", ">= 0"),
    (dict(min_tokens=5, max_tokens=4), "min_tokens", "<= max_tokens (4)"),
    (dict(stop=5), "stop", "string or a list of strings"),
    (dict(stop=["ok", 3]), "stop", "only strings"),
    (dict(stop=[""]), "stop", "must not be empty"),
    (dict(stop_token_ids=[1, -4]), "stop_token_ids", "token id"),
    (dict(stop_token_ids="12"), "stop_token_ids", "list of token ids"),
    (dict(ignore_eos=1), "ignore_eos", "true or false"),
    (dict(skip_special_tokens=None), "skip_special_tokens", "true or false"),
    (dict(logprobs=-1), "logprobs", f"between 0 and {MAX_LOGPROBS}"),
    (dict(logprobs=MAX_LOGPROBS + 1), "logprobs", f"between 0 and {MAX_LOGPROBS}"),
    (dict(prompt_logprobs=100), "prompt_logprobs", f"between 0 and {MAX_LOGPROBS}"),
]


@pytest.mark.parametrize(
    "kwargs, field, expected", BAD, ids=[f"{f}:{k[f] if f in k else ''}" for k, f, _ in BAD]
)
def test_bad_values_name_the_field(kwargs: dict, field: str, expected: str) -> None:
    with pytest.raises(InvalidParameter) as info:
        SamplingParams(**kwargs)
    assert info.value.field == field
    message = str(info.value)
    assert message.startswith(field)
    assert expected in message


def test_normalization() -> None:
    p = SamplingParams(
        stop="###",
        stop_token_ids=(3, 4),
        logit_bias={"50": -100, 7: 2},
        temperature=0,
        top_k=-1,
        seed=-5,
        max_tokens=None,
    )
    assert p.stop == ["###"]
    assert p.stop_token_ids == [3, 4]
    assert p.logit_bias == {50: -100.0, 7: 2.0}
    assert isinstance(p.temperature, float)
    assert p.seed == -5 and p.max_tokens is None
    assert SamplingParams(stop=None, stop_token_ids=None).stop == []


@pytest.mark.parametrize(
    "kwargs, greedy",
    [
        (dict(temperature=0.0), True),
        (dict(temperature=5e-6), True),
        (dict(temperature=1e-4), False),
        (dict(top_k=1), True),
        (dict(top_k=2), False),
        (dict(top_k=-1), False),
        (dict(top_p=0.1), False),
    ],
)
def test_greedy(kwargs: dict, greedy: bool) -> None:
    assert SamplingParams(**kwargs).greedy is greedy


def test_clone_is_deep_and_validated() -> None:
    p = SamplingParams(stop=["a"], stop_token_ids=[1], logit_bias={2: 1.0})
    q = p.clone()
    assert q == p and q is not p
    q.stop.append("b")
    q.stop_token_ids.append(9)
    q.logit_bias[3] = 2.0  # type: ignore[index]
    assert p.stop == ["a"] and p.stop_token_ids == [1] and p.logit_bias == {2: 1.0}
    r = p.clone(max_tokens=99, temperature=0.0)
    assert r.max_tokens == 99 and r.greedy and p.max_tokens == 16
    with pytest.raises(InvalidParameter) as info:
        p.clone(top_p=2.0)
    assert info.value.field == "top_p"


def test_validate_vocab() -> None:
    p = SamplingParams(logit_bias={10: 1.0}, stop_token_ids=[3])
    p.validate_vocab(11)
    with pytest.raises(InvalidParameter) as info:
        p.validate_vocab(10)
    assert info.value.field == "logit_bias" and "token id 10" in str(info.value)
    with pytest.raises(InvalidParameter) as info:
        SamplingParams(stop_token_ids=[3, 12]).validate_vocab(12)
    assert info.value.field == "stop_token_ids" and "12 tokens" in str(info.value)
