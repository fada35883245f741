"""The life of one engine request inside an HTTP request: admission, first output, the client.

Client disconnects are watched for the whole time: while waiting for the first output, while
collecting a whole response, and (through sse-starlette) while streaming. A client that goes
away cancels the consuming task, which closes the engine's stream; the engine then aborts the
request and frees its KV blocks at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import AsyncIterator, Awaitable, Callable, Protocol, TypeVar, runtime_checkable

import anyio
from starlette.requests import Request
from starlette.responses import Response

from .errors import APIError, from_exception
from .metrics import RequestTimer
from .sse import DONE, StreamSession, error_event, event_stream
from .state import ServerState


async def wait_for_disconnect(request: Request) -> None:
    """Returns when the client has gone away (the request body must have been read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


_T = TypeVar("_T")


@runtime_checkable
class _Closable(Protocol):
    """An engine stream: an async generator, whose ``aclose`` aborts an unfinished request."""

    async def aclose(self) -> None: ...


class ClientGone(Exception):
    """The client disconnected before the response was ready."""


async def unless_disconnected(request: Request, awaitable: Awaitable[_T]) -> _T:
    """Await ``awaitable``; if the client disconnects first, cancel it and raise ClientGone."""
    task = asyncio.ensure_future(awaitable)
    watcher = asyncio.ensure_future(wait_for_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        watcher.cancel()
        raise
    if task in done:
        watcher.cancel()
        return task.result()
    task.cancel()
    with contextlib.suppress(BaseException):
        await task
    raise ClientGone()


async def first_output(gen: AsyncIterator[_T], param: str) -> _T:
    """The first output of an engine request; engine refusals become :class:`APIError`."""
    try:
        return await gen.__anext__()
    except StopAsyncIteration:
        raise APIError(
            500, "The engine ended the request without output.", code="internal_error"
        ) from None
    except Exception as exc:
        raise from_exception(exc, param=param) from None


async def aclose_quietly(gen: AsyncIterator[object]) -> None:
    """Close an engine stream (aborting its request if unfinished), shielded from cancellation.
    A stream without ``aclose`` has nothing to close."""
    with anyio.CancelScope(shield=True):
        with contextlib.suppress(Exception):
            if isinstance(gen, _Closable):
                await gen.aclose()


async def _guarded(chunks: AsyncIterator[str], session: StreamSession) -> AsyncIterator[str]:
    """End a stream the OpenAI way whatever happens: an error raised after the headers went out
    becomes an error event, ``[DONE]`` closes it, and the request's cleanup runs."""
    try:
        async for chunk in chunks:
            yield chunk
    except Exception as exc:
        yield error_event(exc if isinstance(exc, APIError) else from_exception(exc))
        yield DONE
    finally:
        await session.close()


async def run_generation(
    state: ServerState,
    request: Request,
    start: Callable[[], AsyncIterator[_T]],
    param: str,
    stream: bool,
    respond: Callable[[Request, AsyncIterator[_T], _T], Awaitable[Response]],
    chunks: Callable[[AsyncIterator[_T], _T, StreamSession], AsyncIterator[str]],
    timer: RequestTimer,
    sequences: int,
) -> Response:
    """Admit one engine request and answer it whole (``respond``) or as a stream (``chunks``).

    The request holds a ``server.max_queue`` slot until it ends; a client that goes away
    aborts it (its KV blocks are freed at once) and its ``sequences`` count as finished with
    reason ``abort`` in ``timer``'s metrics.
    """
    state.acquire()
    gen = None
    handed_over = False
    try:
        gen = start()
        engine_stream = gen

        async def closed() -> None:
            await aclose_quietly(engine_stream)
            timer.cancel(sequences)  # a no-op when the stream ended normally

        first = await unless_disconnected(request, first_output(engine_stream, param))
        if not stream:
            return await respond(request, gen, first)
        session = StreamSession(closed, state.release_async)
        handed_over = True
        return event_stream(_guarded(chunks(gen, first, session), session), session.close)
    except ClientGone:
        timer.cancel(sequences)
        return Response(status_code=499)
    finally:
        if not handed_over:
            state.release()
            if gen is not None:
                await aclose_quietly(gen)
