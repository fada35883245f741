"""Where in a JSON Schema llguidance's refusal points, and what it would skip silently.

llguidance (1.9) refuses the JSON Schema keywords it does not implement (``not``,
``if``/``then``/``else``, ``oneOf``, ``contains``, ``uniqueItems``, ``propertyNames``,
``dependentRequired``, ``unevaluated*``, dynamic references...), unknown formats and patterns
it cannot parse, as long as its ``lenient`` option stays off; but its message names the
keyword, not where it is. :func:`refusal_path` finds that place by walking the schema's
subschemas in order. :func:`skipped` finds the two constraints llguidance ignores without a
word: ``additionalItems`` and the tuple form of ``items`` (both from drafts before 2020-12).
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Iterator

# Keywords whose value is a schema, a list of schemas or a mapping of names to schemas: the
# refused keywords among them too, since a refused keyword may sit inside one.
_ONE = (
    "additionalProperties",
    "items",
    "propertyNames",
    "contains",
    "not",
    "if",
    "then",
    "else",
    "unevaluatedItems",
    "unevaluatedProperties",
    "additionalItems",
)
_MANY = ("prefixItems", "anyOf", "allOf", "oneOf", "items")
_NAMED = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")

_UNIMPLEMENTED = re.compile(r"Unimplemented keys: (\[[^\]]*\])")
_FORMAT = re.compile(r"Unknown format: (\S+)")
_REGEX = re.compile(r"regex parse error:\s*\n\s{4}(.*)\n")
_RESOURCE = re.compile(r"Resource '([^']*)'")


def _walk(node: Any, path: str = "") -> Iterator[tuple[dict[str, Any], str]]:
    """Every subschema of ``node`` (itself first) with its dotted path, depth first."""
    if not isinstance(node, dict):
        return

    def at(key: str) -> str:
        return f"{path}.{key}" if path else key

    yield node, path
    for key in _ONE:
        if isinstance(node.get(key), dict):
            yield from _walk(node[key], at(key))
    for key in _MANY:
        if isinstance(node.get(key), list):
            for i, item in enumerate(node[key]):
                yield from _walk(item, f"{at(key)}[{i}]")
    for key in _NAMED:
        if isinstance(node.get(key), dict):
            for name, item in node[key].items():
                yield from _walk(item, f"{at(key)}.{name}")


def _first(schema: Any, test: Callable[[dict[str, Any]], str | None]) -> str | None:
    """The path of the first key for which ``test(node)`` names one, or None."""
    for node, path in _walk(schema):
        key = test(node)
        if key is not None:
            return f"{path}.{key}" if path else key
    return None


def refusal_path(schema: Any, message: str) -> str:
    """The dotted path of what llguidance's error ``message`` refuses in ``schema``; ``""``
    when the message names nothing that can be found (the schema as a whole)."""
    tests: list[Callable[[dict[str, Any]], str | None]] = []
    if found := _UNIMPLEMENTED.search(message):
        keys = json.loads(found.group(1))
        tests.append(lambda node: next((k for k in node if k in keys), None))
    if "oneOf" in message:
        tests.append(lambda node: "oneOf" if "oneOf" in node else None)
    if found := _FORMAT.search(message):
        fmt = found.group(1)
        tests.append(lambda node: "format" if node.get("format") == fmt else None)
    if found := _REGEX.search(message):
        pattern = found.group(1)
        tests.append(lambda node: _pattern_key(node, pattern))
    if found := _RESOURCE.search(message):
        ref = found.group(1)
        tests.append(lambda node: "$ref" if node.get("$ref") == ref else None)
    for test in tests:
        path = _first(schema, test)
        if path is not None:
            return path
    return ""


def _pattern_key(node: dict[str, Any], pattern: str) -> str | None:
    if node.get("pattern") == pattern:
        return "pattern"
    if pattern in (node.get("patternProperties") or {}):
        return f"patternProperties.{pattern}"
    return None


def skipped(schema: Any) -> tuple[str, str] | None:
    """(path, problem) of the first constraint llguidance would ignore silently, or None."""

    def test(node: dict[str, Any]) -> str | None:
        if "additionalItems" in node:
            return "additionalItems"
        return "items" if isinstance(node.get("items"), list) else None

    path = _first(schema, test)
    if path is None:
        return None
    if path.endswith("additionalItems"):
        return path, (
            "items after a tuple ('additionalItems') cannot be enforced by "
            "llguidance (use prefixItems and items)"
        )
    return path, "the tuple form of 'items' cannot be enforced by llguidance (use prefixItems)"
