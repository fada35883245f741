"""An MCP server written with the official SDK, for the tests: tools that sleep, fail, return
too much, report their process and add a tool (announcing ``tools/list_changed``).

    python sdk_server.py stdio
    python sdk_server.py http PORT        # streamable HTTP on 127.0.0.1:PORT/mcp
"""

from __future__ import annotations

import asyncio
import os
import sys

from mcp.server.mcpserver import Context, MCPServer

app = MCPServer("tallow-test-server")


@app.tool()
def echo(text: str) -> str:
    """Return ``text`` unchanged."""
    return text


@app.tool()
async def sleep(seconds: float) -> str:
    """Sleep for ``seconds``, then say so."""
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        # the client cancelled the call: leave a mark the tests can read
        mark = os.environ.get("SDK_SERVER_CANCEL_MARK")
        if mark:
            with open(mark, "w") as f:
                f.write(f"cancelled after sleeping less than {seconds} s")
        raise
    return f"slept {seconds} s"


@app.tool()
def big(size: int) -> str:
    """Return ``size`` characters."""
    return "x" * size


@app.tool()
def pid() -> int:
    """The process id of this server."""
    return os.getpid()


@app.tool()
def fail(why: str) -> str:
    """Raise an error saying ``why``."""
    raise ValueError(why)


@app.tool()
def secret() -> str:
    """Something an allow-list should keep from the model."""
    return "the secret"


@app.tool(name="dotted.name")
def dotted() -> str:
    """A tool whose name OpenAI function names do not allow."""
    return "dotted"


@app.tool()
def header(name: str, ctx: Context) -> str:
    """The value of HTTP request header ``name`` (empty over stdio)."""
    request = ctx.request_context.request
    headers = getattr(request, "headers", None) or {}
    return headers.get(name, "")


@app.tool()
async def add_tool(name: str, ctx: Context) -> str:
    """Add a tool called ``name`` and announce the new list."""
    app.add_tool(lambda: f"I am {name}", name=name, description=f"the {name} tool")
    await ctx.session.send_tool_list_changed()
    return f"added {name}"


if __name__ == "__main__":
    if sys.argv[1] == "stdio":
        app.run()
    else:
        import uvicorn

        uvicorn.run(
            app.streamable_http_app(), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning"
        )
