"""The settings of ``plugins.settings.tallow-mcp-client``: the MCP servers and the limits of each.

```yaml
plugins:
  settings:
    tallow-mcp-client:
      servers:
        time:                                  # stdio: a subprocess speaking MCP on stdin/stdout
          command: mcp-server-time
          args: ["--local-timezone", "Europe/Paris"]
          env: {TZ: Europe/Paris}              # added to a minimal environment (PATH, HOME, ...)
          call_timeout: 10
        docs:                                  # streamable HTTP
          url: https://mcp.example.com/mcp
          headers: {Authorization: "Bearer ..."}
          allow: ["search_*"]                  # only tools matching these globs
          deny: ["search_admin"]
          max_result_chars: 20000
          max_concurrent_calls: 2
```
"""

from __future__ import annotations

import re
from typing import Optional
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_SERVER_NAME = re.compile(r"^[A-Za-z0-9_-]{1,32}$")


class ServerSettings(BaseModel):
    """One MCP server: either ``command`` (stdio) or ``url`` (streamable HTTP)."""

    model_config = ConfigDict(extra="forbid")

    command: Optional[str] = Field(
        None,
        min_length=1,
        description="Program started as a subprocess that speaks MCP on stdin/stdout.",
    )
    args: list[str] = Field(default_factory=list, description="Its arguments.")
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Variables added to the minimal environment the subprocess gets.",
    )
    cwd: Optional[str] = Field(None, description="Its working directory.")
    url: Optional[str] = Field(None, description="Endpoint of a streamable-HTTP MCP server.")
    headers: dict[str, str] = Field(
        default_factory=dict,
        description="HTTP headers sent with every request (authorization, say).",
    )
    allow: Optional[list[str]] = Field(
        None,
        description="Tool names (shell-style globs) offered to the model; None offers every tool.",
    )
    deny: list[str] = Field(
        default_factory=list, description="Tool names (globs) never offered, even when allowed."
    )
    call_timeout: float = Field(
        60.0, gt=0, description="Seconds one call may take, waiting for a free slot included."
    )
    connect_timeout: float = Field(
        30.0, gt=0, description="Seconds to start, initialize and list the tools of the server."
    )
    max_result_chars: int = Field(
        65536,
        gt=0,
        description="Largest result (in characters of "
        "text) handed to the model; a larger one is an error result.",
    )
    max_concurrent_calls: int = Field(8, gt=0, description="Calls in flight at once; more wait.")
    retry_interval: float = Field(
        1.0,
        gt=0,
        description="Seconds before reconnecting to a "
        "server that is down; doubled after each failure.",
    )
    max_retry_interval: float = Field(
        60.0, gt=0, description="Longest wait between two reconnection attempts."
    )
    enabled: bool = Field(True, description="False keeps the server configured but unused.")

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: Optional[str]) -> Optional[str]:
        if value is not None:
            parts = urlsplit(value)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ValueError("expected an http:// or https:// URL")
        return value

    @model_validator(mode="after")
    def _one_transport(self) -> "ServerSettings":
        if (self.command is None) == (self.url is None):
            raise ValueError(
                "give exactly one of 'command' (a stdio server) or 'url' (a streamable-HTTP server)"
            )
        if self.url is not None and (self.args or self.env or self.cwd is not None):
            raise ValueError(
                "'args', 'env' and 'cwd' belong to a stdio server ('command'), "
                "not to one reached by 'url'"
            )
        if self.command is not None and self.headers:
            raise ValueError(
                "'headers' belong to a streamable-HTTP server ('url'), not to "
                "one started by 'command'"
            )
        return self

    @property
    def transport(self) -> str:
        return "stdio" if self.command is not None else "streamable-http"


class MCPSettings(BaseModel):
    """``plugins.settings.tallow-mcp-client``: the servers, by name."""

    model_config = ConfigDict(extra="forbid")

    servers: dict[str, ServerSettings] = Field(default_factory=dict)

    @field_validator("servers")
    @classmethod
    def _names(cls, value: dict[str, ServerSettings]) -> dict[str, ServerSettings]:
        for name in value:
            if not _SERVER_NAME.match(name):
                raise ValueError(
                    f"server name {name!r}: expected 1-32 characters of a-z, A-Z, "
                    "0-9, '_' or '-' (it prefixes tool names on clashes)"
                )
        return value
