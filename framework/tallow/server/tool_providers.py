"""The tools the server runs itself: every registered :class:`~tallow.plugin.ToolProvider`.

:class:`ToolProviders` builds one instance of each registered provider class for the config
(``from_config``; None means it has nothing to offer), starts them with the app and stops them
at shutdown. It keeps one catalog of the tools they offer, rebuilt when a provider says its
tools changed: definitions are checked like a request's ``tools`` (a provider's tool that is
not valid is left out with a warning, so one bad tool cannot break every request), and a name
offered by two providers is kept by the first (by registry priority) and given to the second as
``<provider>__<name>``. Calls reach the provider through :meth:`ToolProviders.call`, which turns
anything a provider raises into an error result the model sees.

This module and the tool loop know providers only through the public contract; nothing here
knows what MCP is.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tallow.plugin import PluginSettingsError, ToolProvider, ToolResult

from .errors import APIError
from .tools import tool_name, validate_tools

if TYPE_CHECKING:
    from tallow.config import TallowConfig
    from tallow.plugin.manager import PluginManager

log = logging.getLogger("tallow.server")

_MAX_NAME = 64


@dataclass(frozen=True)
class ProvidedTool:
    """A provider's tool as the model sees it: ``name`` (unique over all providers), the
    ``provider`` offering it, the provider's own name for it and its OpenAI definition."""

    name: str
    provider: str
    original: str
    definition: dict[str, Any]


@dataclass
class _Slot:
    name: str
    distribution: str
    provider: ToolProvider | None
    error: str = ""


