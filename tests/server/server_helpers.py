"""Helpers of the server tests: tool definitions, the official client over an in-process app,
a uvicorn server on a real socket."""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

try:  # the HTTP client the official openai SDK (3.x) and Starlette's test client use
    import httpx2 as httpx
except ImportError:  # older SDKs use httpx
    import httpx  # type: ignore[no-redef]

#: the API key of the shared ``tallow serve`` of the default model (``default_model_server``)
DEFAULT_SERVER_KEY = "sk-tallow-e2e"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "unit": {"type": "string", "enum": ["C", "F"]},
                },
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    },
]


def make_config(**server: Any) -> Any:
    from tallow.config import config_from_mapping

    return config_from_mapping({"server": server} if server else {})


def openai_client(client: Any, api_key: str = "unused") -> Any:
    """The official OpenAI client, talking to an in-process app through its test transport."""
    from openai import OpenAI

    return OpenAI(
        base_url="http://testserver/v1", api_key=api_key, http_client=client, max_retries=0
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """uvicorn serving an app on a real socket, in a thread of this process."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        from tallow.server.http_protocol import uvicorn_config

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(
            uvicorn_config(app, host="127.0.0.1", port=self.port, log_level="warning")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> "LiveServer":
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start within 10 s")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def sse_events(text: str) -> list[str]:
    """The ``data`` payloads of an SSE body, checking OpenAI's framing on the way."""
    assert text.endswith("\n\n")
    events = []
    for block in text.strip("\n").split("\n\n"):
        lines = [line for line in block.split("\n") if not line.startswith(":")]
        if not lines:
            continue  # a keep-alive comment
        assert len(lines) == 1 and lines[0].startswith("data: "), block
        events.append(lines[0][len("data: ") :])
    return events


def chunks_of(resp: Any) -> list[dict[str, Any]]:
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/event-stream")
    events = sse_events(resp.text)
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    return [json.loads(e) for e in events[:-1]]


class ServeProcess:
    """``tallow serve`` in a subprocess on a free local port, stopped with SIGTERM at exit.

    ``start()`` waits until ``/health`` answers 200 (the model is loaded and the socket open),
    failing with the server's log if it dies or takes longer than ``timeout`` seconds.
    """

    def __init__(
        self,
        args: list[str],
        *,
        timeout: float = 400.0,
        host_port: bool = False,
        uds: str | None = None,
        env: dict[str, str] | None = None,
        new_session: bool = False,
    ) -> None:
        import os
        import tempfile

        self.port = free_port()
        self.uds = uds
        self.url = "http://tallow" if uds else f"http://127.0.0.1:{self.port}"
        if uds:
            where = ["--host", f"unix://{uds}"]
        elif host_port:
            where = ["--host", f"127.0.0.1:{self.port}"]
        else:
            where = ["--host", "127.0.0.1", "--port", str(self.port)]
        self.args = [*args, *where]
        self.timeout = timeout
        self.env = {**os.environ, **(env or {})}
        self.log = tempfile.NamedTemporaryFile("w+", prefix="tallow-serve-", suffix=".log")
        self.proc: Any = None
        #: start it as the leader of a session of its own (its process group id is its pid):
        #: the processes it starts can then be found, and killed, as one group
        self.new_session = new_session

    def start(self) -> "ServeProcess":
        import subprocess
        import sys

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tallow", "serve", *self.args],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=self.new_session,
        )
        deadline = time.monotonic() + self.timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"tallow serve exited with {self.proc.returncode}:\n" + self.log_text()[-4000:]
                )
            try:
                with self.http() as http:
                    if http.get("/health", timeout=2).status_code == 200:
                        return self
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"tallow serve was not ready in {self.timeout:.0f} s:\n"
                    + self.log_text()[-4000:]
                )
            time.sleep(0.5)

    def http(self, **kwargs: Any) -> Any:
        """An HTTP client for this server (over its Unix socket when it has one)."""
        transport = httpx.HTTPTransport(uds=self.uds) if self.uds else None
        return httpx.Client(base_url=self.url, transport=transport, **kwargs)

    def log_text(self) -> str:
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()

    def stop(self) -> int | None:
        import subprocess

        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.terminate()
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(10)
