"""What every endpoint shares: the engine, the settings, metrics, the tool parser.

:class:`ServerState` also owns the server's admission limit (``server.max_queue``: requests
held at once, waiting or running, before new ones get a 503) and the work that is kept off the
event loop (rendering chat templates and tokenizing long prompts run in a worker thread).
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any, Callable, Mapping, TypeVar

import anyio
import tallow
from tallow.config import TallowConfig
from tallow.engine.chat_template import ChatTemplateTimeout
from tallow.engine.embedding import EmbeddingInfo
from tallow.engine.tokenizer import Tokenizer

from .errors import APIError, invalid
from .image_policy import ImagePolicy, policy_from_config
from .metrics import ServerMetrics
from .parsers import ToolParsing
from .reasoning import ReasoningParsing
from .served import ServedEngine
from .tool_providers import ToolProviders

if TYPE_CHECKING:
    from tallow.engine.sampling.grammar import StructuredOutputs

log = logging.getLogger("tallow.server")

# Prompts shorter than this are tokenized on the event loop: a thread hop costs more.
_INLINE_TOKENIZE_CHARS = 2048

_T = TypeVar("_T")


def _setting(config: TallowConfig | None, section: str, name: str, default: _T) -> _T:
    """``config.section.name``, ``default`` without a config (or a stand-in lacking it)."""
    return getattr(getattr(config, section, None), name, default) if config is not None else default


class ServerState:
    """Shared by the endpoints of one app. ``config`` may be None (defaults everywhere);
    ``tool_parsing`` is the server's :class:`~tallow.server.parsers.ToolParsing`,
    ``tool_providers`` its :class:`~tallow.server.tool_providers.ToolProviders`, ``reasoning``
    its :class:`~tallow.server.reasoning.ReasoningParsing` (default: no reasoning parser)."""

    def __init__(
        self,
        engine: ServedEngine,
        config: TallowConfig | None = None,
        tool_parsing: ToolParsing | None = None,
        tool_providers: ToolProviders | None = None,
        reasoning: ReasoningParsing | None = None,
    ) -> None:
        self.engine = engine
        self.config = config
        self.model_name: str = engine.model_name
        self.served_names = {self.model_name}
        self.created = int(time.time())
        self.metrics = ServerMetrics(engine.stats, self.model_name)
        self.tool_parsing = tool_parsing or ToolParsing()
        self.tool_providers = tool_providers or ToolProviders()
        self.reasoning = reasoning or ReasoningParsing()
        #: the engine's grammar side (tallow.engine.sampling.StructuredOutputs), None when it
        #: cannot constrain outputs
        self.structured: StructuredOutputs | None = getattr(engine, "structured", None)
        self.max_queue: int = int(_setting(config, "server", "max_queue", 1024))
        self.max_sequences: int = int(_setting(config, "server", "max_sequences_per_request", 256))
        self.inflight = 0
        #: what image_url content parts may hold (server.allowed_image_hosts and the limits)
        self.image_policy: ImagePolicy = policy_from_config(config)
        dtype = _setting(config, "model", "dtype", "auto")
        digest = hashlib.sha256(f"{tallow.__version__}|{self.model_name}|{dtype}".encode())
        self.system_fingerprint = "fp_tallow_" + digest.hexdigest()[:10]

    # -- identity ---------------------------------------------------------------------
    @property
    def tokenizer(self) -> Tokenizer:
        return self.engine.tokenizer

    @property
    def takes_images(self) -> bool:
        """Whether the served model takes images (chat requests may carry image parts)."""
        return getattr(self.engine, "images", None) is not None

    @property
    def max_model_len(self) -> int:
        return int(self.engine.max_model_len)

    @property
    def eos_token_ids(self) -> set[int]:
        return set(getattr(self.tokenizer, "eos_token_ids", ()) or ())

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    @staticmethod
    def new_id(prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex}"

    # -- prompt work, off the event loop when it is big ---------------------------------
    async def run_blocking(self, fn: Callable[..., _T], *args: object, size: int = 1 << 30) -> _T:
        if size < _INLINE_TOKENIZE_CHARS:
            return fn(*args)
        return await anyio.to_thread.run_sync(fn, *args)

    def check_prompt_chars(self, length: int, field: str) -> None:
        """400 ``context_length_exceeded`` for a text that cannot fit ``max_model_len`` tokens
        whatever it holds (longer than ``max_model_len`` × the longest token), before any time
        is spent tokenizing it."""
        per_token = getattr(self.tokenizer, "max_token_chars", None)
        if not isinstance(per_token, int):
            return
        limit = self.max_model_len * per_token
        if length > limit:
            raise invalid(
                field,
                f"Invalid value for {field!r}: the text has {length} "
                f"characters; {self.max_model_len} tokens (max_model_len) of this "
                f"model hold at most {limit} ({per_token} per token), so it cannot "
                "fit the context.",
                code="context_length_exceeded",
            )

    async def encode(
        self, text: str, *, add_special_tokens: bool, field: str = "prompt"
    ) -> list[int]:
        """Token ids of ``text`` (``field`` names it in errors): a text too long for the
        context is refused first (:meth:`check_prompt_chars`); a long one is tokenized in a
        worker thread by a call that releases the GIL, so the event loop keeps serving."""
        self.check_prompt_chars(len(text), field)
        return await self.run_blocking(
            lambda: list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens)),
            size=len(text),
        )

    async def render_chat(
        self,
        messages: list[dict[str, object]],
        tools: list[dict[str, object]] | None,
        add_generation_prompt: bool = True,
        kwargs: Mapping[str, Any] | None = None,
    ) -> str:  # Any: template variables
        """The chat template applied to ``messages`` (a template failure is the client's 400;
        contents too long for the context are refused before rendering)."""
        size = sum(len(str(m.get("content") or "")) for m in messages)
        self.check_prompt_chars(size, "messages")
        if tools:  # tool schemas can be large; rendering them never runs on the event loop
            size += _INLINE_TOKENIZE_CHARS

        limit_s = float(_setting(self.config, "server", "chat_template_timeout_s", 5.0))

        def render() -> str:
            return self.tokenizer.apply_chat_template(
                messages,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                time_limit_s=limit_s,
                **(kwargs or {}),
            )

        try:
            return await self.run_blocking(render, size=size)
        except APIError:
            raise
        except ChatTemplateTimeout:
            raise APIError(
                400,
                f"The chat template of the model {self.model_name!r} did not "
                f"finish rendering these messages within {limit_s:g} s "
                "(server.chat_template_timeout_s) and was stopped; the model's "
                "template (its tokenizer_config chat_template) is at fault.",
                param="messages",
                code="chat_template_timeout",
            ) from None
        except Exception as exc:  # jinja raises for conversations a template refuses
            raise invalid(
                "messages",
                f"The chat template cannot render these messages: {type(exc).__name__}: {exc}.",
                code="chat_template_error",
            ) from None

    # -- the task the engine serves ---------------------------------------------------------
    @property
    def task(self) -> str:
        """``generate`` or ``embed`` (model.task, as resolved when the engine was built)."""
        return getattr(self.engine, "task", "generate")

    def require_generation(self, endpoint: str) -> None:
        """400 for a generation endpoint on a server whose model embeds."""
        if self.task != "generate":
            raise APIError(
                400,
                f"The model {self.model_name!r} is served for embeddings "
                f"(model.task {self.task}); {endpoint} needs a model served for "
                "text generation. Use /v1/embeddings.",
                param="model",
                code="unsupported_task",
            )

    def embedding_info(self, endpoint: str) -> EmbeddingInfo:
        """The served model's :class:`~tallow.engine.embedding.EmbeddingInfo`; 400 when the
        model is served for generation."""
        info: EmbeddingInfo | None = getattr(self.engine, "embedding", None)
        if self.task != "embed" or info is None:
            raise APIError(
                400,
                f"The model {self.model_name!r} is served for text generation "
                f"(model.task {self.task}); {endpoint} needs a server started with "
                "an embedding model (model.task embed).",
                param="model",
                code="unsupported_task",
            )
        return info

    # -- admission ----------------------------------------------------------------------
    def check_fanout(self, prompts: int, n: int) -> None:
        """400 when ``prompts`` × ``n`` sequences exceed ``server.max_sequences_per_request``."""
        if prompts * n > self.max_sequences:
            what = f"{prompts} prompts × n={n}" if prompts > 1 else f"n={n}"
            raise invalid(
                "n" if prompts == 1 else "prompt",
                f"The request asks for {prompts * n} sequences ({what}); this server "
                f"allows at most {self.max_sequences} per request "
                "(server.max_sequences_per_request).",
                code="too_many_sequences",
            )

    def acquire(self) -> None:
        """Take one of the ``server.max_queue`` request slots (503 when none is left)."""
        if self.inflight >= self.max_queue:
            raise APIError(
                503,
                f"The server holds {self.inflight} requests, its limit "
                "(server.max_queue); retry shortly.",
                code="server_overloaded",
                headers={"Retry-After": "1"},
            )
        self.inflight += 1

    def release(self) -> None:
        self.inflight -= 1

    async def release_async(self) -> None:
        self.release()
