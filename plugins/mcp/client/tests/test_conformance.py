"""The MCP tool provider against tallow's tool-provider conformance suite, on the real
``mcp-server-time`` from PyPI over stdio."""

from __future__ import annotations

import pytest
from mcp_fixtures import TIME

from tallow.plugin.testing import ToolProviderConformance

pytestmark = pytest.mark.timeout(120)


class TestMCPConformance(ToolProviderConformance):
    distribution = "tallow-mcp-client"
    component = "mcp"
    light_modules = ("torch", "mcp")
    settings = {"servers": {"time": TIME}}
    sample_call = ("get_current_time", {"timezone": "Asia/Tokyo"})
