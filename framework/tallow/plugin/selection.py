"""The one rule for choosing a component, used for every kind.

An explicitly named component is validated, and start-up fails with its reasons if it cannot
serve. Otherwise the first component by priority that gives no reasons is taken, and the choice
is logged with the reasons the higher-priority ones gave. Reasons come from the component's
``validate(config)`` and, when the caller passes one, from a ``check`` of what only the caller
knows (the loaded model, the chosen KV codec).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable

from .errors import ComponentLoadError
from .registry import Entry, Registry, RegistryError

if TYPE_CHECKING:
    from tallow.config import TallowConfig

log = logging.getLogger("tallow.plugin")

#: called with an entry whose ``validate`` gave no reasons; returns the further reasons it
#: cannot serve (empty when it can)
Check = Callable[[Entry], list[str]]


class SelectionError(RuntimeError):
    """No component of a kind can serve the configuration."""


def _validate_reasons(entry: Entry, config: TallowConfig | None) -> list[str]:
    try:
        component = entry.load()
    except ComponentLoadError as exc:  # an import failure is a reason, not a crash
        return [str(exc)]
    validate = getattr(component, "validate", None)
    if validate is None:
        return []
    return list(validate(config) or [])


def _reasons(entry: Entry, config: TallowConfig | None, check: Check | None) -> list[str]:
    reasons = _validate_reasons(entry, config)
    # The check may build the component, which is only safe once it imported and validated.
    if reasons or check is None:
        return reasons
    return list(check(entry) or [])


def select(
    registry: Registry,
    config: TallowConfig | None,
    name: str | None = None,
    *,
    check: Check | None = None,
) -> Entry:
    """Choose the entry of ``registry`` whose component serves ``config``.

    ``name`` names a component explicitly (None or ``"auto"``: choose automatically). A named
    entry is returned if it gives no reasons, else :class:`SelectionError` lists them.
    Automatically, the entries are tried highest priority first and the first that gives no
    reasons is returned; the reasons of those passed over are logged, and all of them are in the
    :class:`SelectionError` raised when none serves.

    An entry's reasons are those of its component's ``validate(config)`` (or its import error).
    Only when there are none is ``check`` called: it receives the :class:`Entry` and returns a
    list of strings, the further reasons that entry cannot serve (empty when it can). Exceptions
    raised by ``check`` propagate.
    """
    if name and name != "auto":
        return _select_named(registry, config, name, check)
    rejected: list[str] = []
    for entry in registry.by_priority():
        reasons = _reasons(entry, config, check)
        if not reasons:
            log.info(
                "%s: chose %r from %s (priority %d)%s",
                registry.kind,
                entry.name,
                entry.distribution,
                entry.priority,
                f"; passed over: {'; '.join(rejected)}" if rejected else "",
            )
            return entry
        rejected.append(f"{entry.name}: {', '.join(reasons)}")
    detail = "\n  - ".join(rejected) if rejected else "none is registered"
    raise SelectionError(
        f"no {registry.kind} can serve this configuration:\n  - {detail}" + registry.missing_hint()
    )


def serving(
    registry: Registry, config: TallowConfig | None, *, check: Check | None = None
) -> list[Entry]:
    """Every entry of ``registry`` that serves ``config``, highest priority first: the first is
    what :func:`select` takes automatically, the others are what a caller may fall back on
    (the server's secondary tool parsers). Entries that give reasons are left out and logged
    at debug level."""
    chosen: list[Entry] = []
    for entry in registry.by_priority():
        reasons = _reasons(entry, config, check)
        if reasons:
            log.debug("%s: %r cannot serve: %s", registry.kind, entry.name, ", ".join(reasons))
        else:
            chosen.append(entry)
    return chosen


def _select_named(
    registry: Registry, config: TallowConfig | None, name: str, check: Check | None
) -> Entry:
    try:
        entry = registry.entry(name)
    except RegistryError as exc:
        raise SelectionError(str(exc)) from None
    reasons = _reasons(entry, config, check)
    if reasons:
        raise SelectionError(
            f"{registry.kind} {name!r} (from {entry.distribution}) cannot serve this "
            "configuration:\n  - " + "\n  - ".join(reasons)
        )
    log.info("%s: using %r from %s (named in the config)", registry.kind, name, entry.distribution)
    return entry
