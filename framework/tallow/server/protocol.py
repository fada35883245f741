"""Request bodies of the API, as strict pydantic models.

Types are checked strictly (``"n": "2"`` and ``"n": true`` are refused, as OpenAI refuses them);
unknown fields are ignored, as OpenAI's SDKs expect. The ranges are OpenAI's documented ones.
Known OpenAI fields that tallow does not implement are accepted by the model and refused by
:func:`reject_unsupported` with a 400 naming the field, so nothing is silently dropped.

Besides OpenAI's fields, the vLLM-style sampling extensions of the engine are accepted:
``top_k``, ``min_p``, ``repetition_penalty``, ``min_tokens``, ``ignore_eos``,
``stop_token_ids``, ``skip_special_tokens``, ``include_stop_str_in_output`` and ``priority``;
and vLLM's guided-decoding fields (``guided_json``, ``guided_regex``, ``guided_choice``,
``guided_grammar``, ``structured_outputs``), which :mod:`tallow.server.structured` reads
together with ``response_format``.
"""

from __future__ import annotations

import json
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import APIError, invalid, unsupported

_STRICT = ConfigDict(strict=True, extra="ignore")


class StreamOptions(BaseModel):
    model_config = _STRICT
    include_usage: bool | None = False
    #: vLLM extension: a ``usage`` object on every chunk, not only the last
    continuous_usage_stats: bool | None = False


class SamplingFields(BaseModel):
    """Fields shared by chat and text completions."""

    model_config = _STRICT

    model: str | None = None
    n: int | None = Field(default=1, ge=1, le=128)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None

    # engine extensions (vLLM names)
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool | None = None
    include_stop_str_in_output: bool | None = None
    priority: int | None = 0

    # structured outputs (tallow.server.structured reads and checks them): OpenAI's, then vLLM's
    response_format: dict[str, Any] | None = None
    guided_json: object = None  # a schema (object, boolean or JSON text), checked by .structured
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    structured_outputs: dict[str, Any] | None = None


# The shape of one chat message, for the OpenAPI document; :mod:`.messages` checks it.
_TEXT_PART = {
    "type": "object",
    "required": ["type", "text"],
    "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
}
_MESSAGE: dict[str, Any] = {
    "type": "object",
    "required": ["role", "content"],
    "properties": {
        "role": {"enum": ["system", "developer", "user", "assistant", "tool"]},
        "content": {
            "anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}, {"type": "null"}]
        },
        "name": {"type": "string"},
        "tool_call_id": {"type": "string"},
        "tool_calls": {"type": "array", "items": {"type": "object"}},
    },
}


class ChatCompletionRequest(SamplingFields):
    """``POST /v1/chat/completions``. ``messages`` is checked by :mod:`.messages`."""

    messages: list[dict[str, Any]] = Field(min_length=1, json_schema_extra={"items": _MESSAGE})
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = True
    chat_template_kwargs: dict[str, Any] | None = None
    #: with a reasoning parser: false leaves reasoning_content out of the response
    include_reasoning: bool | None = True
    #: tallow extension: run the server's own tools in a loop (None: server.server_tools)
    server_tools: bool | None = None

    # known OpenAI fields that tallow refuses when they ask for something (see reject_unsupported)
    audio: object = None
    modalities: list[str] | None = None
    prediction: object = None
    web_search_options: object = None
    functions: object = None
    function_call: object = None
    #: passed to a chat template that uses it; refused otherwise (see ChatCompletion.prepare)
    reasoning_effort: object = None
    store: bool | None = None
    service_tier: str | None = None


class CompletionRequest(SamplingFields):
    """``POST /v1/completions``: ``prompt`` is a string, strings, token ids or lists of them."""

    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=0)
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool | None = False
    best_of: int | None = Field(default=None, ge=1)
    suffix: str | None = None


