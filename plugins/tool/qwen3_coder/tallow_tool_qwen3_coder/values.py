"""Typing the text of a Qwen3-Coder XML parameter by the tool's JSON Schema.

The typing rules are tallow's (:mod:`tallow.plugin.tool_values`); this module adds the
format's own detail: the newline the template puts around each value is not part of it.
"""

from __future__ import annotations

from typing import Any

from tallow.plugin.tool_values import schema_types, typed_value

__all__ = ["convert_value", "schema_types"]


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
    return typed_value(text, schema)
