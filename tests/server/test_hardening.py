"""Regressions of issue 46's defects (one request must never kill or freeze the server): a dead
engine stops the process, metric labels stay bounded, tokenizing never freezes the event loop,
grammar compiles and chat templates are bounded, SIGTERM always ends the server."""

from __future__ import annotations

import threading
import time
from typing import Any

from server_fakes import FakeEngine
from server_helpers import free_port, httpx, make_config


# -- 1. a dead engine is never silent -----------------------------------------------------
def test_a_dead_engine_fails_health_and_stops_the_server_with_status_1(plugin_manager) -> None:
    """The engine loop fails: /health answers 503 and ``tallow serve``'s runner returns exit
    status 1 by itself (no signal), so a supervisor restarts the process."""
    from tallow.server.app import build_app
    from tallow.server.cli import _Stopper
    from tallow.server.http_protocol import uvicorn_config
    import uvicorn

    engine = FakeEngine(plugin_manager=plugin_manager)
    stopper = _Stopper()
    app = build_app(engine, make_config(), on_engine_dead=stopper.engine_dead)
    port = free_port()
    config = uvicorn_config(app, host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    sock = config.bind_socket()
    seen: dict[str, Any] = {}

    def kill_engine() -> None:
        url = f"http://127.0.0.1:{port}/health"
        deadline = time.monotonic() + 10
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        seen["before"] = httpx.get(url).status_code
        engine.error = RuntimeError("CUDA out of memory")  # what a failed step leaves behind
        seen["after"] = httpx.get(url).json()

    threading.Thread(target=kill_engine, daemon=True).start()
    started = time.monotonic()
    status = stopper.run(server, sock)  # uvicorn wants the main thread (its signal handlers)
    assert status == 1
    assert time.monotonic() - started < 10
    assert seen["before"] == 200
    assert seen["after"]["status"] == "error" and "out of memory" in seen["after"]["error"]
    sock.close()


def test_a_healthy_engine_leaves_the_server_running(plugin_manager) -> None:
    from tallow.server.app import build_app

    called: list[BaseException] = []
    engine = FakeEngine(plugin_manager=plugin_manager)
    from starlette.testclient import TestClient

    with TestClient(build_app(engine, make_config(), on_engine_dead=called.append)) as client:
        time.sleep(0.5)
        assert client.get("/health").status_code == 200
    assert called == []


# -- 4. metric labels stay bounded --------------------------------------------------------
def test_made_up_methods_and_paths_do_not_grow_the_metric_labels(serve) -> None:
    client = serve()
    for i in range(40):
        client.request(f"X{i}", "/health")
        client.request("GET", f"/scan/{i}")
        client.request(f"M{i}", f"/v1/scan{i}")
    text = client.get("/metrics").text
    series = [line for line in text.splitlines()
              if line.startswith("tallow_http_requests_total{")]
    methods = {line.split('method="')[1].split('"')[0] for line in series}
    endpoints = {line.split('endpoint="')[1].split('"')[0] for line in series}
    assert methods <= {"GET", "other"}, methods
    assert endpoints <= {"/health", "other"}, endpoints
    assert len(series) <= 6, series
    assert 'endpoint="other",method="other"' in text
