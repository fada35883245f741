"""The tool-provider suite: the :class:`~tallow.plugin.ToolProvider` contract's basic
behaviour — built from its settings, started, its tools listed as valid OpenAI definitions, a
call answered, failures returned as error results (never raised), status JSON-able, stopped.

::

    class TestMyProvider(ToolProviderConformance):
        distribution = "tallow-mytools"
        component = "mytools"
        settings = {"servers": {...}}          # plugins.settings.<distribution>
        sample_call = ("get_time", {"timezone": "UTC"})

Each test runs its own event loop (``asyncio.run``) around ``start`` ... ``stop``.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import TYPE_CHECKING, Any, Awaitable, Callable, ClassVar

from ..components import ToolProvider, ToolResult, check_tool_provider_status
from ..json_schema import check_schema
from . import make_config
from .component import ComponentConformance

if TYPE_CHECKING:
    from tallow.config import TallowConfig

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class ToolProviderConformance(ComponentConformance):
    registry_kind = "tool_providers"
    base_class = ToolProvider

    #: the plugin's settings (``plugins.settings.<distribution>``) the provider is built from
    settings: ClassVar[dict[str, Any]] = {}
    #: (tool name, arguments) of a call that succeeds
    sample_call: ClassVar[tuple[str, dict[str, Any]]] = ("", {})

    def config(self) -> TallowConfig:
        return make_config({"plugins": {"settings": {self.distribution: self.settings}}})

    def run(
        self,
        component_class: type[ToolProvider],
        scenario: Callable[[ToolProvider], Awaitable[None]],
    ) -> None:
        """Build the provider from :attr:`settings`, start it, run ``scenario(provider)``,
        stop it."""

        async def main() -> None:
            provider = component_class.from_config(self.config())
            assert provider is not None, f"from_config gave None for settings {self.settings}"
            await provider.start()
            try:
                await scenario(provider)
            finally:
                await provider.stop()

        asyncio.run(main())

    def test_lists_valid_tool_definitions(self, component_class: type[ToolProvider]) -> None:
        async def scenario(provider: ToolProvider) -> None:
            tools = await provider.list_tools()
            assert isinstance(tools, list) and tools, "no tools listed"
            names = []
            for tool in tools:
                assert tool.get("type") == "function", tool
                function = tool["function"]
                assert NAME.match(function["name"]), f"bad tool name {function['name']!r}"
                assert isinstance(function.get("parameters"), dict), function
                check_schema(function["parameters"])
                names.append(function["name"])
            assert len(names) == len(set(names)), f"duplicate tool names: {names}"
            assert self.sample_call[0] in names

        self.run(component_class, scenario)

    def test_a_call_returns_a_result(self, component_class: type[ToolProvider]) -> None:
        async def scenario(provider: ToolProvider) -> None:
            result = await provider.call_tool(*self.sample_call)
            assert isinstance(result, ToolResult) and isinstance(result.content, str)
            assert not result.is_error, result.content

        self.run(component_class, scenario)

    def test_failures_are_error_results(self, component_class: type[ToolProvider]) -> None:
        async def scenario(provider: ToolProvider) -> None:
            unknown = await provider.call_tool("no_such_tool_here", {})
            assert isinstance(unknown, ToolResult) and unknown.is_error and unknown.content
            name = self.sample_call[0]
            bad = await provider.call_tool(name, {"not_an_argument": [object.__name__]})
            assert isinstance(bad, ToolResult)

        self.run(component_class, scenario)

    def test_status_is_json(self, component_class: type[ToolProvider]) -> None:
        async def scenario(provider: ToolProvider) -> None:
            status = provider.status()
            json.dumps(status)
            problems = check_tool_provider_status(status)
            assert not problems, "status() breaks its contract: " + "; ".join(problems)

        self.run(component_class, scenario)

    def test_nothing_configured(self, component_class: type[ToolProvider]) -> None:
        provider = component_class.from_config(make_config({}))
        assert provider is None or isinstance(provider, ToolProvider)
