"""A plugin's own settings: ``plugins.settings.<distribution>`` of the YAML config, validated.

A plugin describes its settings as a pydantic model (``extra="forbid"`` so that a misspelled
key is an error, not a silent default) and reads them with :func:`plugin_settings`; every
problem is reported at once with its full key path, the value and what was expected, the way
the core reports its own settings.
"""

from __future__ import annotations

import json
from typing import TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from .errors import PluginError

M = TypeVar("M", bound=BaseModel)


class PluginSettingsError(PluginError):
    """A plugin's settings are invalid; start-up stops with this message."""


def plugin_settings(model: type[M], config: object, distribution: str) -> M:
    """``config.plugins.settings[distribution]`` validated as ``model`` (an empty mapping when
    the section is absent). ``config`` is a :class:`tallow.config.TallowConfig` or None (read
    by attribute: a KV codec, whose base lives below the configuration, holds it as ``object``).

    Raises :class:`PluginSettingsError` listing every problem as
    ``plugins.settings.<distribution>.<key path>: <what is wrong> (got <value>)``.
    """
    plugins = getattr(config, "plugins", None)
    settings = getattr(plugins, "settings", None) or {}
    raw = settings.get(distribution, {}) if isinstance(settings, dict) else {}
    prefix = f"plugins.settings.{distribution}"
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise PluginSettingsError(
            f"{prefix}: expected a mapping of settings, got {type(raw).__name__}"
        )
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        problems = [_describe(prefix, error) for error in exc.errors(include_url=False)]
        raise PluginSettingsError(
            "invalid plugin settings:\n  - " + "\n  - ".join(problems)
        ) from None


def _describe(prefix: str, error: ErrorDetails) -> str:
    path = prefix + "".join(
        f"[{part}]" if isinstance(part, int) else f".{part}" for part in error["loc"]
    )
    message = error["msg"]
    if error["type"] == "extra_forbidden":
        return f"{path}: unknown key"
    if error["type"] == "missing":
        return f"{path}: missing"
    try:
        shown = json.dumps(error.get("input"))[:80]
    except (TypeError, ValueError):
        shown = repr(error.get("input"))[:80]
    return f"{path}: {message} (got {shown})"
