"""How a request wants its tokens chosen and when it wants them to stop.

Names and meanings follow vLLM's ``SamplingParams`` (and through it the OpenAI API), so a
client's request maps field by field. Every value is checked when the object is built: a bad
one raises :class:`InvalidParameter` naming the field and what was expected.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from dataclasses import dataclass, field
from typing import Any

from tallow.plugin import GrammarSpec

from ..errors import InvalidParameter
from .structured import structured_spec

__all__ = ["SamplingParams", "InvalidParameter", "MAX_LOGPROBS", "GREEDY_TEMPERATURE"]

#: The most top-k alternatives a request may ask for, per position (OpenAI's top_logprobs cap).
MAX_LOGPROBS = 20
#: Temperatures below this are treated as 0: the most likely token is taken.
GREEDY_TEMPERATURE = 1e-5
#: Seeds travel as int64 on the device.
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
#: OpenAI's bounds on logit_bias values and on the two additive penalties.
_LOGIT_BIAS_LIMIT = 100.0
_PENALTY_LIMIT = 2.0


def _is_int(value: Any) -> bool:  # Any: a request's raw value, checked here
    # bool is an int in Python; a JSON `true` where a count belongs is a client bug.
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:  # Any: a request's raw value, checked here
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _int(
    name: str,
    value: Any,
    *,
    minimum: int | None = None,
    maximum: int | None = None,  # Any: a request's raw value, checked here
    expected: str | None = None,
) -> int:
    if not _is_int(value):
        raise InvalidParameter(name, f"{name} must be an integer, got {value!r}")
    number = int(value)
    if (minimum is not None and number < minimum) or (maximum is not None and number > maximum):
        if expected is None:
            if minimum is not None and maximum is not None:
                expected = f"between {minimum} and {maximum}"
            elif minimum is not None:
                expected = f">= {minimum}"
            else:
                expected = f"<= {maximum}"
        raise InvalidParameter(name, f"{name} must be {expected}, got {number}")
    return number


def _float(name: str, value: Any) -> float:  # Any: a request's raw value, checked here
    if not _is_real(value):
        raise InvalidParameter(name, f"{name} must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise InvalidParameter(name, f"{name} must be a finite number, got {number}")
    return number


def _bool(name: str, value: Any) -> bool:  # Any: a request's raw value, checked here
    if not isinstance(value, bool):
        raise InvalidParameter(name, f"{name} must be true or false, got {value!r}")
    return value


def _optional_int(
    name: str, value: Any, **bounds: Any
) -> int | None:  # Any: a raw value, and _int's bounds
    return None if value is None else _int(name, value, **bounds)


@dataclass
class SamplingParams:
    """Sampling and stopping settings of one request (all ``n`` completions share them).

    ``top_k`` 0 or -1 turns top-k off; ``max_tokens`` None means "until the context is full"
    (the engine fills in the limit). ``stop`` may be given as one string. ``logprobs`` /
    ``prompt_logprobs`` are the number of top alternatives to report per position (0 = only the
    chosen token), None = not reported. ``structured_outputs`` constrains the output to a
    JSON Schema, regular expression, choice list or grammar (a
    :class:`~tallow.engine.sampling.structured.StructuredOutputsParams`, a mapping of its
    fields, or a :class:`tallow.plugin.GrammarSpec`; kept as the spec). Construction validates
    and normalizes every field; assigning a field afterwards is not re-validated (use
    :meth:`clone` with changes instead).
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    spaces_between_special_tokens: bool = True
    structured_outputs: GrammarSpec | None = None

    def __post_init__(self) -> None:
        self.n = _int("n", self.n, minimum=1)
        self.temperature = _float("temperature", self.temperature)
        if self.temperature < 0:
            raise InvalidParameter(
                "temperature", f"temperature must be >= 0, got {self.temperature:g}"
            )
        self.top_p = _float("top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidParameter("top_p", f"top_p must be in (0, 1], got {self.top_p:g}")
        self.top_k = _int(
            "top_k", self.top_k, minimum=-1, expected="-1 or 0 (off) or a positive integer"
        )
        self.min_p = _float("min_p", self.min_p)
        if not 0.0 <= self.min_p <= 1.0:
            raise InvalidParameter("min_p", f"min_p must be in [0, 1], got {self.min_p:g}")
        self.repetition_penalty = _float("repetition_penalty", self.repetition_penalty)
        if self.repetition_penalty <= 0:
            raise InvalidParameter(
                "repetition_penalty",
                f"repetition_penalty must be > 0, got {self.repetition_penalty:g}",
            )
        for name in ("frequency_penalty", "presence_penalty"):
            value = _float(name, getattr(self, name))
            if not -_PENALTY_LIMIT <= value <= _PENALTY_LIMIT:
                raise InvalidParameter(name, f"{name} must be in [-2, 2], got {value:g}")
            setattr(self, name, value)
        self.logit_bias = self._check_logit_bias(self.logit_bias)
        self.seed = _optional_int(
            "seed",
            self.seed,
            minimum=_INT64_MIN,
            maximum=_INT64_MAX,
            expected="a 64-bit signed integer",
        )
        self.max_tokens = _optional_int("max_tokens", self.max_tokens, minimum=1)
        self.min_tokens = _int("min_tokens", self.min_tokens, minimum=0)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise InvalidParameter(
                "min_tokens",
                f"min_tokens must be <= max_tokens ({self.max_tokens}), got {self.min_tokens}",
            )
        self.stop = self._check_stop(self.stop)
        self.stop_token_ids = self._check_token_list("stop_token_ids", self.stop_token_ids)
        for name in (
            "ignore_eos",
            "skip_special_tokens",
            "include_stop_str_in_output",
            "spaces_between_special_tokens",
        ):
            setattr(self, name, _bool(name, getattr(self, name)))
        for name in ("logprobs", "prompt_logprobs"):
            setattr(
                self,
                name,
                _optional_int(name, getattr(self, name), minimum=0, maximum=MAX_LOGPROBS),
            )
        self.structured_outputs = structured_spec(self.structured_outputs)
        if self.structured_outputs is not None and self.min_tokens:
            raise InvalidParameter(
                "min_tokens",
                "min_tokens cannot be combined with "
                "structured_outputs: the grammar decides where the output "
                f"may end (got min_tokens={self.min_tokens})",
            )

    # -- field checks ------------------------------------------------------------------
    @staticmethod
    def _check_logit_bias(
        bias: Any,
    ) -> dict[int, float] | None:  # Any: a request's raw logit_bias, checked here
        if bias is None:
            return None
        if not isinstance(bias, dict):
            raise InvalidParameter(
                "logit_bias",
                f"logit_bias must be a mapping of token id to bias, got {type(bias).__name__}",
            )
        out: dict[int, float] = {}
        for key, value in bias.items():
            # JSON object keys are strings: {"50256": -100} is how clients send it.
            token = key
            if isinstance(key, str):
                try:
                    token = int(key.strip())
                except ValueError:
                    token = key
            if not _is_int(token) or int(token) < 0:
                raise InvalidParameter(
                    "logit_bias", f"logit_bias keys must be token ids (integers >= 0), got {key!r}"
                )
            if not _is_real(value) or not math.isfinite(float(value)):
                raise InvalidParameter(
                    "logit_bias", f"logit_bias[{key!r}] must be a number, got {value!r}"
                )
            if not -_LOGIT_BIAS_LIMIT <= float(value) <= _LOGIT_BIAS_LIMIT:
                raise InvalidParameter(
                    "logit_bias",
                    f"logit_bias[{key!r}] must be in [-100, 100], got {float(value):g}",
                )
            out[int(token)] = float(value)
        return out

    @staticmethod
    def _check_stop(stop: Any) -> list[str]:  # Any: a request's raw stop, checked here
        if stop is None:
            return []
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, (list, tuple)):
            raise InvalidParameter(
                "stop", f"stop must be a string or a list of strings, got {type(stop).__name__}"
            )
        for s in stop:
            if not isinstance(s, str):
                raise InvalidParameter("stop", f"stop must contain only strings, got {s!r}")
            if not s:
                raise InvalidParameter("stop", "stop strings must not be empty")
        return list(stop)

    @staticmethod
    def _check_token_list(
        name: str, ids: Any
    ) -> list[int]:  # Any: a request's raw id list, checked here
        if ids is None:
            return []
        if isinstance(ids, (str, bytes)) or not isinstance(ids, (list, tuple, set, frozenset)):
            raise InvalidParameter(
                name, f"{name} must be a list of token ids, got {type(ids).__name__}"
            )
        return [_int(name, t, minimum=0, expected="a token id (>= 0)") for t in ids]

    def validate_vocab(self, vocab_size: int) -> None:
        """Check the token ids this request names (logit_bias keys, stop_token_ids) against the
        model's vocabulary; raise :class:`InvalidParameter` for one out of range."""
        for name, ids in (
            ("logit_bias", self.logit_bias or {}),
            ("stop_token_ids", self.stop_token_ids),
        ):
            for token in ids:
                if token >= vocab_size:
                    raise InvalidParameter(
                        name,
                        f"{name} names token id {token}, but the "
                        f"vocabulary has {vocab_size} tokens (0.."
                        f"{vocab_size - 1})",
                    )

    # -- derived -----------------------------------------------------------------------
    @property
    def greedy(self) -> bool:
        """True when every completion takes the most likely token (no randomness at all)."""
        return self.temperature < GREEDY_TEMPERATURE or self.top_k == 1

    # The engine asks these of every sampled row on every step; they are worked out once per
    # params object (the engine gives each request a private copy it never changes).
    @functools.cached_property
    def reads_token_values(self) -> bool:
        """Sampling reads the values of earlier tokens (penalties), or returns logprobs."""
        return (
            self.repetition_penalty != 1.0
            or self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
            or self.logprobs is not None
        )

    @functools.cached_property
    def argmax_only(self) -> bool:
        """Greedy with no logit edits and no logprobs: the token is the argmax of the logits
        (once ``min_tokens`` is reached)."""
        return (
            self.greedy
            and self.logprobs is None
            and not self.logit_bias
            and self.repetition_penalty == 1.0
            and self.frequency_penalty == 0.0
            and self.presence_penalty == 0.0
        )

    def clone(
        self, **changes: Any
    ) -> "SamplingParams":  # Any: any field's value, validated by the constructor
        """A validated deep copy, with ``changes`` applied (lists and dicts are not shared)."""
        return dataclasses.replace(self, **changes)
