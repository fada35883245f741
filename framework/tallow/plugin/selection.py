"""The one rule for choosing a component, used for every kind.

An explicitly named component is validated, and start-up fails with its reasons if it cannot
serve. Otherwise the first component by priority whose ``validate`` returns no reasons is taken,
and the choice is logged with the reasons the higher-priority ones gave.
"""

from __future__ import annotations

import logging
from typing import Any

from .registry import Entry, Registry, RegistryError

log = logging.getLogger("tallow.plugin")


class SelectionError(RuntimeError):
    """No component of a kind can serve the configuration."""


def _reasons(entry: Entry, config: Any) -> list[str]:
    try:
        component = entry.load()
    except Exception as exc:  # an import failure is a reason, not a crash
        return [f"cannot import {entry.target}: {type(exc).__name__}: {exc}"]
    validate = getattr(component, "validate", None)
    if validate is None:
        return []
    return list(validate(config) or [])


def select(registry: Registry, config: Any, name: str | None = None) -> Entry:
    """Choose the component of ``registry`` that serves ``config``.

    ``name`` (None or ``"auto"`` for automatic) names a component explicitly.
    """
    if name and name != "auto":
        try:
            entry = registry.entry(name)
        except RegistryError as exc:
            raise SelectionError(str(exc)) from None
        reasons = _reasons(entry, config)
        if reasons:
            raise SelectionError(
                f"{registry.kind} {name!r} (from {entry.distribution}) cannot serve this "
                "configuration:\n  - " + "\n  - ".join(reasons)
            )
        log.info("%s: using %r from %s (named in the config)", registry.kind, name,
                 entry.distribution)
        return entry
    rejected: list[str] = []
    for entry in registry.by_priority():
        reasons = _reasons(entry, config)
        if not reasons:
            log.info("%s: chose %r from %s (priority %d)%s", registry.kind, entry.name,
                     entry.distribution, entry.priority,
                     f"; passed over: {'; '.join(rejected)}" if rejected else "")
            return entry
        rejected.append(f"{entry.name}: {', '.join(reasons)}")
    detail = "\n  - ".join(rejected) if rejected else "none is registered"
    raise SelectionError(f"no {registry.kind} can serve this configuration:\n  - {detail}")
