"""Which parts of a JSON Schema xgrammar enforces, checked before compiling.

xgrammar's converter skips what it cannot express with at most a log line, so a grammar
compiled from such a schema would let through outputs that the schema rejects. What it skips
(measured on xgrammar 0.2.9, see ``tests/test_xgrammar.py``):

- keywords it has no rule for: ``not``, ``if``/``then``/``else``, ``oneOf`` (it falls back to
  ``anyOf``), ``contains``, ``uniqueItems``, ``dependentRequired`` and friends,
  ``unevaluated*``, dynamic references, more than one ``allOf`` schema, the tuple form of
  ``items`` and ``additionalItems``; formats outside :data:`FORMATS`; in a pattern, lookaround,
  backreferences, inline flags and word boundaries;
- type-specific keywords (``minimum``, ``maxLength``, ``maxItems``, ``required``...) in a
  schema that does not say its ``type`` (object keywords are kept when ``properties`` is
  there, from which it infers an object);
- every other keyword beside ``enum``, ``const``, ``anyOf``, ``allOf`` or ``$ref`` (and a
  ``type`` that some ``enum`` value does not have);
- ``minLength``/``maxLength`` beside ``pattern`` or ``format``, and ``pattern`` beside
  ``format``;
- ``multipleOf`` other than an integer's by an integer;
- a ``required`` property that ``properties`` does not list.

:func:`unenforced` finds the first of these with its path, and the backend refuses the schema
with it. What remains is enforced, formats as xgrammar's patterns describe them (a ``date`` has
the shape ``YYYY-MM-DD``, which does not rule out February 30).
"""

from __future__ import annotations

import re
from typing import Any, Iterator

#: formats xgrammar turns into a pattern
FORMATS = frozenset(
    {
        "date",
        "time",
        "date-time",
        "duration",
        "email",
        "hostname",
        "ipv4",
        "ipv6",
        "uuid",
        "uri",
        "uri-reference",
        "uri-template",
        "json-pointer",
        "relative-json-pointer",
    }
)

_UNENFORCED = {
    "not": "negation",
    "if": "conditional subschemas",
    "then": "conditional subschemas",
    "else": "conditional subschemas",
    "oneOf": "exclusive alternatives (use anyOf)",
    "contains": "array containment",
    "minContains": "array containment",
    "maxContains": "array containment",
    "dependentRequired": "dependent properties",
    "dependentSchemas": "dependent properties",
    "dependencies": "dependent properties",
    "unevaluatedProperties": "unevaluated properties",
    "unevaluatedItems": "unevaluated items",
    "additionalItems": "items after a tuple (use prefixItems and items)",
    "$dynamicRef": "dynamic references",
    "$recursiveRef": "recursive references",
}

#: keywords that constrain only values of one type
_TYPED = {
    "string": ("minLength", "maxLength", "pattern", "format"),
    "number": ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"),
    "array": ("items", "prefixItems", "minItems", "maxItems"),
    "object": (
        "required",
        "properties",
        "additionalProperties",
        "patternProperties",
        "propertyNames",
        "minProperties",
        "maxProperties",
    ),
}
_TYPE_OF = {key: kind for kind, keys in _TYPED.items() for key in keys}

#: keywords that carry no constraint, or only hold subschemas for references
_NEUTRAL = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "$comment",
        "$schema",
        "$id",
        "$anchor",
        "readOnly",
        "writeOnly",
        "deprecated",
        "contentMediaType",
        "contentEncoding",
        "$defs",
        "definitions",
    }
)

#: keywords beside which xgrammar applies nothing else
_EXCLUSIVE = ("enum", "const", "anyOf", "allOf", "$ref")

# Regular-expression features xgrammar's regex converter drops or cannot parse.
_REGEX_FEATURES = (
    (re.compile(r"\(\?[=!]|\(\?<[=!]"), "lookaround"),
    (re.compile(r"\\[1-9]|\(\?P=|\\k<"), "backreferences"),
    (re.compile(r"\(\?[aiLmsux-]+[):]"), "inline flags"),
    (re.compile(r"\\[bB]"), "word boundaries"),
)

_XG = "cannot be enforced by xgrammar"


def regex_problem(pattern: str) -> str | None:
    """The feature of ``pattern`` xgrammar does not enforce, or None."""
    for found, feature in _REGEX_FEATURES:
        if found.search(pattern):
            return f"{feature} in a regular expression"
    return None


def _types(node: dict[str, Any]) -> set[str]:
    """The JSON types ``node`` declares; an integer is also a number."""
    declared = node.get("type")
    kinds = {declared} if isinstance(declared, str) else set(declared or ())
    if "integer" in kinds:
        kinds.add("number")
    return kinds


def _has_type(value: Any, node: dict[str, Any]) -> bool:
    """Whether ``value`` is of a type ``node`` declares."""
    declared = node.get("type")
    kinds = {declared} if isinstance(declared, str) else set(declared or ())
    if value is None:
        return "null" in kinds
    if isinstance(value, bool):
        return "boolean" in kinds
    if isinstance(value, (int, float)):
        integral = isinstance(value, int) or value.is_integer()
        return "number" in kinds or (integral and "integer" in kinds)
    names = {str: "string", list: "array", dict: "object"}
    return names.get(type(value)) in kinds


