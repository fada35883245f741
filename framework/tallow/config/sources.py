"""Where settings come from: the YAML file and ``TALLOW_<SECTION>__<FIELD>`` environment variables.

Each source produces a :class:`Layer`: the values it sets, keyed by ``(section, field)``, each
with its origin for error messages, plus the problems found while reading it (a value that is
not even shaped right). Validation of values is left to the pydantic models, once, after merging.
"""

from __future__ import annotations

import difflib
import json
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .errors import ConfigError, Problem
from .models import SECTIONS

ENV_PREFIX = "TALLOW_"
ENV_SEPARATOR = "__"


@dataclass
class Layer:
    """Settings from one source. Keys are ``(section,)`` for a whole (unknown) top-level key or
    ``(section, field)``; values are raw (strings from env and CLI, YAML types from files)."""

    name: str
    values: dict[tuple[str, ...], Any] = field(default_factory=dict)
    origins: dict[tuple[str, ...], str] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)

    def set(self, key: tuple[str, ...], value: object, origin: str) -> None:
        self.values[key] = value
        self.origins[key] = origin


def field_kind(annotation: object) -> tuple[str, bool]:
    """(``"list"`` | ``"dict"`` | ``"bool"`` | ``"scalar"``, whether None is allowed)."""
    optional = False
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        optional = len(args) < len(typing.get_args(annotation))
        annotation = args[0] if len(args) == 1 else annotation
        origin = typing.get_origin(annotation)
    if origin is list:
        return "list", optional
    if origin is dict:
        return "dict", optional
    if annotation is bool:
        return "bool", optional
    return "scalar", optional


# ---------------------------------------------------------------------------------------------
# YAML file
# ---------------------------------------------------------------------------------------------
def read_file(path: str | os.PathLike[str]) -> Layer:
    """Read a YAML config file into a layer; an unreadable or malformed file is a ConfigError."""
    import yaml

    where = str(Path(path))
    origin = f"file {where}"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {where}: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"config file {where} is not valid YAML{at}: {problem}") from None
    layer = Layer(origin)
    if data is None:
        return layer
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file {where} must be a mapping of sections ({', '.join(SECTIONS)}), "
            f"got {type(data).__name__}"
        )
    for section, body in data.items():
        key = str(section)
        if key not in SECTIONS:
            layer.set((key,), body, origin)  # reported as an unknown key by validation
            continue
        if body is None:
            continue
        if not isinstance(body, dict):
            layer.problems.append(
                Problem(key, f"got {body!r}, expected a mapping of keys to values", origin)
            )
            continue
        for name, value in body.items():
            layer.set((key, str(name)), value, origin)
    return layer


# ---------------------------------------------------------------------------------------------
# Environment
# ---------------------------------------------------------------------------------------------
def env_var_name(section: str, name: str) -> str:
    """The environment variable of a setting: ``TALLOW_SERVER__PORT`` for ``server.port``."""
    return f"{ENV_PREFIX}{section.upper()}{ENV_SEPARATOR}{name.upper()}"


def _parse_env_value(var: str, raw: str, annotation: object) -> tuple[object, Problem | None]:
    kind, optional = field_kind(annotation)
    text = raw.strip()
    if optional and text.lower() in ("", "none", "null"):
        return None, None
    if kind == "list":
        if text.startswith("["):
            try:
                return json.loads(text), None
            except json.JSONDecodeError as exc:
                return None, Problem("", f"expected a JSON list or comma-separated values: {exc}")
        return [part.strip() for part in text.split(",") if part.strip()], None
    if kind == "dict":
        try:
            return json.loads(text or "{}"), None
        except json.JSONDecodeError as exc:
            return None, Problem("", f"expected a JSON object: {exc}")
    return raw, None


def read_env(env: Mapping[str, str]) -> Layer:
    """Settings from ``TALLOW_<SECTION>__<FIELD>`` variables.

    Variables without the double underscore (``TALLOW_PLUGINS``, ``TALLOW_CONFIG``,
    ``TALLOW_TRACE_HOOKS``) are switches read elsewhere, not settings. A variable with it that
    names no setting is an error, so a typo does not go unnoticed.
    """
    layer = Layer("environment")
    for var in sorted(env):
        if not var.startswith(ENV_PREFIX) or ENV_SEPARATOR not in var[len(ENV_PREFIX) :]:
            continue
        section, _, name = var[len(ENV_PREFIX) :].partition(ENV_SEPARATOR)
        section, name = section.lower(), name.lower()
        origin = f"env {var}"
        model = SECTIONS.get(section)
        if model is None:
            close = difflib.get_close_matches(section, list(SECTIONS), n=1)
            hint = f" (did you mean {env_var_name(close[0], name)}?)" if close else ""
            layer.problems.append(
                Problem(
                    f"{section}.{name}",
                    f"unknown section {section!r}{hint}; expected one of: " + ", ".join(SECTIONS),
                    origin,
                )
            )
            continue
        info = model.model_fields.get(name)
        if info is None:
            close = difflib.get_close_matches(name, list(model.model_fields), n=1)
            hint = f" (did you mean {env_var_name(section, close[0])}?)" if close else ""
            layer.problems.append(
                Problem(
                    f"{section}.{name}",
                    f"unknown key{hint}; expected one of: " + ", ".join(model.model_fields),
                    origin,
                )
            )
            continue
        value, problem = _parse_env_value(var, env[var], info.annotation)
        if problem is not None:
            layer.problems.append(Problem(f"{section}.{name}", problem.message, origin))
            continue
        layer.set((section, name), value, origin)
    return layer
