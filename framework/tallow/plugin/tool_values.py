"""Typing a parameter value that a markup tool-call format writes as text.

XML-like formats (Qwen3-Coder's ``<parameter=...>``, GLM's ``<arg_value>``, MiniMax's
``<parameter name=...>``) write every argument as text between tags; the tool's JSON Schema
says what the text means. A value that does not read as any type its schema allows is kept
as the string the model wrote, so nothing is lost and
:func:`tallow.plugin.tool_parsing.validate_tool_call` can say what is wrong with it.
"""

from __future__ import annotations

import re
from typing import Any

from .json_text import loads_strict

_INTEGER = re.compile(r"-?\d+")


def schema_types(schema: Any) -> list[str]:
    """The JSON types ``schema`` allows, in the order it names them (``anyOf``/``oneOf`` too)."""
    if not isinstance(schema, dict):
        return []
    declared = schema.get("type")
    if isinstance(declared, str):
        return [declared]
    if isinstance(declared, list):
        return [t for t in declared if isinstance(t, str)]
    out: list[str] = []
    for key in ("anyOf", "oneOf"):
        for option in schema.get(key) or []:
            out += [t for t in schema_types(option) if t not in out]
    return out


def _read(kind: str, text: str) -> tuple[bool, Any]:
    stripped = text.strip()
    if kind == "string":
        return True, text
    if kind == "null":  # templates that render a Python None write "None"
        return stripped in ("null", "None"), None
    if kind == "boolean":
        if stripped.lower() in ("true", "false"):
            return True, stripped.lower() == "true"
        return False, None
    if kind == "integer":
        return (True, int(stripped)) if _INTEGER.fullmatch(stripped) else (False, None)
    try:
        value = loads_strict(stripped)
    except ValueError:
        return False, None
    if kind == "number":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif kind == "object":
        ok = isinstance(value, dict)
    elif kind == "array":
        ok = isinstance(value, list)
    else:
        ok = False
    return ok, value


def typed_value(text: str, schema: Any, *, untyped_json: bool = False) -> Any:
    """``text`` read as the first type ``schema`` allows that it parses as; else ``text``.

    Types are tried in the schema's order, so ``["string", "integer"]`` keeps ``"42"`` a
    string while ``["integer", "string"]`` makes it 42. When the schema names no type (no
    tools given, a parameter the schema does not describe, a schema without ``type``):
    with ``untyped_json`` (formats whose templates write every non-string value as JSON) the
    text is read as JSON if it is JSON, else kept; without it the text is kept.
    """
    kinds = schema_types(schema)
    if not kinds:
        if untyped_json:
            try:
                return loads_strict(text.strip())
            except ValueError:
                return text
        return text
    for kind in kinds:
        ok, value = _read(kind, text)
        if ok:
            return value
    return text


def property_schema(parameters: Any, name: str) -> Any:
    """The schema of property ``name`` in a tool's ``parameters`` schema (None if absent)."""
    if not isinstance(parameters, dict):
        return None
    properties = parameters.get("properties")
    return properties.get(name) if isinstance(properties, dict) else None
