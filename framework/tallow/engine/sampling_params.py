"""``tallow.engine.sampling``: where :class:`SamplingParams` has always been imported
from; it lives in :mod:`tallow.engine.sampling.params`."""

from .sampling.params import GREEDY_TEMPERATURE, MAX_LOGPROBS, InvalidParameter, SamplingParams

__all__ = ["SamplingParams", "InvalidParameter", "MAX_LOGPROBS", "GREEDY_TEMPERATURE"]
