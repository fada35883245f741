"""Helpers of tallow-mcp-client's tests: real MCP servers (``mcp-server-time`` and ``mcp-server-git``
from PyPI, and ``sdk_server.py`` written with the official SDK) and providers configured for
them."""

from __future__ import annotations

import pathlib
import socket
import subprocess
import sys
import time
from typing import Any

HERE = pathlib.Path(__file__).parent
SDK_SERVER = str(HERE / "sdk_server.py")

#: the real time server from PyPI, over stdio
TIME = {"command": sys.executable, "args": ["-m", "mcp_server_time"]}
#: the SDK-written test server, over stdio
SDK_STDIO = {"command": sys.executable, "args": [SDK_SERVER, "stdio"]}


def settings_config(servers: dict[str, Any]) -> Any:
    """A validated tallow config whose tallow-mcp-client settings hold ``servers``."""
    from tallow.plugin.testing import make_config

    return make_config({"plugins": {"settings": {"tallow-mcp-client": {"servers": servers}}}})


def provider_for(servers: dict[str, Any]) -> Any:
    from tallow_mcp_client.provider import MCPToolProvider

    provider = MCPToolProvider.from_config(settings_config(servers))
    assert provider is not None
    return provider


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HttpServer:
    """``sdk_server.py`` over streamable HTTP on loopback, in a subprocess that tests may kill
    and start again on the same port."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> "HttpServer":
        self.proc = subprocess.Popen([sys.executable, SDK_SERVER, "http", str(self.port)])
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the test MCP server did not start") from None
                time.sleep(0.05)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
