"""Configuration errors that a person can act on: where, which key, what was expected.

Pydantic's own error report is turned into one line per problem, each naming the key path
(``scheduler.max_num_seqs``), where the value came from (the YAML file, an environment variable
or a command-line flag), the value and what was expected.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable

from pydantic import BaseModel, ValidationError

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the configuration."""

    key: str  # dotted key path, e.g. "scheduler.max_num_seqs"; "" for the whole document
    message: str  # what was expected (and what was found)
    origin: str = ""  # "file /etc/tallow.yaml", "env TALLOW_SERVER__PORT", "flag --port"

    def __str__(self) -> str:
        where = f" (from {self.origin})" if self.origin else ""
        key = self.key or "<top level>"
        return f"{key}{where}: {self.message}"


class ConfigError(ValueError):
    """The configuration cannot be used; ``str(err)`` is a complete multi-line explanation."""

    def __init__(self, problems: Iterable[Problem] | str, *, header: str = "") -> None:
        if isinstance(problems, str):
            problems = [Problem("", problems)]
        self.problems: list[Problem] = list(problems)
        self.header = header or "invalid tallow configuration"
        super().__init__(self._render())

    def _render(self) -> str:
        if len(self.problems) == 1 and not self.problems[0].key:
            p = self.problems[0]
            return f"{self.header}: {p.message}" + (f" (from {p.origin})" if p.origin else "")
        lines = [f"{self.header}:"]
        lines += [f"  - {p}" for p in self.problems]
        return "\n".join(lines)


def key_path(loc: Iterable[Any]) -> str:
    """``("plugins", "require", 0)`` → ``"plugins.require[0]"``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _allowed_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The field names valid at the mapping that holds ``loc``'s last key."""
    current: object = model
    for part in loc[:-1]:
        fields = getattr(current, "model_fields", None)
        if not fields or part not in fields:
            return []
        current = fields[part].annotation
    fields = getattr(current, "model_fields", None)
    return list(fields) if fields else []


def _expected(err: ErrorDetails) -> str:
    kind = err["type"]
    msg = str(err.get("msg", ""))
    ctx = err.get("ctx") or {}
    if kind == "value_error":
        # our own validators already phrase "expected ..."
        return msg.removeprefix("Value error, ")
    if kind == "literal_error":
        return f"expected one of {ctx.get('expected', '')}"
    if kind in ("int_parsing", "int_type", "int_from_float"):
        return "expected an integer"
    if kind in ("float_parsing", "float_type"):
        return "expected a number"
    if kind in ("bool_parsing", "bool_type"):
        return "expected true or false"
    if kind in ("string_type",):
        return "expected a string"
    if kind in ("list_type",):
        return "expected a list"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return "expected a mapping of keys to values"
    if msg.startswith("Input should be "):
        return "expected " + msg.removeprefix("Input should be ")
    return msg[:1].lower() + msg[1:]


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def problems_from_validation(
    exc: ValidationError,
    model: type[BaseModel],
    origin_of: Callable[[tuple[Any, ...]], str],
) -> list[Problem]:
    """Translate ``exc`` (raised validating ``model``) into :class:`Problem` lines.

    ``origin_of(loc)`` says where the value at ``loc`` came from.
    """
    problems: list[Problem] = []
    for err in exc.errors(include_url=False):
        loc = tuple(err["loc"])
        path = key_path(loc)
        origin = origin_of(loc)
        if err["type"] == "extra_forbidden":
            allowed = _allowed_keys(model, loc)
            message = "unknown key"
            close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
            if close:
                message += f" (did you mean {close[0]!r}?)"
            if allowed:
                message += "; expected one of: " + ", ".join(allowed)
        else:
            message = _expected(err)
            value = err.get("input")
            scalar = not isinstance(value, (list, dict))
            if "input" in err and err["type"] != "missing" and scalar and "got " not in message:
                message = f"got {_shown(value)}, {message}"
        problems.append(Problem(path, message, origin))
    return problems
