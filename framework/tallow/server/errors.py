"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}``.

Every failure the API reports goes through :class:`APIError`. Exceptions raised by the engine are
mapped by class name (so this module imports nothing of the engine): ``InvalidParameter`` and
``AdmissionError`` are the client's fault (400), ``QueueFullError`` means "come back later" (429).
Anything else is a 500 whose body never carries a traceback; the traceback goes to the log.
"""

from __future__ import annotations

import logging

from starlette.responses import JSONResponse

log = logging.getLogger("tallow.server")

#: OpenAI's ``type`` strings, by status.
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
}


class APIError(Exception):
    """A failure reported to the client with ``status`` and an OpenAI error body.

    ``param`` names the request field at fault (``"messages[2].role"``), or None.
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _TYPES.get(
            status, "server_error" if status >= 500 else "invalid_request_error"
        )
        self.headers = headers or {}

    def body(self) -> dict[str, object]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def invalid(param: str | None, message: str, code: str | None = None) -> APIError:
    """A 400 for a bad value of ``param``."""
    return APIError(400, message, param=param, code=code or "invalid_value")


def unsupported(param: str, why: str = "") -> APIError:
    """A 400 for a known OpenAI field that tallow does not implement (never silently dropped)."""
    extra = f": {why}" if why else ""
    return APIError(
        400,
        f"Unsupported parameter: {param!r} is not supported by tallow{extra}.",
        param=param,
        code="unsupported_parameter",
    )


def _class_names(exc: BaseException) -> set[str]:
    return {cls.__name__ for cls in type(exc).__mro__}


def from_exception(exc: BaseException, *, param: str | None = None) -> APIError:
    """Map an exception raised while serving a request to an :class:`APIError`.

    ``param`` is the field to blame when the exception does not name one itself (an
    ``AdmissionError`` blames the prompt).
    """
    if isinstance(exc, APIError):
        return exc
    names = _class_names(exc)
    if "InvalidParameter" in names:
        return APIError(
            400, str(exc), param=getattr(exc, "field", None) or param, code="invalid_value"
        )
    if "AdmissionError" in names:
        return APIError(
            400,
            str(exc),
            param=getattr(exc, "field", None) or param,
            code="context_length_exceeded",
        )
    if "QueueFullError" in names:
        return APIError(
            429,
            f"The server is at capacity: {exc}. Retry shortly.",
            code="queue_full",
            headers={"Retry-After": "1"},
        )
    if "EngineDeadError" in names:
        log.error("the engine has failed", exc_info=exc)
        reason = str(exc) or "the inference engine has failed"
        return APIError(
            503,
            f"{reason[0].upper()}{reason[1:]}; the server must be restarted.",
            code="engine_dead",
        )
    log.error("internal error while serving a request", exc_info=exc)
    return APIError(
        500, "Internal server error; the server log has the details.", code="internal_error"
    )
