"""One MCP server: kept connected, its tools kept listed, its calls bounded.

A :class:`ServerConnection` runs one task for the life of the provider. The task opens the
transport (a subprocess over stdio, or streamable HTTP) and an SDK ``ClientSession``,
initializes it and lists the tools, then waits: for the server's
``notifications/tools/list_changed`` (it lists the tools again), for the connection to end (the
process died, the HTTP session went away), or for :meth:`stop`. When the connection ends or
cannot be made, the server is reported ``down`` with the reason and tried again after
``retry_interval`` seconds, doubling up to ``max_retry_interval``; a stdio server that died is
thereby restarted. Nothing a server does stops the engine.

The end of a connection is seen by relaying the transport's read stream to the session: when the
transport closes it (a stdio server exited), the relay ends and wakes the task. An HTTP server
that dies does not close the stream, its requests fail instead: a failed call or a transport
error makes the task ping the server, and a ping that fails ends the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import logging
import sys
import time
from typing import Any, Callable

import anyio
import anyio.abc
import mcp.types as types
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tallow.plugin import ToolResult

from . import __version__
from .content import result_text
from .settings import ServerSettings

log = logging.getLogger("tallow.mcp")

_MAX_PAGES = 100  # tools/list pages followed; a server that paginates forever cannot hang us


class ServerConnection:
    """The connection to one configured MCP server (see the module docstring).

    ``on_change()`` is called whenever :attr:`tools` may have changed: the server came up,
    went down, or announced a new list.
    """

    def __init__(self, name: str, settings: ServerSettings, on_change: Callable[[], None]) -> None:
        self.name = name
        self.settings = settings
        self.on_change = on_change
        self.state = "connecting"
        self.error = ""
        self.tools: list[types.Tool] = []
        self.connects = 0
        self.since = time.time()
        self._session: ClientSession | None = None
        self._slots = asyncio.Semaphore(settings.max_concurrent_calls)
        #: calls started and not yet ended (finished, failed or cancelled): 0 when idle
        self.calls_in_flight = 0
        self._wake = asyncio.Event()
        self._relist = False
        self._check = False  # whether to ping the server: something went wrong on the wire
        self._closed = False
        self._stopping = False
        self._tried = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: the connection's task group while it is up: calls run as its tasks
        self._calls: anyio.abc.TaskGroup | None = None

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def first_attempt(self) -> None:
        """Returns once the first connection attempt has succeeded or failed."""
        await self._tried.wait()

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        self._set_state("stopped", "")

    def _set_state(self, state: str, error: str) -> None:
        if state != self.state:
            self.since = time.time()
        self.state, self.error = state, error

    async def _run(self) -> None:
        delay = self.settings.retry_interval
        while not self._stopping:
            try:
                reason = await self._connect_and_serve()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any failure is reported, then retried
                reason = _describe(exc)
            was_up = self._session is not None
            self._session = None
            self.tools = []
            if self._stopping:
                break
            self._set_state("down", reason)
            self._tried.set()
            self.on_change()
            if was_up:
                delay = self.settings.retry_interval
            log.warning("MCP server %r is down (%s); retrying in %.1f s", self.name, reason, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.settings.max_retry_interval)

    async def _connect_and_serve(self) -> str:
        """Connect, then serve until the connection ends; returns why it ended."""
        self._closed = False
        self._relist = False
        self._check = False
        self._wake.clear()
        async with contextlib.AsyncExitStack() as stack:
            read, write = await stack.enter_async_context(self._transport(stack))
            relay_in, relay_out = anyio.create_memory_object_stream[Any](0)
            relays = await stack.enter_async_context(anyio.create_task_group())
            relays.start_soon(self._relay, read, relay_in)
            self._calls = relays
            session = await stack.enter_async_context(
                ClientSession(
                    relay_out,
                    write,
                    message_handler=self._on_message,
                    client_info=types.Implementation(name="tallow", version=__version__),
                )
            )
            with anyio.fail_after(self.settings.connect_timeout):
                await session.initialize()
                self.tools = await self._list(session)
            self._session = session
            self.connects += 1
            self._set_state("up", "")
            self._tried.set()
            log.info(
                "MCP server %r is up: %d tools (%s)",
                self.name,
                len(self.tools),
                ", ".join(t.name for t in self.tools) or "none",
            )
            self.on_change()
            try:
                reason = await self._serve(session)
            finally:
                self._calls = None
            relays.cancel_scope.cancel()
        return reason

    async def _serve(self, session: ClientSession) -> str:
        """Wait for list changes until the connection ends; returns why it ended."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._stopping:
                return "stopped"
            if self._closed:
                return "the connection closed (the server exited or went away)"
            if self._check:
                self._check = False
                try:
                    with anyio.fail_after(min(self.settings.connect_timeout, 10.0)):
                        await session.send_ping()
                except Exception as exc:
                    return f"the server stopped answering ({_describe(exc)})"
            if self._relist:
                self._relist = False
                try:
                    with anyio.fail_after(self.settings.connect_timeout):
                        self.tools = await self._list(session)
                except Exception as exc:  # keep the old list; the server may recover
                    log.warning(
                        "MCP server %r: listing its tools again failed: %s",
                        self.name,
                        _describe(exc),
                    )
                    continue
                log.info(
                    "MCP server %r changed its tools: %s",
                    self.name,
                    ", ".join(t.name for t in self.tools) or "none",
                )
                self.on_change()

    def _transport(self, stack: contextlib.AsyncExitStack) -> Any:
        s = self.settings
        if s.command is not None:
            params = StdioServerParameters(
                command=s.command, args=s.args, env=s.env or None, cwd=s.cwd
            )
            return stdio_client(params, errlog=sys.stderr)
        import httpx2

        client = httpx2.AsyncClient(
            headers=s.headers,
            timeout=httpx2.Timeout(s.connect_timeout, read=max(300.0, s.call_timeout)),
        )
        stack.push_async_callback(client.aclose)
        return streamable_http_client(s.url or "", http_client=client)

    async def _relay(self, source: Any, sink: Any) -> None:
        try:
            async with sink:
                async for item in source:
                    await sink.send(item)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass
        finally:
            self._closed = True
            self._wake.set()

    async def _on_message(self, message: Any) -> None:
        # Runs inside the session's receive loop: only note what to do, the task does it.
        if isinstance(message, types.ToolListChangedNotification):
            self._relist = True
            self._wake.set()
        elif isinstance(message, Exception):
            log.warning("MCP server %r: transport error: %s", self.name, _describe(message))
            self._suspect()

    def _suspect(self) -> None:
        """Have the task check that the server still answers (an HTTP server that died does
        not close the session: its requests just fail)."""
        self._check = True
        self._wake.set()

    async def _list(self, session: ClientSession) -> list[types.Tool]:
        tools: list[types.Tool] = []
        cursor = None
        for _ in range(_MAX_PAGES):
            params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
            page = await session.list_tools(params=params)
            tools += page.tools
            cursor = page.next_cursor
            if not cursor:
                break
        return [t for t in tools if self.offers(t.name)]

    def offers(self, tool: str) -> bool:
        """Whether the allow- and deny-lists let the model see ``tool``."""
        s = self.settings
        if s.allow is not None and not any(fnmatch.fnmatchcase(tool, p) for p in s.allow):
            return False
        return not any(fnmatch.fnmatchcase(tool, p) for p in s.deny)

    # -- calls ----------------------------------------------------------------------------
    async def call(self, tool: str, arguments: dict[str, Any]) -> ToolResult:
        """Run ``tool``; every failure is an error result (see ``ToolProvider.call_tool``)."""
        session = self._session
        if session is None or self.state != "up":
            return ToolResult(
                f"the MCP server {self.name!r} is not connected "
                f"({self.error or self.state}); it is being retried",
                True,
            )
        if not any(t.name == tool for t in self.tools):
            return ToolResult(f"the MCP server {self.name!r} offers no tool {tool!r}", True)
        group = self._calls
        if group is None:
            return ToolResult(
                f"the MCP server {self.name!r} is not connected; it is being retried", True
            )
        # The call runs as a task of the connection, not of the caller: a caller that is
        # cancelled (its client went away) cancels the call's own scope once, and the SDK then
        # sends notifications/cancelled to the server from a task that nothing else cancels.
        # Awaited in the caller's task, the SDK's courtesy write would be cut short by the
        # cancellation of the caller's request scope.
        done: asyncio.Future[ToolResult] = asyncio.get_running_loop().create_future()
        scope = anyio.CancelScope()
        group.start_soon(self._run_call, session, tool, arguments, scope, done)
        try:
            return await asyncio.shield(done)
        except asyncio.CancelledError:
            scope.cancel()
            raise

    async def _run_call(
        self,
        session: ClientSession,
        tool: str,
        arguments: dict[str, Any],
        scope: anyio.CancelScope,
        done: "asyncio.Future[ToolResult]",
    ) -> None:
        """A call, as a task of the connection; its outcome goes to ``done``."""
        result = ToolResult(f"the MCP server {self.name!r} went away during the call", True)
        self.calls_in_flight += 1
        try:
            with scope:
                result = await self._call_tool(session, tool, arguments)
        finally:
            self.calls_in_flight -= 1
            if not done.done():
                done.set_result(result)

    async def _call_tool(
        self, session: ClientSession, tool: str, arguments: dict[str, Any]
    ) -> ToolResult:
        s = self.settings
        try:
            with anyio.fail_after(s.call_timeout):
                async with self._slots:
                    result = await session.call_tool(tool, arguments)
        except TimeoutError:
            self._suspect()
            return ToolResult(
                f"the tool {tool!r} did not answer within {s.call_timeout:g} s (call_timeout)", True
            )
        except MCPError as exc:
            if exc.code != types.INVALID_PARAMS:
                self._suspect()
            if exc.code == types.CONNECTION_CLOSED:
                return ToolResult(
                    f"the MCP server {self.name!r} went away during the call; "
                    "it is being restarted",
                    True,
                )
            return ToolResult(f"the MCP server {self.name!r} refused the call: {exc}", True)
        except Exception as exc:
            self._suspect()
            return ToolResult(f"the call failed: {_describe(exc)}", True)
        text = result_text(result)
        if len(text) > s.max_result_chars:
            return ToolResult(
                f"the tool's result has {len(text)} characters, more than the "
                f"{s.max_result_chars} this server may return (max_result_chars)",
                True,
            )
        return ToolResult(text, bool(result.is_error))

    def status(self) -> dict[str, Any]:
        s = self.settings
        target = s.url if s.url is not None else " ".join([s.command or "", *s.args])
        return {
            "name": self.name,
            "transport": s.transport,
            "target": target,
            "state": self.state,
            "error": self.error,
            "tools": len(self.tools),
            "tool_names": [t.name for t in self.tools],
            "connects": self.connects,
            "calls_in_flight": self.calls_in_flight,
            "since": round(self.since, 3),
        }


def _describe(exc: BaseException) -> str:
    """A one-line reason, looking inside the exception groups anyio raises."""
    while getattr(exc, "exceptions", None):  # an exception group
        exc = exc.exceptions[0]  # type: ignore[attr-defined]
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if text != type(exc).__name__ else text
