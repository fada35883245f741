"""tallow-mcp-client: the tools of MCP servers, offered to the model and run by tallow itself."""

__version__ = "0.1.0"
