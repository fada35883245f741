"""Structured outputs in the API: the request fields that constrain an output, read into one
:class:`tallow.plugin.GrammarSpec` and compiled before the request reaches the engine.

A request may ask in one of these ways (OpenAI's, then vLLM's):

- ``response_format``: ``{"type": "json_object"}`` (any JSON object) or ``{"type":
  "json_schema", "json_schema": {"name", "schema", "strict", "description"}}``;
- ``guided_json``, ``guided_regex``, ``guided_choice``, ``guided_grammar``;
- ``structured_outputs``: ``{"json" | "regex" | "choice" | "grammar" | "json_object": ...}``.

Asking in two ways at once is a 400. Compiling runs in a worker thread (a large schema takes a
moment; the engine then finds it in its cache); a spec the grammar backend cannot enforce is a
400 naming the request field and the part of the spec, e.g.
``response_format.json_schema.schema.properties.tags.uniqueItems``; a server without a grammar
backend answers 400 saying which plugin provides one.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Union

import anyio

from tallow.engine.sampling.grammar_worker import GrammarBudgetError
from tallow.plugin import GrammarError, GrammarSpec
from tallow.plugin.json_schema import SchemaProblem, check_schema

from .errors import APIError, invalid
from .protocol import SamplingFields

if TYPE_CHECKING:
    from tallow.engine.sampling.grammar import StructuredOutputs

    from .state import ServerState

#: a JSON Schema as the request gave it, once parsed: an object, or a boolean schema
Schema = Union[Mapping[str, object], bool]

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_GUIDED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs")
_KEYS = ("json", "regex", "choice", "grammar", "json_object")


@dataclass(frozen=True)
class Constraint:
    """What a request's output must match, and the request field that asked for it (errors
    about the spec name it, with the path inside the spec appended)."""

    spec: GrammarSpec
    field: str


def _schema(value: object, field: str) -> Schema:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise invalid(field, f"Invalid value for {field!r}: not valid JSON ({exc}).") from None
    if isinstance(value, bool):
        return value
    try:
        check_schema(value)
    except SchemaProblem as exc:
        raise invalid(field, f"Invalid value for {field!r}: {exc}.") from None
    assert isinstance(value, dict)  # check_schema refuses anything but an object
    return value


def _string(value: object, field: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise invalid(field, f"Invalid value for {field!r}: expected a non-empty string.")
    return value


def _choices(value: object, field: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
        raise invalid(
            field, f"Invalid value for {field!r}: expected a non-empty list of non-empty strings."
        )
    return tuple(value)


def _from_response_format(fmt: Mapping[str, object]) -> Constraint | None:
    kind = fmt.get("type")
    if kind not in ("text", "json_object", "json_schema"):
        raise invalid(
            "response_format.type",
            "Invalid value for 'response_format.type': "
            f"expected 'text', 'json_object' or 'json_schema', got {kind!r}.",
        )
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint(GrammarSpec.json_schema({"type": "object"}), "response_format")
    body = fmt.get("json_schema")
    where = "response_format.json_schema"
    if not isinstance(body, dict):
        raise invalid(
            where, f"Missing required parameter: {where!r}.", code="missing_required_parameter"
        )
    name = body.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise invalid(
            f"{where}.name",
            f"Invalid value for '{where}.name': expected 1-64 "
            f"characters of a-z, A-Z, 0-9, '_' or '-', got {name!r}.",
        )
    if body.get("strict") is not None and not isinstance(body["strict"], bool):
        raise invalid(f"{where}.strict", f"Invalid value for '{where}.strict': expected a boolean.")
    if "schema" not in body:  # OpenAI makes it optional: then any JSON object
        return Constraint(GrammarSpec.json_schema({"type": "object"}), where)
    field = f"{where}.schema"
    return Constraint(GrammarSpec.json_schema(_schema(body["schema"], field)), field)


def _from_structured_outputs(value: object) -> Constraint:
    field = "structured_outputs"
    if not isinstance(value, dict):
        raise invalid(
            field,
            f"Invalid value for {field!r}: expected an object with one of {', '.join(_KEYS)}.",
        )
    given = [k for k in value if value[k] is not None and value[k] is not False]
    unknown = [k for k in given if k not in _KEYS]
    if unknown or len(given) != 1:
        raise invalid(
            field,
            f"Invalid value for {field!r}: expected exactly one of "
            f"{', '.join(_KEYS)}, got {', '.join(given) or 'none'}.",
        )
    key = given[0]
    return _guided(key, value[key], f"{field}.{key}")


def _guided(key: str, value: object, field: str) -> Constraint:
    if key == "json":
        return Constraint(GrammarSpec.json_schema(_schema(value, field)), field)
    if key == "json_object":
        if value is not True:
            raise invalid(field, f"Invalid value for {field!r}: expected true.")
        return Constraint(GrammarSpec.json_schema({"type": "object"}), field)
    if key == "choice":
        return Constraint(GrammarSpec("choice", _choices(value, field)), field)
    return Constraint(GrammarSpec(key, _string(value, field)), field)


def requested_constraint(req: SamplingFields) -> Constraint | None:
    """The output constraint a chat or completions request asks for (400 for a malformed
    one, or for more than one way of asking)."""
    found: list[Constraint] = []
    fmt: Mapping[str, object] | None = getattr(req, "response_format", None)
    if fmt is not None:
        constraint = _from_response_format(fmt)
        if constraint is not None:
            found.append(constraint)
    for name in _GUIDED:
        value = getattr(req, name, None)
        if value is None:
            continue
        if name == "structured_outputs":
            found.append(_from_structured_outputs(value))
        else:
            found.append(_guided(name[len("guided_") :], value, name))
    if len(found) > 1:
        fields = ", ".join(c.field.split(".")[0] for c in found)
        raise invalid(
            found[1].field.split(".")[0],
            f"Only one way of constraining the output may be given; this request uses {fields}.",
        )
    return found[0] if found else None


def _structured(state: ServerState, field: str) -> StructuredOutputs:
    structured: StructuredOutputs | None = getattr(state, "structured", None)
    if structured is None:
        raise invalid(
            field,
            f"Invalid value for {field!r}: this server's engine cannot constrain outputs.",
            code="structured_outputs_unavailable",
        )
    if not structured.available:
        raise invalid(
            field,
            f"Structured outputs are not available: {structured.unavailable}.",
            code="grammar_backend_unavailable",
        )
    return structured


def _refusal(exc: GrammarError, field: str) -> APIError:
    param = f"{field}.{exc.path}" if exc.path else field
    code = "grammar_too_large" if isinstance(exc, GrammarBudgetError) else "unsupported_schema"
    return invalid(param, f"Invalid value for {param!r}: {exc.problem}.", code=code)


async def compile_constraint(state: ServerState, constraint: Constraint) -> None:
    """Compile ``constraint`` with the engine's grammar backend, in a worker thread."""
    structured = _structured(state, constraint.field)
    try:
        await anyio.to_thread.run_sync(structured.compile, constraint.spec)
    except GrammarError as exc:
        raise _refusal(exc, constraint.field) from None


async def compile_tool_parameters(
    state: ServerState, tools: list[dict[str, Any]], call: Constraint
) -> None:
    """Compile a forced call's grammar (:func:`tallow.server.tools.call_schema`): each
    tool's ``parameters`` first, so that a part the backend cannot enforce is named where the
    client wrote it (``tools[2].function.parameters.properties.x.not``)."""
    structured = _structured(state, "tool_choice")

    def compile_all() -> None:
        for i, tool in enumerate(tools):
            params = tool["function"].get("parameters") or {"type": "object"}
            try:
                structured.compile(GrammarSpec.json_schema(params))
            except GrammarError as exc:
                raise _refusal(exc, f"tools[{i}].function.parameters") from None
        try:
            structured.compile(call.spec)
        except GrammarError as exc:
            raise _refusal(exc, call.field) from None

    await anyio.to_thread.run_sync(compile_all)
