"""Tools the server runs itself: ``current_time`` (in an IANA time zone) and ``add``.

Settings (``plugins.settings.{{ cookiecutter.project_slug }}``): ``enabled`` (default true).
"""

from __future__ import annotations

import datetime
import zoneinfo
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from tallow.plugin import ToolProvider, ToolResult, plugin_settings

DISTRIBUTION = "{{ cookiecutter.project_slug }}"

TOOLS = [
    {"type": "function", "function": {
        "name": "current_time", "description": "The current date and time in a time zone.",
        "parameters": {"type": "object", "properties": {
            "timezone": {"type": "string", "description": "IANA name, e.g. Europe/Paris"}},
            "required": ["timezone"]}}},
    {"type": "function", "function": {
        "name": "add", "description": "The sum of two numbers.",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}},
]


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    enabled: bool = True


class ClockToolProvider(ToolProvider):
    name: ClassVar[str] = "{{ cookiecutter.component_name }}"

    def __init__(self) -> None:
        self.calls = 0

    @classmethod
    def from_config(cls, config: Any) -> "ClockToolProvider | None":
        return cls() if plugin_settings(Settings, config, DISTRIBUTION).enabled else None

    async def list_tools(self) -> list[dict[str, Any]]:
        return TOOLS

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        self.calls += 1
        try:
            if name == "current_time":
                zone = zoneinfo.ZoneInfo(str(arguments["timezone"]))
                return ToolResult(datetime.datetime.now(zone).isoformat())
            if name == "add":
                return ToolResult(str(float(arguments["a"]) + float(arguments["b"])))
        except (KeyError, ValueError, TypeError, zoneinfo.ZoneInfoNotFoundError) as exc:
            return ToolResult(f"{name}: bad arguments {arguments!r}: {exc!r}", is_error=True)
        return ToolResult(f"unknown tool {name!r}", is_error=True)

    def status(self) -> dict[str, Any]:
        return {"sources": [{"name": "clock", "state": "up", "tools": len(TOOLS),
                             "calls": self.calls}]}
