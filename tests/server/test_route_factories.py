"""Plugin routes registered as factories: built from the server's config, served only when
the factory returns something; ``server.ui`` and ``tallow serve --ui`` without a UI plugin."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

from starlette.responses import PlainTextResponse
from starlette.testclient import TestClient

from tallow.plugin import hookimpl
from tallow.plugin.testing import isolated_plugin_manager
from tallow.server.app import build_app

from server_fakes import FakeEngine
from server_helpers import make_config

SEEN: list[Any] = []


def page_factory(config: Any) -> Any:
    """Serves /page only when the config's max_queue is 7 (any setting would do)."""
    SEEN.append(config)
    if config is None or config.server.max_queue != 7:
        return None

    async def page(request: Any) -> PlainTextResponse:
        return PlainTextResponse(f"queue {config.server.max_queue}")

    return page


def broken_factory(config: Any) -> Any:
    raise RuntimeError("factory failed")


class FactoryRoutes:
    @hookimpl
    def tallow_register_routes(self, registry: Any) -> None:
        registry.register("/page", f"{__name__}:page_factory", factory=True)
        registry.register("/broken", f"{__name__}:broken_factory", factory=True)
        registry.register("/plain", f"{__name__}:page_factory")  # not a factory: the target


def _client(**server: Any) -> TestClient:
    pm = isolated_plugin_manager()
    pm.add_plugin(FactoryRoutes(), "tallow-factory-routes")
    engine = FakeEngine(plugin_manager=pm)
    return TestClient(build_app(engine, make_config(**server)), raise_server_exceptions=False)


def test_a_factory_route_is_built_from_the_config_and_served() -> None:
    SEEN.clear()
    with _client(max_queue=7) as client:
        assert client.get("/page").text == "queue 7"
        assert client.get("/broken").status_code == 404  # its factory raised: left out
    assert [c.server.max_queue for c in SEEN] == [7]


def test_a_factory_that_returns_none_serves_nothing() -> None:
    with _client(max_queue=8) as client:
        assert client.get("/page").status_code == 404
        assert "/page" not in client.get("/openapi.json").json()["paths"]


def test_server_ui_is_off_by_default_and_set_by_flag_and_yaml(tmp_path: Any) -> None:
    from tallow.config import load_config

    assert load_config([], env={}).server.ui is False
    assert load_config(["--ui"], env={}).server.ui is True
    path = tmp_path / "tallow.yaml"
    path.write_text("server:\n  ui: true\n")
    assert load_config(["--config", str(path)], env={}).server.ui is True
    assert load_config([], env={"TALLOW_SERVER__UI": "true"}).server.ui is True


def test_serve_ui_without_a_ui_plugin_stops_before_loading_the_model() -> None:
    started = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tallow",
            "serve",
            "--ui",
            "--no-autoload-plugins",
            "--model",
            "/nonexistent/model.gguf",
            "--port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "server.ui (--ui) is on, but no loaded plugin serves /ui" in proc.stderr
    assert "tallow-ui-web" in proc.stderr
    assert "cannot serve the model" not in proc.stderr  # it never got that far
    assert time.monotonic() - started < 60
