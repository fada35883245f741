"""The MCP tool provider against real MCP servers: ``mcp-server-time`` and ``mcp-server-git``
from PyPI over stdio, and a server written with the official SDK over stdio and over
streamable HTTP on loopback."""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import signal
import time
import zoneinfo
from typing import Any

import pytest
from mcp_fixtures import SDK_STDIO, TIME, HttpServer, provider_for

from tallow.plugin import ToolResult

pytestmark = pytest.mark.timeout(120)


def names(definitions: list[dict[str, Any]]) -> list[str]:
    return [d["function"]["name"] for d in definitions]


async def started(servers: dict[str, Any]) -> Any:
    provider = provider_for(servers)
    await provider.start()
    return provider


async def wait_for(predicate: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


def state_of(provider: Any, server: str) -> dict[str, Any]:
    (status,) = [s for s in provider.status()["sources"] if s["name"] == server]
    return status


def test_time_server() -> None:
    async def scenario() -> None:
        provider = await started({"time": TIME})
        try:
            tools = await provider.list_tools()
            assert names(tools) == ["get_current_time", "convert_time"]
            schema = tools[0]["function"]["parameters"]
            assert schema["required"] == ["timezone"] and tools[0]["function"]["description"]
            result = await provider.call_tool("get_current_time", {"timezone": "Asia/Tokyo"})
            assert not result.is_error
            answer = json.loads(result.content)
            reported = datetime.datetime.fromisoformat(answer["datetime"])
            now = datetime.datetime.now(zoneinfo.ZoneInfo("Asia/Tokyo"))
            assert answer["timezone"] == "Asia/Tokyo" and reported.utcoffset() == now.utcoffset()
            assert abs((now - reported).total_seconds()) < 120
            bad = await provider.call_tool("get_current_time", {"timezone": "Nowhere/Never"})
            assert bad.is_error and "Nowhere/Never" in bad.content
            assert state_of(provider, "time")["state"] == "up"
        finally:
            await provider.stop()
        assert state_of(provider, "time")["state"] == "stopped"

    asyncio.run(scenario())


def test_git_server_with_allow_and_deny_lists(git_repo) -> None:
    git = {
        "command": os.environ.get("PYTHON", __import__("sys").executable),
        "args": ["-m", "mcp_server_git", "--repository", str(git_repo)],
    }

    async def scenario() -> None:
        provider = await started(
            {
                "git": {
                    **git,
                    "allow": ["git_status", "git_log", "git_diff*"],
                    "deny": ["git_diff_staged"],
                }
            }
        )
        try:
            offered = names(await provider.list_tools())
            assert sorted(offered) == ["git_diff", "git_diff_unstaged", "git_log", "git_status"]
            log = await provider.call_tool("git_log", {"repo_path": str(git_repo)})
            assert not log.is_error and "Add the greeting file" in log.content
            status = await provider.call_tool("git_status", {"repo_path": str(git_repo)})
            assert "hello.txt" in status.content
            # a tool the lists keep out cannot be called, even by its server's own name
            denied = await provider.call_tool(
                "git_commit", {"repo_path": str(git_repo), "message": "sneaky"}
            )
            assert denied.is_error and "git_commit" in denied.content
        finally:
            await provider.stop()

    asyncio.run(scenario())


def test_http_server_calls_limits_and_list_changes(http_server: HttpServer) -> None:
    changes: list[int] = []

    async def scenario() -> None:
        provider = provider_for(
            {
                "sdk": {
                    "url": http_server.url,
                    "headers": {"X-Tallow-Test": "sent"},
                    "deny": ["secret"],
                    "call_timeout": 1.0,
                    "max_result_chars": 1000,
                    "max_concurrent_calls": 1,
                }
            }
        )
        provider.on_tools_changed(lambda: changes.append(1))
        await provider.start()
        try:
            offered = names(await provider.list_tools())
            assert "secret" not in offered and "echo" in offered
            assert "dotted_name" in offered  # made a valid function name
            assert await provider.call_tool("echo", {"text": "héllo"}) == ToolResult("héllo")
            assert await provider.call_tool("dotted_name", {}) == ToolResult("dotted")
            assert (await provider.call_tool("header", {"name": "x-tallow-test"})).content == "sent"
            # a timeout, an oversize result: error results, never exceptions
            begun = time.monotonic()
            slow = await provider.call_tool("sleep", {"seconds": 30})
            assert slow.is_error and "call_timeout" in slow.content
            assert time.monotonic() - begun < 5
            huge = await provider.call_tool("big", {"size": 5000})
            assert huge.is_error and "5000 characters" in huge.content
            assert await provider.call_tool("big", {"size": 1000}) == ToolResult("x" * 1000)
            # one call at a time: the second waits for the first
            begun = time.monotonic()
            both = await asyncio.gather(
                provider.call_tool("sleep", {"seconds": 0.4}),
                provider.call_tool("sleep", {"seconds": 0.4}),
            )
            assert [r.is_error for r in both] == [False, False]
            assert time.monotonic() - begun >= 0.8
            # the server announces a new tool: the list is refreshed and watchers told
            seen = len(changes)
            await provider.call_tool("add_tool", {"name": "fresh"})
            await wait_for(lambda: len(changes) > seen)
            assert "fresh" in names(await provider.list_tools())
            assert await provider.call_tool("fresh", {}) == ToolResult("I am fresh")
        finally:
            await provider.stop()

    asyncio.run(scenario())


def test_clashing_names_are_namespaced_by_server() -> None:
    async def scenario() -> None:
        provider = await started({"a": TIME, "b": TIME, "sdk": SDK_STDIO})
        try:
            offered = names(await provider.list_tools())
            assert {
                "a__get_current_time",
                "b__get_current_time",
                "a__convert_time",
                "b__convert_time",
                "echo",
            } <= set(offered)
            assert "get_current_time" not in offered
            result = await provider.call_tool("b__get_current_time", {"timezone": "UTC"})
            assert json.loads(result.content)["timezone"] == "UTC"
        finally:
            await provider.stop()

    asyncio.run(scenario())


def test_stdio_server_killed_mid_call_is_restarted() -> None:
    async def scenario() -> None:
        provider = await started({"sdk": {**SDK_STDIO, "retry_interval": 0.2}})
        try:
            failed = await provider.call_tool("fail", {"why": "on purpose"})
            assert failed.is_error and "fail" in failed.content
            first_pid = int((await provider.call_tool("pid", {})).content)
            call = asyncio.ensure_future(provider.call_tool("sleep", {"seconds": 60}))
            await asyncio.sleep(0.5)
            os.kill(first_pid, signal.SIGKILL)
            result = await asyncio.wait_for(call, 10)
            assert result.is_error and "went away" in result.content
            await wait_for(
                lambda: (
                    state_of(provider, "sdk")["connects"] == 2
                    and state_of(provider, "sdk")["state"] == "up"
                )
            )
            second_pid = int((await provider.call_tool("pid", {})).content)
            assert second_pid != first_pid
        finally:
            await provider.stop()

    asyncio.run(scenario())


def test_http_server_down_at_start_and_killed_mid_call() -> None:
    server = HttpServer()  # not started: nothing listens on its port yet

    async def scenario() -> None:
        provider = provider_for(
            {
                "sdk": {
                    "url": server.url,
                    "retry_interval": 0.2,
                    "max_retry_interval": 0.5,
                    "connect_timeout": 5,
                },
                "time": TIME,
                "ghost": {"command": "/nonexistent/server"},
            }
        )
        begun = time.monotonic()
        await provider.start()  # reports, does not raise or hang
        assert time.monotonic() - begun < 30
        assert state_of(provider, "sdk")["state"] == "down" and state_of(provider, "sdk")["error"]
        assert "nonexistent" in state_of(provider, "ghost")["error"]
        assert state_of(provider, "time")["state"] == "up"
        assert names(await provider.list_tools()) == ["get_current_time", "convert_time"]
        try:
            server.start()  # retried in the background: the server comes up
            await wait_for(lambda: state_of(provider, "sdk")["state"] == "up")
            assert "echo" in names(await provider.list_tools())
            call = asyncio.ensure_future(provider.call_tool("sleep", {"seconds": 60}))
            await asyncio.sleep(0.5)
            server.kill()
            result = await asyncio.wait_for(call, 30)
            assert result.is_error
            await wait_for(lambda: state_of(provider, "sdk")["state"] == "down")
            down = await provider.call_tool("echo", {"text": "anyone?"})
            assert down.is_error and "not connected" in down.content
            server.start()
            await wait_for(lambda: state_of(provider, "sdk")["state"] == "up")
            assert await provider.call_tool("echo", {"text": "back"}) == ToolResult("back")
        finally:
            await provider.stop()
            server.kill()

    asyncio.run(scenario())


def test_a_cancelled_call_is_cancelled_at_the_server(tmp_path) -> None:
    mark = tmp_path / "cancelled"

    async def scenario() -> None:
        provider = await started(
            {"sdk": {**SDK_STDIO, "env": {"SDK_SERVER_CANCEL_MARK": str(mark)}}}
        )
        try:
            call = asyncio.ensure_future(provider.call_tool("sleep", {"seconds": 60}))
            await asyncio.sleep(1.0)
            call.cancel()  # what a client that disconnects does to the tool loop's call
            with pytest.raises(asyncio.CancelledError):
                await call
            await wait_for(mark.exists)
            assert mark.read_text().startswith("cancelled")
            # the connection is still good for the next call
            assert await provider.call_tool("echo", {"text": "still here"}) == ToolResult(
                "still here"
            )
        finally:
            await provider.stop()

    asyncio.run(scenario())
