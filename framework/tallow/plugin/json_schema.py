"""JSON Schemas from clients, checked and applied without network access or unbounded work.

Schemas arrive in requests (a tool's ``parameters``; later ``response_format``) and are applied
to model output. Whoever writes the schema must not be able to make the server do more than
validate a bounded document:

- **No remote references.** A ``$ref`` (or ``$dynamicRef`` / ``$recursiveRef``) must point into
  the same schema (``#...``); anything else is refused when the schema is checked, and the
  validators are built on a registry that retrieves nothing, so a reference that only becomes
  remote through an ``$id`` fails to resolve instead of being fetched.
- **Bounded depth.** Nesting deeper than :data:`MAX_SCHEMA_DEPTH` is refused before the
  metaschema check (whose recursion would otherwise exhaust the stack).
- **Bounded regular expressions.** ``pattern`` and ``patternProperties`` are matched with the
  ``regex`` package under a time limit (:data:`PATTERN_TIMEOUT_S`), so a catastrophically
  backtracking pattern reports a validation error instead of stalling the caller.

:func:`check_schema` raises :class:`SchemaProblem` (a ValueError) saying what is wrong;
:func:`schema_errors` lists an instance's violations as ``path: message`` strings.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Callable, Iterator

#: Deepest nesting of objects and arrays a schema may have.
MAX_SCHEMA_DEPTH = 48
#: Time one ``pattern`` match may take before it counts as failed.
PATTERN_TIMEOUT_S = 0.05

_REF_KEYS = ("$ref", "$dynamicRef", "$recursiveRef")
# Keywords whose values are data, not schemas: a "$ref" key inside them is not a reference.
_DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples"})


class SchemaProblem(ValueError):
    """A client's JSON Schema that cannot be used; the message says why."""


def check_schema(schema: object) -> None:
    """Refuse ``schema`` unless it is a valid JSON Schema (by its ``$schema`` draft, 2020-12
    by default) that references only itself and nests at most :data:`MAX_SCHEMA_DEPTH` deep."""
    from jsonschema import SchemaError

    if not isinstance(schema, dict):
        raise SchemaProblem("expected a JSON Schema object")
    _check_shape(schema)
    try:
        _validator_class(schema).check_schema(schema)
    except SchemaError as exc:
        raise SchemaProblem(f"not a valid JSON Schema ({exc.message})") from None
    except RecursionError:
        raise SchemaProblem("the schema is nested too deeply to check") from None


def schema_errors(
    schema: dict[str, Any], instance: object, root: str = "", schema_name: str | None = None
) -> list[str]:
    """Every violation of ``schema`` by ``instance``, as ``"<root><path>: <message>"``, in
    path order; a schema that cannot be applied (an unresolvable reference, runaway
    recursion) is reported as one violation naming ``schema_name``."""
    from referencing.exceptions import Unresolvable

    validator = _validator_class(schema)(schema, registry=_local_registry())
    try:
        errors = sorted(validator.iter_errors(instance), key=lambda e: [str(p) for p in e.path])
    except (Unresolvable, RecursionError) as exc:
        which = f"the schema of {schema_name!r}" if schema_name else "the schema"
        why = "it recurses too deeply" if isinstance(exc, RecursionError) else str(exc)
        return [f"{root or 'value'}: {which} cannot be applied ({why})"]
    out = []
    for err in errors:
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.absolute_path)
        out.append(f"{root}{path}: {err.message}" if root or path else err.message)
    return out