class EmbeddingRequest(BaseModel):
    """``POST /v1/embeddings``: ``input`` is a string, strings, token ids or lists of them."""

    model_config = _STRICT
    input: str | list[str] | list[int] | list[list[int]]
    model: str | None = None
    encoding_format: Literal["float", "base64"] | None = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None
    #: vLLM extension: cut inputs to this many tokens (-1: the model's limit) instead of
    #: refusing those that are longer
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)


class TokenizeRequest(BaseModel):
    """``POST /tokenize``: either ``prompt`` or chat ``messages``."""

    model_config = _STRICT
    model: str | None = None
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool | None = True


class DetokenizeRequest(BaseModel):
    """``POST /detokenize``."""

    model_config = _STRICT
    model: str | None = None
    tokens: list[int]
    skip_special_tokens: bool | None = False


M = TypeVar("M", bound=BaseModel)

# Tags pydantic puts in an error's location for union members; they are not field names.
_UNION_TAGS = {
    "str",
    "int",
    "float",
    "bool",
    "list",
    "dict",
    "none",
    "list[str]",
    "list[int]",
    "list[list[int]]",
    "dict[str,any]",
    "dict[str,float]",
    "StreamOptions",
}


def param_from_loc(loc: tuple[int | str, ...]) -> str:
    """``("messages", 2, "role")`` → ``"messages[2].role"``; union tags are dropped."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            continue
        text = str(part)
        if text.replace(" ", "") in _UNION_TAGS or "[" in text or text.startswith("function-"):
            continue
        out += ("." if out else "") + text
    return out


def parse_json_body(body: bytes) -> dict[str, object]:
    """The request body as a JSON object, or a 400 saying what is wrong with it.

    Besides JSON syntax, two things are refused here, once for every endpoint: nesting deeper
    than :data:`MAX_JSON_DEPTH` (deep documents exhaust the stack of whatever walks them
    later), and strings that are not Unicode text (JSON's ``\\ud800`` escape can spell a lone
    UTF-16 surrogate, which no tokenizer or encoder accepts).
    """
    if not body.strip():
        raise invalid(
            None, "The request body is empty; expected a JSON object.", code="invalid_json"
        )
    try:
        obj = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise invalid(
            None, f"The request body is not valid JSON: {exc}.", code="invalid_json"
        ) from None
    except RecursionError:
        raise _too_deep(None) from None
    if not isinstance(obj, dict):
        raise invalid(
            None,
            f"The request body must be a JSON object, not {type(obj).__name__}.",
            code="invalid_json",
        )
    _check_values(obj)
    return obj


#: Deepest nesting of objects and arrays a request body may have (the body itself is level 1).
MAX_JSON_DEPTH = 64
_SCALARS = frozenset({int, float, bool, type(None)})


def _shown(where: str) -> str:
    return where if len(where) <= 80 else where[:77] + "..."


def _too_deep(where: str | None) -> APIError:
    return invalid(
        where and _shown(where),
        f"The request body nests objects and arrays deeper "
        f"than {MAX_JSON_DEPTH} levels{f' (at {_shown(where)!r})' if where else ''}.",
        code="invalid_json",
    )


def _not_text(text: str) -> int | None:
    """The index of the first lone surrogate in ``text``, or None for proper Unicode text."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def _not_text_error(text: str, at: int, where: str) -> APIError:
    return invalid(
        _shown(where) or None,
        f"Invalid value for "
        f"{_shown(where) or 'the request body'!r}: the string holds a lone UTF-16 "
        f"surrogate (U+{ord(text[at]):04X} at character {at}); expected Unicode text.",
        code="invalid_unicode",
    )


