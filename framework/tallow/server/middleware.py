"""ASGI middleware of the server: response counting, API keys, and the request-body limit.

They are plain ASGI (not Starlette's ``BaseHTTPMiddleware``) so that streamed responses pass
through untouched and a client disconnect reaches the endpoint at once.
"""

from __future__ import annotations

import hmac
import json
from typing import Callable, Iterable

from prometheus_client import Counter

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import APIError


async def _send_error(send: Send, err: APIError) -> None:
    body = json.dumps(err.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in err.headers.items()]
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


#: the HTTP methods counted under their own name; any other method counts as ``"other"``
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class StatusCounter:
    """Counts every HTTP response by endpoint (the route's path template), method and status.

    ``endpoint_of(scope)`` names the endpoint; unknown paths count as ``"other"``, and so do
    methods outside :data:`KNOWN_METHODS`, so a scan of random URLs or made-up methods cannot
    blow up the label set (the labels any client can reach are finite).
    """

    def __init__(self, app: ASGIApp, counter: Counter, endpoint_of: Callable[[Scope], str]) -> None:
        self.app = app
        self.counter = counter
        self.endpoint_of = endpoint_of

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        endpoint = self.endpoint_of(scope)
        method = scope.get("method", "GET")
        if method not in KNOWN_METHODS:
            method = "other"

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.counter.labels(endpoint, method, str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counting_send)


class APIKeyAuth:
    """Refuses requests to protected paths without ``Authorization: Bearer <one of keys>``.

    With no keys configured every request passes. ``public`` paths (health, version, metrics)
    never need a key.
    """

    def __init__(
        self,
        app: ASGIApp,
        keys: Iterable[str],
        protected_prefixes: tuple[str, ...],
    ) -> None:
        self.app = app
        self.keys = [k.encode() for k in keys]
        self.protected = protected_prefixes

    def _allowed(self, scope: Scope) -> bool:
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                if scheme.lower() != b"bearer":
                    return False
                token = token.strip()
                # compare_digest against every key, so timing says nothing about which matched
                return any([hmac.compare_digest(token, key) for key in self.keys])
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and self.keys
            and scope.get("path", "").startswith(self.protected)
            and scope.get("method") != "OPTIONS"
            and not self._allowed(scope)
        ):
            await _send_error(
                send,
                APIError(
                    401,
                    "Incorrect or missing API key: send 'Authorization: Bearer <key>'.",
                    code="invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"},
                ),
            )
            return
        await self.app(scope, receive, send)


class BodyLimit:
    """Answers 413 for a request body over ``max_bytes``.

    A declared ``Content-Length`` over the limit is refused before anything is read; a chunked
    body is counted as it arrives and reading it raises the 413 :class:`APIError`, which the
    endpoint turns into its response.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _too_large(self) -> APIError:
        return APIError(
            413,
            f"The request body exceeds the limit of {self.max_bytes} bytes "
            "(server.max_body_bytes).",
            code="request_too_large",
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await _send_error(
                        send, APIError(400, "Invalid Content-Length header.", code="invalid_header")
                    )
                    return
                if declared > self.max_bytes:
                    await _send_error(send, self._too_large())
                    return
        seen = 0

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise self._too_large()
            return message

        await self.app(scope, limited_receive, send)
