"""Request fields → the engine's ``SamplingParams``, and the context-length check.

Defaults follow OpenAI: ``temperature`` and ``top_p`` 1, ``n`` 1; a chat completion without
``max_tokens``/``max_completion_tokens`` may use the rest of the context; a text completion
defaults to 16 tokens. Values the engine refuses raise its ``InvalidParameter`` (mapped to a 400
naming the field by :func:`tallow.server.errors.from_exception`).
"""

from __future__ import annotations

from typing import Any

from .errors import APIError, invalid
from .protocol import ChatCompletionRequest, CompletionRequest

# Request field → SamplingParams field, copied when the request sets it (not None).
_PASS_THROUGH = ("n", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                 "frequency_penalty", "presence_penalty", "seed", "min_tokens", "ignore_eos",
                 "stop_token_ids", "skip_special_tokens", "include_stop_str_in_output")


def context_error(prompt_len: int, max_model_len: int, param: str) -> APIError:
    return APIError(400, f"This model's maximum context length is {max_model_len} tokens, "
                    f"but the prompt has {prompt_len} tokens, leaving no room for a completion. "
                    "Shorten the prompt.", param=param, code="context_length_exceeded")


def resolve_max_tokens(requested: int | None, prompt_len: int, max_model_len: int,
                       prompt_param: str, tokens_param: str = "max_tokens") -> int:
    """The completion budget: ``requested``, or all that is left of the context when None.

    A prompt that fills the context, or a budget that does not fit next to the prompt, is a 400.
    """
    room = max_model_len - prompt_len
    if room <= 0:
        raise context_error(prompt_len, max_model_len, prompt_param)
    if requested is None:
        return room
    if requested > room:
        raise APIError(400, f"This model's maximum context length is {max_model_len} tokens. "
                       f"However, you requested {prompt_len + requested} tokens ({prompt_len} in "
                       f"the prompt, {requested} for the completion). Reduce the prompt or "
                       f"{tokens_param}.", param=tokens_param, code="context_length_exceeded")
    return requested


def build_sampling_params(req: ChatCompletionRequest | CompletionRequest, *, max_tokens: int,
                          vocab_size: int | None, logprobs: int | None = None,
                          prompt_logprobs: int | None = None,
                          structured_outputs: Any = None) -> Any:
    """The engine's ``SamplingParams`` for ``req`` (imported lazily: it lives in the engine);
    ``structured_outputs`` is the GrammarSpec its output must match, if any."""
    from tallow.engine.sampling import SamplingParams

    kwargs: dict[str, Any] = {name: getattr(req, name) for name in _PASS_THROUGH
                              if getattr(req, name, None) is not None}
    if req.stop is not None:
        kwargs["stop"] = [req.stop] if isinstance(req.stop, str) else list(req.stop)
    if req.logit_bias:
        bias: dict[int, float] = {}
        for key, value in req.logit_bias.items():
            try:
                token = int(key)
            except ValueError:
                raise invalid("logit_bias", f"Invalid value for 'logit_bias': keys must be token "
                              f"ids, got {key!r}.") from None
            bias[token] = value
        kwargs["logit_bias"] = bias
    kwargs["max_tokens"] = max_tokens
    kwargs["logprobs"] = logprobs
    kwargs["prompt_logprobs"] = prompt_logprobs
    kwargs["structured_outputs"] = structured_outputs
    params = SamplingParams(**kwargs)
    if vocab_size:
        params.validate_vocab(vocab_size)
    return params
