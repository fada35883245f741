"""A client that disconnects cancels the MCP tool call its request is waiting on, at the MCP
server: the server built with the official ``mcp`` SDK (``sdk_server.py`` of tallow-mcp-client's
tests) records the cancellation its ``sleep`` tool receives. The model is scripted (the fake
engine over the Qwen2.5 template and the hermes parser); the provider is the real tallow-mcp-client
over stdio."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from server_fakes import FakeEngine
from server_helpers import LiveServer, httpx, make_config

pytest.importorskip("tallow_mcp_client", reason="tallow-mcp-client provides the MCP client")

SDK_SERVER = str(
    Path(__file__).parents[2] / "plugins" / "mcp" / "client" / "tests" / "sdk_server.py"
)
MSG = [{"role": "user", "content": "Sleep a minute."}]
CALL = '<tool_call>\n{"name": "sleep", "arguments": {"seconds": 60}}\n</tool_call>'


@pytest.fixture
def mcp_loop(plugin_manager: Any, tmp_path: Path) -> Iterator[tuple[LiveServer, Path]]:
    from tallow.plugin.testing import make_config as plugin_config
    from tallow.server.app import build_app
    from tallow.server.tool_providers import ToolProviders
    from tallow_mcp_client.provider import MCPToolProvider

    mark = tmp_path / "cancelled"
    provider = MCPToolProvider.from_config(
        plugin_config(
            {
                "plugins": {
                    "settings": {
                        "tallow-mcp-client": {
                            "servers": {
                                "sdk": {
                                    "command": sys.executable,
                                    "args": [SDK_SERVER, "stdio"],
                                    "env": {"SDK_SERVER_CANCEL_MARK": str(mark)},
                                    "allow": ["sleep"],
                                }
                            }
                        }
                    }
                }
            }
        )
    )
    engine = FakeEngine(
        lambda prompt, params, i: CALL, step_delay=0.01, plugin_manager=plugin_manager
    )
    app = build_app(
        engine,
        make_config(server_tools="always"),
        tool_providers=ToolProviders.of({"mcp": provider}),
    )
    with LiveServer(app) as srv:
        deadline = time.monotonic() + 60
        while "sleep" not in httpx.get(srv.url + "/v1/tools").text:
            assert time.monotonic() < deadline, "the MCP server did not come up"
            time.sleep(0.1)
        yield srv, mark


async def _leave_once_called(url: str, stream: bool) -> None:
    """Send the chat, and drop the connection once the server runs the call (a stream: its
    call-started delta; a whole response: a moment after the request went out)."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        body = {"messages": MSG, "stream": stream}
        if stream:
            async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
                assert resp.status_code == 200
                async for line in resp.aiter_lines():
                    if "server_tool_calls" in line:
                        await asyncio.sleep(0.5)  # the call reaches the MCP server
                        return
        else:
            with pytest.raises(httpx.TimeoutException):
                await client.post("/v1/chat/completions", json=body, timeout=3)


def _wait_for(mark: Path, timeout: float = 20) -> str:
    deadline = time.monotonic() + timeout
    while not mark.exists():
        assert time.monotonic() < deadline, "the MCP server never saw the call cancelled"
        time.sleep(0.05)
    return mark.read_text()


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_a_disconnect_cancels_the_mcp_call_at_the_server(mcp_loop, stream: bool) -> None:
    srv, mark = mcp_loop
    asyncio.run(_leave_once_called(srv.url, stream))
    assert _wait_for(mark).startswith("cancelled")
    health = httpx.get(srv.url + "/health").json()
    assert health["server_inflight"] == 0 and health["num_running"] == 0
    # the connection to the MCP server still serves the next request's call
    mark.unlink()
    asyncio.run(_leave_once_called(srv.url, True))
    assert _wait_for(mark).startswith("cancelled")
