"""Registration of the MCP tool provider (imports neither the SDK nor torch)."""

from __future__ import annotations

from tallow.plugin import hookimpl, plugin_settings

DISTRIBUTION = "tallow-mcp-client"


@hookimpl
def tallow_configure(config) -> None:
    # Bad settings stop start-up here, naming the key, before any model is loaded.
    from .settings import MCPSettings

    plugin_settings(MCPSettings, config, DISTRIBUTION)


@hookimpl
def tallow_register_tool_providers(registry) -> None:
    registry.register("mcp", "tallow_mcp_client.provider:MCPToolProvider")
