"""uvicorn's HTTP/1.1 protocol, with OpenAI-shaped bodies for the requests it refuses itself.

A request that is not valid HTTP (an unparsable ``Content-Length``, a malformed request line...)
never reaches the app: uvicorn answers it with a plain-text 400. Clients of an OpenAI API parse
``{"error": {...}}`` from every failure, so the server's protocol sends that body instead.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .errors import APIError

if TYPE_CHECKING:
    import uvicorn
    from starlette.types import ASGIApp


class OpenAIErrorsH11Protocol(H11Protocol):
    """:class:`H11Protocol` whose protocol-level 400 carries an OpenAI error body."""

    def send_400_response(self, msg: str) -> None:
        body = json.dumps(
            APIError(
                400,
                f"The request is not valid HTTP/1.1: {msg.rstrip('.')}.",
                code="invalid_http_request",
            ).body()
        ).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        for event in (
            h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
            h11.Data(data=body),
            h11.EndOfMessage(),
        ):
            self.transport.write(self.conn.send(event))
        self.transport.close()


def uvicorn_config(
    app: ASGIApp, **settings: Any
) -> uvicorn.Config:  # Any: uvicorn.Config's keywords
    """The ``uvicorn.Config`` tallow serves ``app`` with: ``settings`` (host, port, uds, log
    level...) plus the protocol above and a lifespan that runs the engine."""
    import uvicorn

    return uvicorn.Config(app, http=OpenAIErrorsH11Protocol, lifespan="on", **settings)
