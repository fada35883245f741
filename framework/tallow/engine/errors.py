"""Errors the engine raises at a request's door, before any work is done for it.

The server maps them by class name: :class:`InvalidParameter` and :class:`AdmissionError` are
the client's fault (HTTP 400), :class:`QueueFullError` means "come back later" (429/503).
"""

from __future__ import annotations


class InvalidParameter(ValueError):
    """A sampling parameter is out of range or of the wrong type.

    ``field`` names the parameter (``"temperature"``, ``"stop_token_ids"``, ...); the message
    names it too and says what was expected, e.g. ``"temperature must be >= 0, got -1"``.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class AdmissionError(ValueError):
    """A request that can never be served: a prompt longer than the context or the KV cache,
    an empty prompt, a duplicate request id, more completions than the scheduler runs at once."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class QueueFullError(RuntimeError):
    """The waiting queue holds ``max_waiting`` requests already; retry later."""


class EngineDeadError(RuntimeError):
    """The engine loop has failed; no request can be served until the process restarts."""
