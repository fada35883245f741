"""What a request asks its output to match, in the engine's terms.

:class:`StructuredOutputsParams` has vLLM's fields (``json``, ``regex``, ``choice``,
``grammar``, ``json_object``), so a Python caller writes
``SamplingParams(structured_outputs=StructuredOutputsParams(json=schema))`` (or a plain mapping
with one of those keys); :class:`~tallow.engine.sampling.params.SamplingParams` keeps the resulting
:class:`tallow.plugin.GrammarSpec`.
"""

from __future__ import annotations

import json as jsonlib
from dataclasses import dataclass, fields
from typing import Any, Mapping

from tallow.plugin import GrammarSpec
from tallow.plugin.json_schema import SchemaProblem, check_schema

from ..errors import InvalidParameter

_FIELD = "structured_outputs"


def _refuse(what: str, message: str) -> InvalidParameter:
    return InvalidParameter(_FIELD, f"{_FIELD}.{what} {message}")


@dataclass
class StructuredOutputsParams:
    """Exactly one of: ``json`` (a JSON Schema, as a mapping or JSON text), ``regex`` (a
    regular expression the whole output matches), ``choice`` (the output is one of these
    strings), ``grammar`` (an EBNF grammar, GBNF notation, with a ``root`` rule),
    ``json_object`` (True: any JSON object)."""

    json: Any = None  # Any: a JSON schema: str, dict or pydantic model class
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None

    def to_spec(self) -> GrammarSpec:
        """The :class:`GrammarSpec` asked for; InvalidParameter naming the field when none or
        several are set or a value is malformed."""
        given = [
            f.name
            for f in fields(self)
            if getattr(self, f.name) is not None and getattr(self, f.name) is not False
        ]
        if len(given) != 1:
            raise InvalidParameter(
                _FIELD,
                f"{_FIELD} must set exactly one of json, regex, "
                f"choice, grammar or json_object, got "
                f"{', '.join(given) or 'none'}",
            )
        if self.json_object is not None:
            if self.json_object is not True:
                raise _refuse("json_object", f"must be true, got {self.json_object!r}")
            return GrammarSpec.json_schema({"type": "object"})
        if self.json is not None:
            return GrammarSpec.json_schema(_schema(self.json))
        if self.regex is not None:
            if not isinstance(self.regex, str) or not self.regex:
                raise _refuse("regex", f"must be a non-empty string, got {self.regex!r}")
            return GrammarSpec("regex", self.regex)
        if self.choice is not None:
            choice = self.choice
            if (
                isinstance(choice, (str, bytes))
                or not isinstance(choice, (list, tuple))
                or not choice
                or not all(isinstance(c, str) and c for c in choice)
            ):
                raise _refuse(
                    "choice", f"must be a non-empty list of non-empty strings, got {choice!r}"
                )
            return GrammarSpec("choice", tuple(choice))
        if not isinstance(self.grammar, str) or not self.grammar.strip():
            raise _refuse("grammar", f"must be a non-empty string, got {self.grammar!r}")
        return GrammarSpec("grammar", self.grammar)


def _schema(value: Any) -> Any:  # Any: a schema as given: str, dict or pydantic model
    if isinstance(value, str):
        try:
            value = jsonlib.loads(value)
        except ValueError as exc:
            raise _refuse("json", f"is not valid JSON ({exc})") from None
    if isinstance(value, bool):
        return value
    try:
        check_schema(value)
    except SchemaProblem as exc:
        raise _refuse("json", f"is not a usable JSON Schema: {exc}") from None
    return value


def structured_spec(
    value: Any,
) -> GrammarSpec | None:  # Any: structured_outputs as a request gives it
    """``SamplingParams.structured_outputs`` as given (None, a GrammarSpec, a
    StructuredOutputsParams or a mapping of its fields) → the spec it asks for."""
    if value is None or isinstance(value, GrammarSpec):
        return value
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - {f.name for f in fields(StructuredOutputsParams)})
        if unknown:
            raise InvalidParameter(
                _FIELD,
                f"{_FIELD} has unknown keys {unknown}; expected one "
                "of json, regex, choice, grammar, json_object",
            )
        value = StructuredOutputsParams(**value)
    if isinstance(value, StructuredOutputsParams):
        return value.to_spec()
    raise InvalidParameter(
        _FIELD,
        f"{_FIELD} must be a StructuredOutputsParams or a mapping, got {type(value).__name__}",
    )
