"""Fixtures of the server tests: an app over the fake engine, in process or on a real socket;
one ``tallow serve`` of the embedded default model shared by the end-to-end files."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from server_fakes import FakeEngine  # noqa: E402
from server_helpers import DEFAULT_SERVER_KEY, LiveServer, ServeProcess, make_config  # noqa: E402


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


@pytest.fixture(scope="session")
def default_model_server() -> Iterator[ServeProcess]:
    """``tallow serve`` on the embedded default model (Qwen2.5-Coder-0.5B-Instruct, float32 on
    CPU), started once for every end-to-end file that needs no settings of its own: loading
    the 0.5B model in a fresh process is the largest part of such a file's time.

    Settings are the union of what its users ask for: an API key (``DEFAULT_SERVER_KEY``), a
    2,048-token context, 32 sequences at once (concurrent structured-output requests batch),
    and a 256 KiB body limit (the 413 test sends more)."""
    srv = ServeProcess(
        [
            "--dtype",
            "float32",
            "--device",
            "cpu",
            "--max-model-len",
            "2048",
            "--max-num-seqs",
            "32",
            "--api-key",
            DEFAULT_SERVER_KEY,
            "--max-body-bytes",
            "262144",
        ]
    ).start()
    _shared["default_model_server"] = srv
    yield srv
    _shared.pop("default_model_server", None)
    assert srv.stop() == 0, srv.log_text()[-3000:]  # a graceful shutdown, status 0


#: the shared server while it runs, and the last collected test that uses it
_shared: dict[str, Any] = {}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    users = [item for item in items if "default_model_server" in getattr(item, "fixturenames", ())]
    _shared["last_user"] = users[-1] if users else None


def pytest_runtest_teardown(item: pytest.Item) -> None:
    """Stops the shared server after its last user rather than at the end of the session, so
    that its 3 GB (float32 weights and KV cache) are not held while the rest of the suite runs;
    the session's teardown then checks the exit status the stop got."""
    srv = _shared.get("default_model_server")
    if srv is not None and item is _shared.get("last_user"):
        srv.stop()