class ToolProviders:
    """The server's tool providers and the catalog of their tools (see the module docstring)."""

    def __init__(self, slots: list[_Slot] | None = None) -> None:
        self._slots = slots or []
        self._catalog: dict[str, ProvidedTool] = {}
        self._stale = True
        self._lock = asyncio.Lock()

    @classmethod
    def from_plugins(
        cls, plugin_manager: PluginManager | None, config: TallowConfig | None
    ) -> "ToolProviders":
        """One instance of every provider registered in ``plugin_manager`` that has something to
        offer under ``config``. Invalid settings stop start-up (:class:`PluginSettingsError`);
        a provider that fails otherwise is reported by :meth:`describe` and left out."""
        registry = getattr(getattr(plugin_manager, "registries", None), "tool_providers", None)
        slots: list[_Slot] = []
        for entry in registry.by_priority() if registry is not None else []:
            try:
                provider = entry.load().from_config(config)
            except PluginSettingsError:
                raise
            except Exception as exc:
                log.error(
                    "tool provider %r from %s cannot be set up: %s: %s",
                    entry.name,
                    entry.distribution,
                    type(exc).__name__,
                    exc,
                )
                slots.append(
                    _Slot(entry.name, entry.distribution, None, f"{type(exc).__name__}: {exc}")
                )
                continue
            if provider is not None:
                slots.append(_Slot(entry.name, entry.distribution, provider))
        return cls(slots)

    @classmethod
    def of(cls, providers: dict[str, ToolProvider]) -> "ToolProviders":
        """Exactly ``providers`` (name → instance), in order: for embedding and tests."""
        return cls([_Slot(name, "<direct>", p) for name, p in providers.items()])

    @property
    def active(self) -> bool:
        """True when at least one provider is running (or trying to)."""
        return any(slot.provider is not None for slot in self._slots)

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        """Start every provider, concurrently; one that raises is reported and left out."""

        async def start_one(slot: _Slot) -> None:
            assert slot.provider is not None
            slot.provider.on_tools_changed(self._changed)
            try:
                await slot.provider.start()
            except Exception as exc:
                log.error(
                    "tool provider %r from %s failed to start: %s: %s",
                    slot.name,
                    slot.distribution,
                    type(exc).__name__,
                    exc,
                )
                slot.error = f"failed to start: {type(exc).__name__}: {exc}"
                slot.provider = None

        await asyncio.gather(*(start_one(s) for s in self._slots if s.provider is not None))
        self._stale = True
        tools = await self.tools()
        log.info("server tools: %s", ", ".join(sorted(tools)) or "none")

    async def stop(self) -> None:
        for slot in self._slots:
            if slot.provider is None:
                continue
            try:
                await slot.provider.stop()
            except Exception:
                log.exception("tool provider %r raised while stopping", slot.name)

    def _changed(self) -> None:
        self._stale = True

    # -- the catalog ----------------------------------------------------------------------
    async def tools(self) -> dict[str, ProvidedTool]:
        """Every provided tool by the name the model sees, rebuilt after a change."""
        if not self._stale:
            return self._catalog
        async with self._lock:
            if self._stale:
                self._stale = False  # a change during the rebuild marks it stale again
                self._catalog = await self._build()
        return self._catalog

    async def _build(self) -> dict[str, ProvidedTool]:
        catalog: dict[str, ProvidedTool] = {}
        for slot in self._slots:
            if slot.provider is None:
                continue
            try:
                offered = await slot.provider.list_tools()
            except Exception as exc:
                log.warning(
                    "tool provider %r could not list its tools: %s: %s",
                    slot.name,
                    type(exc).__name__,
                    exc,
                )
                continue
            for definition in offered:
                tool = _checked(slot.name, definition)
                if tool is None:
                    continue
                name = tool_name(tool)
                if name in catalog:
                    name = f"{slot.name}__{name}"[:_MAX_NAME]
                    if name in catalog:
                        log.warning(
                            "tool %r of provider %r clashes with another tool and is left out",
                            tool_name(tool),
                            slot.name,
                        )
                        continue
                exposed = {"type": "function", "function": {**tool["function"], "name": name}}
                catalog[name] = ProvidedTool(name, slot.name, tool_name(tool), exposed)
        return catalog

    async def call(self, tool: ProvidedTool, arguments: dict[str, Any]) -> ToolResult:
        """Run ``tool``; whatever the provider raises becomes an error result."""
        slot = next((s for s in self._slots if s.name == tool.provider), None)
        if slot is None or slot.provider is None:
            return ToolResult(f"the tool provider {tool.provider!r} is not running", True)
        try:
            result = await slot.provider.call_tool(tool.original, arguments)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning(
                "tool %r of provider %r raised: %s: %s",
                tool.original,
                tool.provider,
                type(exc).__name__,
                exc,
            )
            return ToolResult(f"the tool failed: {type(exc).__name__}: {exc}", True)
        if isinstance(result, str):
            return ToolResult(result)
        if not isinstance(result, ToolResult):
            return ToolResult(
                f"the tool provider returned {type(result).__name__}, not a result", True
            )
        return result

    # -- reporting ------------------------------------------------------------------------
    def statuses(self) -> list[dict[str, object]]:
        """Each provider's name, distribution and own status (for ``/v1/plugins``)."""
        out = []
        for slot in self._slots:
            status: dict[str, object] = {}
            if slot.provider is not None:
                try:
                    status = dict(slot.provider.status())
                except Exception as exc:
                    status = {"error": f"status failed: {type(exc).__name__}: {exc}"}
            entry: dict[str, object] = {
                "name": slot.name,
                "distribution": slot.distribution,
                "running": slot.provider is not None,
                "status": status,
            }
            if slot.error:
                entry["error"] = slot.error
            out.append(entry)
        return out

    async def describe(self) -> list[dict[str, object]]:
        """:meth:`statuses` with the tools of each provider (for ``/v1/tools``)."""
        tools = await self.tools()
        out = self.statuses()
        for entry in out:
            entry["tools"] = [t.definition for t in tools.values() if t.provider == entry["name"]]
        return out


def check_tool_providers(
    plugin_manager: PluginManager | None, config: TallowConfig | None
) -> list[dict[str, object]]:
    """Start every tool provider for ``config``, describe each with its tools, stop them:
    what ``tallow plugins list --check-tools`` shows. Runs its own event loop."""

    async def check() -> list[dict[str, object]]:
        providers = ToolProviders.from_plugins(plugin_manager, config)
        await providers.start()
        try:
            return await providers.describe()
        finally:
            await providers.stop()

    return asyncio.run(check())


def _checked(provider: str, definition: object) -> dict[str, Any] | None:
    """``definition`` if it is a valid OpenAI tool definition, else None (logged)."""
    try:
        (tool,) = validate_tools([definition])
        return tool
    except APIError as exc:
        log.warning("tool provider %r offers an invalid tool, left out: %s", provider, exc.message)
    return None
