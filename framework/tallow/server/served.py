"""What the server uses of the engine it serves: :class:`ServedEngine`, and the stream of one
request's outputs (:data:`EngineStream`)."""

from __future__ import annotations

from typing import Any, AsyncIterator, Protocol, Sequence

from tallow.engine.embedding import PoolingParams
from tallow.engine.outputs import EmbeddingOutput, RequestOutput
from tallow.engine.sampling.params import SamplingParams
from tallow.engine.tokenizer import Tokenizer

#: one request's outputs as the engine streams them (an async generator: closing it aborts an
#: unfinished request)
EngineStream = AsyncIterator[RequestOutput]


class ServedEngine(Protocol):
    """What the server uses of its engine: an :class:`~tallow.engine.async_engine.AsyncEngine`,
        or a stand-in with the same surface. Optional parts (``structured``, ``task``,
        ``embedding``, ``error``, ``plugin_manager``, ``images``: the prompt expander of a model that
    takes images) are read with ``getattr``; ``generate`` is given ``images`` only when a request
    has some."""

    @property
    def model_name(self) -> str: ...

    @property
    def tokenizer(self) -> Tokenizer: ...

    @property
    def max_model_len(self) -> int: ...

    def stats(self) -> dict[str, float]: ...

    def generate(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        request_id: str,
        *,
        prompt: str | None = None,
        priority: int = 0,
        images: Sequence[Any] | None = None,
    ) -> EngineStream: ...

    async def embed(
        self, prompt_token_ids: list[int], params: PoolingParams, request_id: str
    ) -> EmbeddingOutput: ...

    async def start(self) -> None: ...

    async def shutdown(self) -> None: ...
