"""Typing the text of an XML parameter by the tool's JSON Schema.

The model writes every value as text; the schema says what it means. A value that does not read
as any type its schema allows is kept as the string the model wrote, so nothing is lost and
:func:`tallow.plugin.tool_parsing.validate_tool_call` can say what is wrong with it.
"""

from __future__ import annotations

import re
from typing import Any

from tallow.plugin.tool_parsing import loads_strict

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
    if kind == "null":  # the chat template renders a Python None as "None"
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


def convert_value(text: str, schema: Any) -> Any:
    """``text`` read as the first type ``schema`` allows that it parses as; else ``text``.

    The one newline the format puts after ``<parameter=...>`` and before ``</parameter>`` is not
    part of the value. Types are tried in the schema's order, so ``["string", "integer"]`` keeps
    ``"42"`` a string while ``["integer", "string"]`` makes it 42.
    """
    if text.startswith("\n"):
        text = text[1:]
    if text.endswith("\n"):
        text = text[:-1]
    for kind in schema_types(schema):
        ok, value = _read(kind, text)
        if ok:
            return value
    return text
