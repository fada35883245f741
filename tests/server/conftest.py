"""Fixtures of the server tests: an app over the fake engine, in process or on a real socket."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from server_fakes import FakeEngine  # noqa: E402
from server_helpers import LiveServer, make_config  # noqa: E402


@pytest.fixture(scope="session")
def plugin_manager() -> Any:
    """The installed plugins (the tool parsers among them), loaded as the server loads them."""
    from tallow.plugin.manager import load_plugins

    return load_plugins(None)


@pytest.fixture
def serve(plugin_manager: Any) -> Iterator[Callable[..., Any]]:
    """``serve(engine=None, **server_settings) -> TestClient`` (the app's lifespan runs)."""
    from starlette.testclient import TestClient

    from tallow.server.app import build_app

    clients: list[Any] = []

    def make(engine: Any = None, **server: Any) -> Any:
        engine = engine or FakeEngine(plugin_manager=plugin_manager)
        if engine.plugin_manager is None:
            engine.plugin_manager = plugin_manager
        client = TestClient(build_app(engine, make_config(**server)), raise_server_exceptions=False)
        client.__enter__()
        client.engine = engine
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture
def live(plugin_manager: Any) -> Iterator[Callable[..., LiveServer]]:
    """``live(engine, **server_settings) -> LiveServer`` on 127.0.0.1 (stopped afterwards)."""
    from tallow.server.app import build_app

    servers: list[LiveServer] = []

    def make(engine: Any, **server: Any) -> LiveServer:
        if engine.plugin_manager is None:
            engine.plugin_manager = plugin_manager
        srv = LiveServer(build_app(engine, make_config(**server))).__enter__()
        servers.append(srv)
        return srv

    yield make
    for srv in servers:
        srv.__exit__(None, None, None)
