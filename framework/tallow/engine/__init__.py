"""The engine: requests, scheduling, paged KV memory, model running, sampling."""

from .errors import AdmissionError, InvalidParameter, QueueFullError
from .sampling import SamplingParams

__all__ = ["SamplingParams", "AdmissionError", "InvalidParameter", "QueueFullError"]
