"""Merge the sources of settings and validate them once.

Precedence, highest first: command-line flags or the keyword arguments of the Python API,
``TALLOW_<SECTION>__<FIELD>`` environment variables, the YAML file (``--config``, the ``config=``
argument, or ``$TALLOW_CONFIG``), the defaults of the models. A setting replaces the lower
layers' value whole (lists and mappings are not merged). :func:`load_config` is the one place
that layers them, for the ``tallow`` commands and for ``LLM()`` / ``AsyncEngine.create()``.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Mapping, Sequence

from pydantic import ValidationError

from .cli_args import CONFIG_DEST, add_config_arguments, read_args
from .errors import ConfigError, Problem, problems_from_validation
from .keywords import read_keywords
from .models import TallowConfig
from .sources import Layer, read_env, read_file

CONFIG_ENV = "TALLOW_CONFIG"


def _validate(layers: Sequence[Layer]) -> TallowConfig:
    merged: dict[str, Any] = {}
    origins: dict[tuple[str, ...], str] = {}
    problems: list[Problem] = []
    for layer in layers:
        problems.extend(layer.problems)
        for key, value in layer.values.items():
            if len(key) == 1:
                merged[key[0]] = value
            else:
                section = merged.setdefault(key[0], {})
                if isinstance(section, dict):
                    section[key[1]] = value
            origins[key] = layer.origins[key]

    def origin_of(loc: tuple[Any, ...]) -> str:
        for n in range(len(loc), 0, -1):
            found = origins.get(tuple(str(p) for p in loc[:n]))
            if found:
                return found
        return ""

    try:
        config = TallowConfig.model_validate(merged)
    except ValidationError as exc:
        problems.extend(problems_from_validation(exc, TallowConfig, origin_of))
        config = None
    if problems:
        raise ConfigError(problems)
    assert config is not None
    for key, origin in origins.items():
        if len(key) == 2:
            getattr(config, key[0])._origins[key[1]] = origin
    return config


def config_from_mapping(data: Mapping[str, Any], origin: str = "") -> TallowConfig:
    """Validate a nested mapping (``{"server": {"port": 8000}}``) with tallow's error messages."""
    layer = Layer(origin or "mapping")
    for section, body in data.items():
        if isinstance(body, Mapping):
            for name, value in body.items():
                layer.set((str(section), str(name)), value, origin)
        else:
            layer.set((str(section),), body, origin)
    return _validate([layer])


def load_config(
    args: argparse.Namespace | Sequence[str] | None = None,
    env: Mapping[str, str] = os.environ,
    path: str | os.PathLike[str] | None = None,
    *,
    keywords: Mapping[str, Any] | None = None,
    caller: str = "LLM()",
) -> TallowConfig:
    """The effective configuration: defaults < YAML file < environment < flags and keywords.

    ``args`` is a namespace parsed by a parser that went through :func:`add_config_arguments`
    (or a list of such command-line arguments); ``path`` names the YAML file and wins over
    ``--config``, which wins over ``$TALLOW_CONFIG``. ``keywords`` are the keyword arguments of
    the Python API (:mod:`tallow.config.keywords`; ``caller`` names the function in messages).
    Raises :class:`ConfigError` listing every problem (file, key path, value, what was
    expected), and TypeError for a keyword that is not a setting.
    """
    keyword_layer = read_keywords(keywords or {}, caller)
    if args is not None and not isinstance(args, argparse.Namespace):
        parser = argparse.ArgumentParser(prog="tallow", add_help=False)
        add_config_arguments(parser)
        try:
            args = parser.parse_args(list(args))
        except SystemExit:
            raise ConfigError(f"cannot parse the command-line arguments {list(args)!r}") from None
    if path is None and args is not None:
        path = getattr(args, CONFIG_DEST, None)
    if path is None:
        path = env.get(CONFIG_ENV) or None
    layers: list[Layer] = []
    if path is not None:
        layers.append(read_file(path))
    layers.append(read_env(env))
    layers.append(read_args(args))
    layers.append(keyword_layer)
    return _validate(layers)


def dump_config(config: TallowConfig, *, redact: bool = True) -> dict[str, Any]:
    """The configuration as plain JSON-able data; API keys shown as ``***`` unless ``redact``
    is False."""
    data = config.model_dump(mode="json")
    if redact:
        data["server"]["api_keys"] = ["***" for _ in data["server"]["api_keys"]]
    return data
