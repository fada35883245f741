"""The engine: requests, scheduling, paged KV memory, model running, sampling."""

from .errors import AdmissionError, InvalidParameter, QueueFullError

__all__ = ["AdmissionError", "InvalidParameter", "QueueFullError"]