def _check_shape(schema: dict[str, Any]) -> None:
    """Depth and references, iteratively (a recursive walk could itself overflow)."""
    stack: list[tuple[Any, int, str]] = [(schema, 1, "")]
    while stack:
        node, depth, where = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            raise SchemaProblem(
                f"nested deeper than {MAX_SCHEMA_DEPTH} levels (at {where or 'the root'})"
            )
        if isinstance(node, dict):
            for key, value in node.items():
                if key in _REF_KEYS and isinstance(value, str) and not value.startswith("#"):
                    raise SchemaProblem(
                        f"{key} {value!r} at {where or 'the root'} points outside "
                        "the schema; only local references ('#...') are allowed"
                    )
                if key in _DATA_KEYWORDS:
                    continue
                if isinstance(value, (dict, list)):
                    stack.append((value, depth + 1, f"{where}.{key}" if where else str(key)))
        elif isinstance(node, list):
            for i, value in enumerate(node):
                if isinstance(value, (dict, list)):
                    stack.append((value, depth + 1, f"{where}[{i}]"))


@lru_cache(maxsize=1)
def _local_registry() -> Any:
    """A registry that knows the metaschemas and retrieves nothing else."""
    from referencing import Registry

    return Registry()


def _validator_class(schema: dict[str, Any]) -> Any:
    from jsonschema import Draft202012Validator, validators

    return _bounded(validators.validator_for(schema, default=Draft202012Validator))


@lru_cache(maxsize=None)
def _bounded(cls: Any) -> Any:  # Any: a jsonschema validator class (jsonschema is untyped)
    """``cls`` with its regular-expression keywords matched under a time limit."""
    from jsonschema import validators

    keywords: dict[str, Callable[..., Iterator[Any]]] = {"pattern": _pattern}
    if "patternProperties" in cls.VALIDATORS:
        keywords["patternProperties"] = _pattern_properties
        keywords["additionalProperties"] = _additional_properties
    return validators.extend(cls, keywords)


class _PatternTimeout(Exception):
    pass


def _search(pattern: str, text: str) -> bool:
    import regex

    try:
        return regex.search(pattern, text, timeout=PATTERN_TIMEOUT_S) is not None
    except TimeoutError:
        raise _PatternTimeout(pattern) from None


# Any below: jsonschema's validator, the JSON values it walks and the errors it yields
def _pattern(
    validator: Any, pattern: str, instance: Any, schema: dict[str, Any]
) -> Iterator[Any]:  # Any: as above
    from jsonschema import ValidationError

    if not validator.is_type(instance, "string"):
        return
    try:
        found = _search(pattern, instance)
    except _PatternTimeout:
        yield ValidationError(
            f"{instance[:40]!r} could not be matched against {pattern!r} "
            f"within {PATTERN_TIMEOUT_S}s"
        )
        return
    if not found:
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(
    validator: Any,
    patterns: dict[str, Any],
    instance: Any,  # Any: as above
    schema: dict[str, Any],
) -> Iterator[Any]:
    from jsonschema import ValidationError

    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            try:
                matched = _search(pattern, key)
            except _PatternTimeout:
                yield ValidationError(
                    f"property {key[:40]!r} could not be matched against "
                    f"{pattern!r} within {PATTERN_TIMEOUT_S}s"
                )
                continue
            if matched:
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(
    validator: Any,
    extra_schema: Any,
    instance: Any,  # Any: as above
    schema: dict[str, Any],
) -> Iterator[Any]:
    from jsonschema import ValidationError

    if not validator.is_type(instance, "object"):
        return
    known = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras = []
    for key in instance:
        if key in known:
            continue
        try:
            if any(_search(p, key) for p in patterns):
                continue
        except _PatternTimeout as exc:
            yield ValidationError(
                f"property {key[:40]!r} could not be matched against "
                f"{exc.args[0]!r} within {PATTERN_TIMEOUT_S}s"
            )
            continue
        extras.append(key)
    if validator.is_type(extra_schema, "object"):
        for key in extras:
            yield from validator.descend(instance[key], extra_schema, path=key)
    elif extra_schema is False and extras:
        listed = ", ".join(repr(k) for k in sorted(extras))
        yield ValidationError(
            f"Additional properties are not allowed ({listed} "
            f"{'was' if len(extras) == 1 else 'were'} unexpected)"
        )
