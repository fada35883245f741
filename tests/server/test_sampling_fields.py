"""Request fields → SamplingParams: every sampling field of a request reaches the engine, and a
field the request leaves out takes the engine's default."""

from __future__ import annotations

import dataclasses

import pytest

from tallow import SamplingParams
from tallow.server.errors import APIError
from tallow.server.protocol import ChatCompletionRequest, CompletionRequest
from tallow.server.sampling import build_sampling_params

# Every request field that build_sampling_params passes on, with a value other than the default.
_SET = {
    "n": 3,
    "temperature": 0.5,
    "top_p": 0.9,
    "top_k": 7,
    "min_p": 0.05,
    "repetition_penalty": 1.1,
    "frequency_penalty": 0.3,
    "presence_penalty": -0.4,
    "seed": 11,
    "min_tokens": 2,
    "ignore_eos": True,
    "stop_token_ids": [5, 6],
    "skip_special_tokens": False,
    "include_stop_str_in_output": True,
}


@pytest.mark.parametrize("model", [ChatCompletionRequest, CompletionRequest])
def test_every_sampling_field_of_a_request_reaches_the_params(model: type) -> None:
    body = (
        {"messages": [{"role": "user", "content": "hi"}]}
        if model is ChatCompletionRequest
        else {"prompt": "hi"}
    )
    req = model.model_validate({**body, **_SET, "stop": "END", "logit_bias": {"12": -5.0}})
    params = build_sampling_params(req, max_tokens=9, vocab_size=100, logprobs=2, prompt_logprobs=1)
    for name, value in _SET.items():
        assert getattr(params, name) == value, name
    assert params.stop == ["END"] and params.logit_bias == {12: -5.0}
    assert (params.max_tokens, params.logprobs, params.prompt_logprobs) == (9, 2, 1)


def test_a_request_that_sets_nothing_gets_the_engines_defaults() -> None:
    req = CompletionRequest.model_validate({"prompt": "hi"})
    params = build_sampling_params(req, max_tokens=16, vocab_size=None)
    assert dataclasses.asdict(params) == dataclasses.asdict(SamplingParams(max_tokens=16))


def test_logit_bias_keys_must_be_token_ids() -> None:
    req = CompletionRequest.model_validate({"prompt": "hi", "logit_bias": {"x": 1.0}})
    with pytest.raises(APIError) as err:
        build_sampling_params(req, max_tokens=4, vocab_size=None)
    assert err.value.param == "logit_bias"
