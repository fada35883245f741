"""Request fields → the engine's ``SamplingParams``, and the context-length check.

Defaults follow OpenAI: ``temperature`` and ``top_p`` 1, ``n`` 1; a chat completion without
``max_tokens``/``max_completion_tokens`` may use the rest of the context; a text completion
defaults to 16 tokens. Values the engine refuses raise its ``InvalidParameter`` (mapped to a 400
naming the field by :func:`tallow.server.errors.from_exception`).
"""

from __future__ import annotations

from typing import TypeVar

from tallow.engine.sampling.params import SamplingParams
from tallow.plugin import GrammarSpec

from .errors import APIError, invalid
from .protocol import SamplingFields

T = TypeVar("T")

#: The engine's defaults, taken where a request leaves a field out (None).
_DEFAULTS = SamplingParams()


def _given(value: T | None, default: T) -> T:
    return default if value is None else value


def context_error(prompt_len: int, max_model_len: int, param: str) -> APIError:
    return APIError(
        400,
        f"This model's maximum context length is {max_model_len} tokens, "
        f"but the prompt has {prompt_len} tokens, leaving no room for a completion. "
        "Shorten the prompt.",
        param=param,
        code="context_length_exceeded",
    )


def resolve_max_tokens(
    requested: int | None,
    prompt_len: int,
    max_model_len: int,
    prompt_param: str,
    tokens_param: str = "max_tokens",
) -> int:
    """The completion budget: ``requested``, or all that is left of the context when None.

    A prompt that fills the context, or a budget that does not fit next to the prompt, is a 400.
    """
    room = max_model_len - prompt_len
    if room <= 0:
        raise context_error(prompt_len, max_model_len, prompt_param)
    if requested is None:
        return room
    if requested > room:
        raise APIError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. "
            f"However, you requested {prompt_len + requested} tokens ({prompt_len} in "
            f"the prompt, {requested} for the completion). Reduce the prompt or "
            f"{tokens_param}.",
            param=tokens_param,
            code="context_length_exceeded",
        )
    return requested


def build_sampling_params(
    req: SamplingFields,
    *,
    max_tokens: int,
    vocab_size: int | None,
    logprobs: int | None = None,
    prompt_logprobs: int | None = None,
    structured_outputs: GrammarSpec | None = None,
) -> SamplingParams:
    """The engine's ``SamplingParams`` for ``req``, field by field (a field renamed on either
    side is a type error here); ``structured_outputs`` is the GrammarSpec its output must
    match, if any. The completion budget and logprobs are the endpoint's to decide."""
    d = _DEFAULTS
    params = SamplingParams(
        n=_given(req.n, d.n),
        temperature=_given(req.temperature, d.temperature),
        top_p=_given(req.top_p, d.top_p),
        top_k=_given(req.top_k, d.top_k),
        min_p=_given(req.min_p, d.min_p),
        repetition_penalty=_given(req.repetition_penalty, d.repetition_penalty),
        frequency_penalty=_given(req.frequency_penalty, d.frequency_penalty),
        presence_penalty=_given(req.presence_penalty, d.presence_penalty),
        logit_bias=_logit_bias(req.logit_bias),
        seed=req.seed,
        max_tokens=max_tokens,
        min_tokens=_given(req.min_tokens, d.min_tokens),
        stop=[]
        if req.stop is None
        else [req.stop]
        if isinstance(req.stop, str)
        else list(req.stop),
        stop_token_ids=list(_given(req.stop_token_ids, d.stop_token_ids)),
        ignore_eos=_given(req.ignore_eos, d.ignore_eos),
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        skip_special_tokens=_given(req.skip_special_tokens, d.skip_special_tokens),
        include_stop_str_in_output=_given(
            req.include_stop_str_in_output, d.include_stop_str_in_output
        ),
        structured_outputs=structured_outputs,
    )
    if vocab_size:
        params.validate_vocab(vocab_size)
    return params


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float] | None:
    """JSON object keys are strings: ``{"50256": -100}`` is how clients send a token id."""
    if not bias:
        return None
    out: dict[int, float] = {}
    for key, value in bias.items():
        try:
            token = int(key)
        except ValueError:
            raise invalid(
                "logit_bias",
                f"Invalid value for 'logit_bias': keys must be token ids, got {key!r}.",
            ) from None
        out[token] = value
    return out
