"""Errors of the plugin system that name the plugin: distribution, version, entry point.

:class:`PluginLoadError` is raised when a plugin's module cannot be imported or registered (the
plugin manager), and its subclass :class:`ComponentLoadError` when a component's lazy
``"module:attr"`` target cannot be imported or resolved, which happens on first use, long after
the plugin loaded: the message then still says which plugin registered the target.
"""

from __future__ import annotations

import difflib
import importlib
import os
import traceback
from typing import Iterable
import pluggy


class PluginError(RuntimeError):
    """The plugins cannot be set up as configured; start-up stops."""


class PluginLoadError(PluginError):
    """A plugin (or one of its components) failed to import or register.

    ``distribution``, ``version`` and ``entry_point`` name the plugin; ``cause`` is the
    original exception (also ``__cause__``).
    """

    def __init__(
        self,
        message: str,
        *,
        distribution: str,
        version: str,
        entry_point: str,
        cause: BaseException,
    ) -> None:
        super().__init__(message)
        self.distribution = distribution
        self.version = version
        self.entry_point = entry_point
        self.cause = cause


class ComponentLoadError(PluginLoadError):
    """A registered component's ``"module:attr"`` target cannot be imported or resolved.

    Besides the plugin's names it carries ``kind``, ``component`` (the registered name) and
    ``target``; ``detail`` is what went wrong, without the plugin's names.
    """

    def __init__(
        self,
        *,
        kind: str,
        component: str,
        target: str,
        detail: str,
        distribution: str,
        version: str,
        entry_point: str,
        cause: BaseException,
    ) -> None:
        plugin = f"plugin {distribution} {version or '(unknown version)'}"
        if entry_point:
            plugin += f" (entry point {entry_point})"
        super().__init__(
            f"{kind} {component!r} of {plugin} cannot be loaded: its target {target!r} "
            f"fails: {detail}",
            distribution=distribution,
            version=version,
            entry_point=entry_point,
            cause=cause,
        )
        self.kind = kind
        self.component = component
        self.target = target
        self.detail = detail


_PLUGIN_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_PLUGGY_DIR = os.path.dirname(os.path.abspath(pluggy.__file__))
_IMPORTLIB_DIR = os.path.dirname(os.path.abspath(importlib.__file__))


def describe_exception(exc: BaseException) -> str:
    """``Type: message (raised at file:line)``, the location being the deepest frame in the
    plugin's own code (not tallow's plugin machinery, pluggy or the import system)."""
    where = ""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        path = os.path.abspath(frame.filename)
        if frame.filename.startswith("<") or path.startswith(
            (_PLUGIN_PACKAGE_DIR, _PLUGGY_DIR, _IMPORTLIB_DIR)
        ):
            continue
        where = f" (raised at {frame.filename}:{frame.lineno})"
        break
    return f"{type(exc).__name__}: {exc}{where}"


def missing_attribute(where: str, name: str, known: Iterable[str]) -> str:
    """``"<where> has no attribute 'Nmae' (did you mean 'Name'?)"``, the suggestion drawn from
    the public names in ``known``."""
    close = difflib.get_close_matches(name, [n for n in known if not n.startswith("_")], n=1)
    return f"{where} has no attribute {name!r}" + (
        f" (did you mean {close[0]!r}?)" if close else ""
    )
