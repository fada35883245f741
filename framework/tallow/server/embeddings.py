"""``POST /v1/embeddings``: one vector per input, from a server whose model embeds.

``input`` is a string, a list of strings, a list of token ids or a list of such lists (at most
``server.max_sequences_per_request`` inputs); every input becomes one engine request, and all
of them run in the engine at once (many per step). ``encoding_format: base64`` sends each
vector as the base64 of its little-endian float32 bytes, as OpenAI does. ``dimensions``,
too-long inputs and ``truncate_prompt_tokens`` follow :mod:`tallow.engine.embedding`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tallow.engine.embedding import (
    InputTooLong,
    PoolingParams,
    input_token_ids,
    truncation_length,
)
from tallow.engine.outputs import EmbeddingOutput

from .errors import APIError, from_exception, invalid
from .generation import ClientGone, unless_disconnected
from .protocol import EmbeddingRequest, check_model, parse_request
from .state import ServerState


def _items(
    raw: str | list[str] | list[int] | list[list[int]],
) -> tuple[list[str | list[int]], bool]:
    """The inputs of ``input``, and whether it was a single one (a string or token ids)."""
    if isinstance(raw, str):
        return [raw], True
    if raw and all(isinstance(x, int) for x in raw):
        return [list(raw)], True  # type: ignore[arg-type]  # every item is an int
    return list(raw), False  # type: ignore[arg-type]  # a list of strings or of token lists


def encode_vector(vector: list[float], encoding_format: str | None) -> list[float] | str:
    """A vector as JSON numbers, or as the base64 of its little-endian float32 bytes."""
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return vector


class EmbeddingsCall:
    """One embeddings request, from its parsed body to the response."""

    def __init__(self, state: ServerState, req: EmbeddingRequest) -> None:
        self.state = state
        self.req = req
        self.id = state.new_id("embd")
        self.info = state.embedding_info("/v1/embeddings")
        problem = self.info.dimensions_problem(req.dimensions)
        if problem:
            raise invalid(
                "dimensions",
                f"Invalid value for 'dimensions': {problem}.",
                code="unsupported_dimensions",
            )

    async def prompts(self) -> list[list[int]]:
        """The token ids of every input; a 400 naming the input at fault."""
        items, single = _items(self.req.input)
        if not items:
            raise invalid("input", "Invalid value for 'input': expected at least one input.")
        state = self.state
        if len(items) > state.max_sequences:
            raise invalid(
                "input",
                f"The request has {len(items)} inputs; this server embeds at "
                f"most {state.max_sequences} per request "
                "(server.max_sequences_per_request).",
                code="too_many_inputs",
            )
        limit = state.max_model_len
        try:
            truncate_to = truncation_length(self.req.truncate_prompt_tokens, limit)
        except ValueError as exc:
            raise invalid(
                "truncate_prompt_tokens", f"Invalid value for 'truncate_prompt_tokens': {exc}."
            ) from None
        vocab = getattr(state.tokenizer, "vocab_size", None)
        prompts = []
        for i, item in enumerate(items):
            where = "input" if single else f"input[{i}]"
            if not item:
                what = "an empty string" if isinstance(item, str) else "an empty list of tokens"
                raise invalid(
                    where, f"Invalid value for {where!r}: {what}; expected at least one token."
                )
            if not isinstance(item, str) and vocab and any(t < 0 or t >= vocab for t in item):
                raise invalid(
                    where, f"Invalid value for {where!r}: token ids must be in 0..{vocab - 1}."
                )
            if isinstance(item, str) and truncate_to is None:
                state.check_prompt_chars(len(item), where)
            try:
                prompts.append(
                    await state.run_blocking(
                        input_token_ids,
                        state.tokenizer,
                        self.info,
                        item,
                        limit,
                        truncate_to,
                        size=len(item) if isinstance(item, str) else 0,
                    )
                )
            except InputTooLong as exc:
                raise invalid(
                    where, f"Invalid value for {where!r}: {exc}.", code="context_length_exceeded"
                ) from None
            except ValueError as exc:  # the tokenizer cannot cut the input that short
                raise invalid(
                    "truncate_prompt_tokens", f"Invalid value for 'truncate_prompt_tokens': {exc}."
                ) from None
        return prompts

    async def run(self, prompts: list[list[int]]) -> list[EmbeddingOutput]:
        """The embeddings of ``prompts``, all in the engine at once; leaving early (a failure,
        a client gone) aborts those still running."""
        params = PoolingParams(self.req.dimensions)
        tasks = [
            asyncio.ensure_future(self.state.engine.embed(ids, params, f"{self.id}-{i}"))
            for i, ids in enumerate(prompts)
        ]
        try:
            return list(await asyncio.gather(*tasks))
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(BaseException):
                    await task

    def response(self, outputs: list[EmbeddingOutput]) -> Response:
        tokens = sum(len(o.prompt_token_ids) for o in outputs)
        data = [
            {
                "object": "embedding",
                "index": i,
                "embedding": encode_vector(o.embedding, self.req.encoding_format),
            }
            for i, o in enumerate(outputs)
        ]
        return JSONResponse(
            {
                "object": "list",
                "data": data,
                "model": self.state.model_name,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )


async def create_embedding(
    state: ServerState, request: Request, body: dict[str, object]
) -> Response:
    req = parse_request(EmbeddingRequest, body)
    check_model(req.model, state.served_names)
    call = EmbeddingsCall(state, req)
    prompts = await call.prompts()
    timer = state.metrics.timer()
    state.acquire()
    try:
        outputs = await unless_disconnected(request, call.run(prompts))
    except ClientGone:
        timer.cancel(len(prompts))
        return Response(status_code=499)
    except APIError:
        raise
    except Exception as exc:
        raise from_exception(exc, param="input") from None
    finally:
        state.release()
    timer.finish(["stop"] * len(outputs))
    return call.response(outputs)