def _check_values(obj: dict[str, object]) -> None:
    """Depth and Unicode of every value, iteratively (a recursive walk would overflow on the
    documents it must refuse). Lists of numbers, the common large case, are passed over in C;
    paths are spelled out only for containers and for the value at fault."""
    stack: list[tuple[dict[str, object] | list[object], int, str]] = [(obj, 1, "")]
    while stack:
        node, depth, where = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise _too_deep(where)
        if isinstance(node, dict):
            for key, value in node.items():
                if (at := _not_text(key)) is not None:
                    raise _not_text_error(key, at, where)
                if isinstance(value, str):
                    if (at := _not_text(value)) is not None:
                        raise _not_text_error(value, at, f"{where}.{key}" if where else key)
                elif isinstance(value, (dict, list)):
                    stack.append((value, depth + 1, f"{where}.{key}" if where else key))
        elif set(map(type, node)) - _SCALARS:
            for i, value in enumerate(node):
                if isinstance(value, str):
                    if (at := _not_text(value)) is not None:
                        raise _not_text_error(value, at, f"{where}[{i}]")
                elif isinstance(value, (dict, list)):
                    stack.append((value, depth + 1, f"{where}[{i}]"))


def parse_request(model: type[M], obj: dict[str, object]) -> M:
    """Validate ``obj`` as ``model``; the first problem becomes a 400 naming the field."""
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        # Prefer the error of a missing field, then the first one reported.
        first = next((e for e in errors if e["type"] == "missing"), errors[0])
        param = param_from_loc(tuple(first["loc"]))
        if first["type"] == "missing":
            raise invalid(
                param, f"Missing required parameter: {param!r}.", code="missing_required_parameter"
            ) from None
        got = first.get("input")
        shown = json.dumps(got)[:80] if _jsonable(got) else repr(got)[:80]
        raise invalid(
            param, f"Invalid value for {param!r}: {first['msg']} (got {shown})."
        ) from None


def _jsonable(value: object) -> bool:
    try:
        json.dumps(value)
        return True
    except (TypeError, ValueError):
        return False


def reject_unsupported(req: ChatCompletionRequest | CompletionRequest) -> None:
    """Refuse known OpenAI fields whose request tallow cannot honour (400 naming the field)."""
    if isinstance(req, ChatCompletionRequest):
        if req.audio is not None:
            raise unsupported("audio", "tallow produces text only")
        if req.modalities is not None and any(m != "text" for m in req.modalities):
            raise unsupported("modalities", 'only ["text"] is available')
        if req.prediction is not None:
            raise unsupported("prediction", "predicted outputs are not implemented")
        if req.web_search_options is not None:
            raise unsupported("web_search_options", "tallow does not search the web")
        if req.functions is not None:
            raise unsupported("functions", "use 'tools' instead of the legacy 'functions'")
        if req.function_call is not None:
            raise unsupported(
                "function_call", "use 'tool_choice' instead of the legacy 'function_call'"
            )
        if req.store:
            raise unsupported("store", "tallow does not store completions")
        if req.top_logprobs is not None and not req.logprobs:
            raise invalid("top_logprobs", "'top_logprobs' requires 'logprobs' to be true.")
    else:
        if req.suffix:
            raise unsupported("suffix", "fill-in-the-middle suffixes are not implemented")
        if req.best_of is not None and req.best_of != (req.n or 1):
            raise unsupported("best_of", "best_of must equal n (tallow returns every candidate)")


def stream_flags(req: SamplingFields) -> tuple[bool, bool]:
    """(include_usage, continuous_usage_stats) of a streaming request."""
    opts = req.stream_options
    if opts is None:
        return False, False
    if not req.stream:
        raise invalid("stream_options", "'stream_options' is only allowed when 'stream' is true.")
    return bool(opts.include_usage), bool(opts.continuous_usage_stats)


def check_model(name: str | None, served: set[str]) -> None:
    """404 for a model this server does not serve; an omitted model means the served one."""
    if name is None:
        return
    if name not in served:
        raise APIError(
            404,
            f"The model {name!r} does not exist on this server "
            f"(served: {', '.join(sorted(served))}).",
            param="model",
            code="model_not_found",
        )
