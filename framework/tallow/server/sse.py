"""Server-sent events as OpenAI sends them: ``data: <json>\\n\\n`` … ``data: [DONE]\\n\\n``.

An error after the stream has started cannot change the HTTP status any more; it is sent as an
event ``data: {"error": {...}}`` followed by ``[DONE]`` (the official client raises it).
"""

from __future__ import annotations

import json
from typing import AsyncIterator, Awaitable, Callable

from sse_starlette.sse import EventSourceResponse
from starlette.background import BackgroundTask

from .errors import APIError

DONE = "[DONE]"


def error_event(err: APIError) -> str:
    return json.dumps(err.body(), ensure_ascii=False)


def event_stream(
    chunks: AsyncIterator[str], on_close: Callable[[], Awaitable[None]] | None = None
) -> EventSourceResponse:
    """An SSE response of ``chunks`` (each a ``data`` payload).

    ``on_close`` runs once the stream is over, whether it ended or the client went away (a
    disconnect cancels the iteration of ``chunks``).
    """
    return EventSourceResponse(
        chunks,
        sep="\n",
        ping=15,
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        background=BackgroundTask(on_close) if on_close is not None else None,
    )


class StreamSession:
    """Cleanup of one streamed request, run exactly once however the stream ends."""

    def __init__(self, *closers: Callable[[], Awaitable[object]]) -> None:
        self._closers = list(closers)
        self._closed = False

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for closer in self._closers:
            await closer()