def _exclusive_problem(node: dict[str, Any], at: Any) -> tuple[str, str] | None:
    head = next((k for k in _EXCLUSIVE if k in node), None)
    if head is None:
        return None
    for key in node:
        if key in _NEUTRAL or key == head or key in _UNENFORCED:
            continue
        if key == "type" and head in ("enum", "const"):
            values = node["enum"] if head == "enum" else [node["const"]]
            if all(_has_type(v, node) for v in values):
                continue
            return at("type"), f"a 'type' that some {head!r} value does not have {_XG}"
        return at(key), f"{key!r} beside {head!r} {_XG}"
    return None


def _typed_problem(node: dict[str, Any], at: Any) -> tuple[str, str] | None:
    kinds = _types(node)
    for key in node:
        kind = _TYPE_OF.get(key)
        if kind is None or kind in kinds:
            continue
        if kind == "object" and "properties" in node and "type" not in node:
            continue  # xgrammar takes a schema with properties for an object's
        return at(key), (
            f'{key!r} applies to {kind} values; without "type": "{kind}" '
            f"(or a type list holding it) it {_XG}"
        )
    return None


def _string_problem(node: dict[str, Any], at: Any) -> tuple[str, str] | None:
    fmt = node.get("format")
    if isinstance(fmt, str) and fmt not in FORMATS:
        return at("format"), (f"format {fmt!r} {_XG} (enforced: {', '.join(sorted(FORMATS))})")
    pattern = node.get("pattern")
    if isinstance(pattern, str) and (why := regex_problem(pattern)):
        return at("pattern"), f"{why} {_XG}"
    shaped = "format" if "format" in node else "pattern" if "pattern" in node else None
    if shaped:
        for key in ("minLength", "maxLength", "pattern"):
            if key in node and key != shaped:
                return at(key), f"{key!r} beside {shaped!r} {_XG}"
    for name in node.get("patternProperties") or {}:
        if why := regex_problem(name):
            return at(f"patternProperties.{name}"), f"{why} {_XG}"
    return None


def _other_problem(node: dict[str, Any], at: Any) -> tuple[str, str] | None:
    if node.get("uniqueItems") is True:
        return at("uniqueItems"), f"unique array items ('uniqueItems') {_XG}"
    if len(node.get("allOf") or ()) > 1:
        return at("allOf"), f"'allOf' of more than one schema {_XG}"
    if isinstance(node.get("items"), list):
        return at("items"), f"the tuple form of 'items' {_XG} (use prefixItems)"
    if "multipleOf" in node:
        step = node["multipleOf"]
        if _types(node) != {"integer", "number"} or not isinstance(step, int):
            return at("multipleOf"), f"'multipleOf' other than an integer's by an integer {_XG}"
    listed = node.get("properties") or {}
    for name in node.get("required") or ():
        if name not in listed:
            return at("required"), f"required property {name!r} is not in 'properties'; {_XG}"
    return None


def _problem(node: dict[str, Any], path: str) -> tuple[str, str] | None:
    def at(key: str) -> str:
        return f"{path}.{key}" if path else key

    for key, what in _UNENFORCED.items():
        if key in node:
            return at(key), f"{what} ({key!r}) {_XG}"
    for check in (_exclusive_problem, _typed_problem, _string_problem, _other_problem):
        found = check(node, at)
        if found is not None:
            return found
    return None


# Keywords whose value is a schema, a list of schemas or a mapping of names to schemas.
_ONE = ("additionalProperties", "items", "propertyNames")
_MANY = ("prefixItems", "anyOf", "allOf")
_NAMED = ("properties", "patternProperties", "$defs", "definitions")


def _subschemas(node: dict[str, Any], path: str) -> Iterator[tuple[Any, str]]:
    def at(key: str) -> str:
        return f"{path}.{key}" if path else key

    for key in _ONE:
        value = node.get(key)
        if isinstance(value, dict):
            if key == "propertyNames" and "type" not in value:
                value = {"type": "string", **value}  # property names are strings
            yield value, at(key)
    for key in _MANY:
        for i, item in enumerate(node.get(key) or ()):
            yield item, f"{at(key)}[{i}]"
    for key in _NAMED:
        for name, item in (node.get(key) or {}).items():
            yield item, f"{at(key)}.{name}"


def unenforced(schema: Any) -> tuple[str, str] | None:
    """(path, problem) of the first part of ``schema`` xgrammar would not enforce, or None.
    Paths are dotted from the schema's root (``properties.tags.uniqueItems``)."""
    stack: list[tuple[Any, str]] = [(schema, "")]
    while stack:
        node, path = stack.pop()
        if not isinstance(node, dict):
            continue
        found = _problem(node, path)
        if found is not None:
            return found
        stack.extend(reversed(list(_subschemas(node, path))))
    return None
