"""The MCP tool provider: the tools of every configured MCP server, under one name space.

A tool keeps its own name unless two servers offer the same one; then each of them is offered
as ``<server>__<tool>``. A name that OpenAI's function names do not allow (dots, slashes, more
than 64 characters) is offered with those characters replaced by ``_`` and cut to 64.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import Counter
from typing import TYPE_CHECKING, Any, Callable

from tallow.plugin import ToolProvider, ToolResult, plugin_settings

from .plugin import DISTRIBUTION
from .settings import MCPSettings

if TYPE_CHECKING:  # pragma: no cover
    from .connection import ServerConnection

log = logging.getLogger("tallow.mcp")

_NOT_ALLOWED = re.compile(r"[^A-Za-z0-9_-]")


def _function_name(name: str) -> str:
    return _NOT_ALLOWED.sub("_", name)[:64] or "_"


class MCPToolProvider(ToolProvider):
    """Offers the tools of the MCP servers of ``plugins.settings.tallow-mcp-client.servers``."""

    name = "mcp"

    def __init__(self, settings: MCPSettings) -> None:
        # The SDK is imported only once a server is configured: a server without MCP
        # servers does not pay for it.
        from .connection import ServerConnection

        self.settings = settings
        self._callbacks: list[Callable[[], None]] = []
        self.connections = [
            ServerConnection(name, server, self._changed)
            for name, server in settings.servers.items()
            if server.enabled
        ]
        self._routes: dict[str, tuple[ServerConnection, str]] = {}

    @classmethod
    def from_config(cls, config: Any) -> "MCPToolProvider | None":
        settings = plugin_settings(MCPSettings, config, DISTRIBUTION)
        if not any(server.enabled for server in settings.servers.values()):
            return None
        return cls(settings)

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        for connection in self.connections:
            connection.start()
        # Wait for each first attempt, bounded: a server that neither connects nor fails in
        # time is reported as still connecting, and the server starts without its tools.
        waits = [
            asyncio.wait_for(c.first_attempt(), c.settings.connect_timeout + 5)
            for c in self.connections
        ]
        await asyncio.gather(*waits, return_exceptions=True)
        for c in self.connections:
            if c.state != "up":
                log.warning(
                    "MCP server %r is not available yet (%s): it is retried in the background",
                    c.name,
                    c.error or c.state,
                )

    async def stop(self) -> None:
        await asyncio.gather(*(c.stop() for c in self.connections), return_exceptions=True)

    def on_tools_changed(self, callback: Callable[[], None]) -> None:
        self._callbacks.append(callback)

    def _changed(self) -> None:
        for callback in self._callbacks:
            callback()

    # -- tools ----------------------------------------------------------------------------
    async def list_tools(self) -> list[dict[str, Any]]:
        offered = [(c, t) for c in self.connections if c.state == "up" for t in c.tools]
        counts = Counter(_function_name(t.name) for _, t in offered)
        routes: dict[str, tuple[ServerConnection, str]] = {}
        definitions = []
        for connection, tool in offered:
            name = _function_name(tool.name)
            if counts[name] > 1:
                name = _function_name(f"{connection.name}__{tool.name}")
            if name in routes:
                log.warning(
                    "MCP server %r: tool %r clashes with another one and is left out",
                    connection.name,
                    tool.name,
                )
                continue
            routes[name] = (connection, tool.name)
            function: dict[str, Any] = {
                "name": name,
                "parameters": tool.input_schema or {"type": "object", "properties": {}},
            }
            description = tool.description or tool.title or ""
            if description:
                function["description"] = description
            definitions.append({"type": "function", "function": function})
        self._routes = routes
        return definitions

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        route = self._routes.get(name)
        if route is None:  # names are given out by list_tools: ask it for the current ones
            await self.list_tools()
            route = self._routes.get(name)
        if route is None:
            return ToolResult(f"no MCP tool is named {name!r} (the servers' tools changed?)", True)
        connection, tool = route
        return await connection.call(tool, arguments)

    def status(self) -> dict[str, Any]:
        return {"sources": [c.status() for c in self.connections]}
