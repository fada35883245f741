"""What installed plugins that did not load would have provided: "installed but disabled".

When a component is looked up and missing (an architecture, a weight format, a quant scheme, a
KV codec, an attention backend, a tool parser), the message should say so if an installed plugin
that was left out provides it: which plugin, why it was left out, and how to load it. Whether
it provides it is found out only then, on that error path, by importing the plugin's entry-point
module into a scratch plugin manager and running its registration hooks (which register
``"module:attr"`` strings and import no component), once per plugin. A plugin that failed to
load is named as one that may provide it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from .registry import Entry, Registries


class Candidate(Protocol):
    """What this module reads of a discovered plugin (:class:`tallow.plugin.discovery.Candidate`,
    declared here by those fields: the manager builds on this module, which cannot import it)."""

    @property
    def name(self) -> str: ...

    @property
    def version(self) -> str: ...


Match = Callable[[Entry], bool]
#: loads one discovered plugin on its own into a scratch plugin manager and returns the
#: registries it filled (None: it cannot load); the plugin manager hands in its own
#: (:func:`tallow.plugin.manager.probe_alone`), which this module cannot import: the manager
#: builds on it
Probe = Callable[[Any], "Registries | None"]


@dataclass
class _Unloaded:
    name: str
    version: str
    status: str  # "disabled" or "failed"
    reason: str  # why it did not load
    enable: str = ""  # how to load it
    candidate: Candidate | None = None  # the discovered entry point, to probe a disabled plugin
    registries: Registries | None = field(default=None, repr=False)
    probed: bool = False


class UnloadedPlugins:
    """The installed plugins one plugin manager left out or failed to load."""

    def __init__(self, probe: Probe) -> None:
        self._plugins: dict[str, _Unloaded] = {}
        self._probe = probe

    def disabled(self, key: str, candidate: Candidate, reason: str, enable: str) -> None:
        self._plugins[key] = _Unloaded(
            candidate.name, candidate.version, "disabled", reason, enable, candidate
        )

    def failed(self, key: str, name: str, version: str, reason: str) -> None:
        self._plugins[key] = _Unloaded(name, version, "failed", reason)

    def loaded(self, key: str) -> None:
        self._plugins.pop(key, None)

    def _registries(self, plugin: _Unloaded) -> Registries | None:
        if not plugin.probed:
            plugin.probed = True
            plugin.registries = self._probe(plugin.candidate)
        return plugin.registries

    def explain(self, kind: str, match: Match | None) -> str:
        """A sentence for a failed lookup of a ``kind`` component (``match`` says which entries
        would have done; None: any of the kind), or ``""`` when no left-out plugin is known to
        provide one and none failed."""
        providing: list[str] = []
        failed: list[str] = []
        for plugin in self._plugins.values():
            label = f"{plugin.name} {plugin.version or '(unknown version)'}"
            if plugin.status == "failed":
                failed.append(f"{label} ({plugin.reason})")
                continue
            registries = self._registries(plugin)
            if registries is None:
                continue
            registry = next(r for r in registries.all() if r.kind == kind)
            names = [e.name for e in registry if match is None or match(e)]
            if names:
                advice = f"; {plugin.enable}" if plugin.enable else ""
                providing.append(
                    f"plugin {label} provides {kind} "
                    f"{', '.join(map(repr, names))} but is installed and not "
                    f"loaded: {plugin.reason}{advice}"
                )
        parts = providing
        if failed:
            parts = [
                *providing,
                "installed plugins that failed to load, and may provide it: " + "; ".join(failed),
            ]
        return "; ".join(parts)
