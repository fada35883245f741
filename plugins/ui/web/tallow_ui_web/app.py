"""The UI's ASGI app: the files of ``static/`` with strict security headers.

Everything the page needs is in the package; the Content-Security-Policy lets it load its own
files and talk to its own origin only, run no inline script and be framed by nobody, so even a
sanitizer bug could neither run injected script nor send the conversation elsewhere.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Awaitable, Callable

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: the page, its scripts and styles; shipped in the wheel as package data
STATIC = Path(__file__).resolve().parent / "static"

CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        # data: for the thumbnails of images the user attaches (read from a local file); the
        # Markdown renderer never makes an <img>, so no text of the model loads an image
        "img-src 'self' data:",
        "font-src 'self'",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ]
)

#: sent with every response under /ui
SECURITY_HEADERS: dict[str, str] = {
    "content-security-policy": CONTENT_SECURITY_POLICY,
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
    # the files change with the installed version: revalidate instead of serving a stale app
    "cache-control": "no-cache",
}


class SecurityHeaders:
    """Adds :data:`SECURITY_HEADERS` to every HTTP response of the wrapped app (replacing any
    header of the same name)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._raw = [(k.encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
        self._names = {k.encode() for k in SECURITY_HEADERS}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [
                    (k, v) for k, v in message.get("headers", []) if k.lower() not in self._names
                ]
                message = {**message, "headers": kept + self._raw}
            await send(message)

        await self.app(scope, receive, with_headers)


class _Files(StaticFiles):
    """Static files whose errors (404, 405) are answered here, so they carry the headers too
    instead of reaching the server's JSON error handler."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        try:
            return await super().get_response(path, scope)
        except HTTPException as exc:
            return PlainTextResponse(
                str(exc.detail), status_code=exc.status_code, headers=dict(exc.headers or {})
            )


def _ui_on(config: Any) -> bool:
    return bool(getattr(getattr(config, "server", None), "ui", False))


def ui_app(config: Any) -> ASGIApp | None:
    """The app mounted at ``/ui`` (``index.html`` at ``/ui/``), or None when ``server.ui``
    is off."""
    if not _ui_on(config):
        return None
    return SecurityHeaders(_Files(directory=STATIC, html=True))


def root_redirect(config: Any) -> Callable[[Request], Awaitable[Response]] | None:
    """``GET /`` sends the browser to the UI when ``server.ui`` is on; None otherwise."""
    if not _ui_on(config):
        return None

    async def redirect(request: Request) -> Response:
        target = request.scope.get("root_path", "") + "/ui/"
        return RedirectResponse(target, status_code=307, headers=SECURITY_HEADERS)

    return redirect
