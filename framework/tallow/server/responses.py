"""Response bodies of the API, as pydantic models.

The endpoints build their bodies as plain dicts (cheaper per token than model instances);
these models describe the same bodies for the OpenAPI document (:mod:`.openapi`), and the
reliability tests check every response the server sends against them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

_OPEN = ConfigDict(extra="allow")


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """Every failure: ``{"error": {...}}`` with the field at fault in ``param``."""

    error: ErrorDetail


class ModelCard(BaseModel):
    model_config = _OPEN
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class Usage(BaseModel):
    model_config = _OPEN
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class FunctionCall(BaseModel):
    name: str
    arguments: str


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"]
    function: FunctionCall


class ToolResultOut(BaseModel):
    content: str
    is_error: bool


class ServerToolCall(BaseModel):
    """A call the server ran itself (the tool loop, docs/mcp.md)."""

    index: int
    id: str
    type: Literal["function"]
    function: FunctionCall
    provider: str
    round: int
    result: ToolResultOut


class AssistantMessage(BaseModel):
    model_config = _OPEN
    role: Literal["assistant"]
    content: str | None
    tool_calls: list[ToolCallOut] | None = None
    #: tallow extension, with ``server_tools``: the calls the server ran, in order
    server_tool_calls: list[ServerToolCall] | None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: dict[str, Any] | None
    finish_reason: str


class ChatCompletionResponse(BaseModel):
    """A whole chat completion (``stream: true`` sends ``chat.completion.chunk`` events)."""

    model_config = _OPEN
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: dict[str, Any] | None
    finish_reason: str


class CompletionResponse(BaseModel):
    """A whole text completion (``stream: true`` sends ``text_completion`` events)."""

    model_config = _OPEN
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingData(BaseModel):
    object: Literal["embedding"]
    index: int
    #: the vector, or with ``encoding_format: base64`` its little-endian float32 bytes
    embedding: list[float] | str


class EmbeddingResponse(BaseModel):
    """``POST /v1/embeddings``: one entry per input, in input order."""

    object: Literal["list"]
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage


class TokenizeResponse(BaseModel):
    tokens: list[int]
    count: int
    max_model_len: int


class DetokenizeResponse(BaseModel):
    prompt: str


class HealthResponse(BaseModel):
    """The engine's load; ``status`` is ``error`` (with HTTP 503) once its loop has failed."""

    model_config = _OPEN
    status: Literal["ok", "error"]
    model: str
    server_inflight: int


class VersionResponse(BaseModel):
    version: str


class PluginsResponse(BaseModel):
    model_config = _OPEN
    object: Literal["list"]
    plugins: list[dict[str, Any]]
    components: dict[str, Any]
    #: each tool provider's name, distribution and state
    tool_providers: list[dict[str, Any]] = []


class ToolProviderOut(BaseModel):
    model_config = _OPEN
    name: str
    distribution: str
    running: bool
    status: dict[str, Any]
    tools: list[dict[str, Any]]


class ToolsResponse(BaseModel):
    """The tools the server runs itself, per provider, and the loop's defaults."""

    object: Literal["list"]
    server_tools: Literal["off", "always"]
    max_tool_rounds: int
    providers: list[ToolProviderOut]
