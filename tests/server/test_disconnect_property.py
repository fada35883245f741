"""Property: whatever the interleaving of clients leaving — before their body is complete,
while their request waits in the engine thread's command queue, while it is prefilled, decoded,
streamed, or waited for whole — the engine ends with no running or waiting request and every
KV block free, and every request that reached the engine and was left is aborted in it.

A real engine (``random:tiny-llama`` on the CPU, prompts prefilled in 16-token chunks) serves
the app under uvicorn on loopback; the clients are raw sockets, closed at chosen moments. The
test drives the engine thread one step at a time (each ``EngineCore.step`` waits for a permit),
so "queued", "prefilling" and "decoding" are exact states, not timings.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from server_helpers import LiveServer, make_config

STAGES = ("body", "queued", "prefill", "decode", "stream", "whole", "complete")
PROMPT_LEN = 40  # three 16-token prefill chunks
MAX_TOKENS = 1500  # far more than a test waits for: a request left running shows


class StepGate:
    """Makes ``core.step`` wait for a permit while gating is on."""

    def __init__(self, core: Any) -> None:
        self._step = core.step
        self._cond = threading.Condition()
        self.gating = False
        self.permits = 0
        self.parked = False
        self.steps = 0
        core.step = self._gated_step

    def _gated_step(self) -> Any:
        with self._cond:
            while self.gating and self.permits == 0:
                self.parked = True
                self._cond.notify_all()
                self._cond.wait(0.05)
            self.parked = False
            if self.gating:
                self.permits -= 1
        out = self._step()
        with self._cond:
            self.steps += 1
            self._cond.notify_all()
        return out

    def start(self) -> None:
        with self._cond:
            self.gating, self.permits = True, 0

    def release(self) -> None:
        with self._cond:
            self.gating = False
            self._cond.notify_all()

    def permit_one(self, timeout: float = 10.0) -> bool:
        """Let one step run, if the engine thread is waiting for one; True when it ran."""
        with self._cond:
            if not self.parked:
                return False
            before = self.steps
            self.permits += 1
            self._cond.notify_all()
            ok = self._cond.wait_for(lambda: self.steps > before, timeout)
            assert ok, "the engine step did not finish"
            return True


class Spy:
    """Records the commands the server posts to the engine thread."""

    def __init__(self, engine: Any) -> None:
        from tallow.engine.async_engine import Abort, AddRequest

        self.adds: dict[int, str] = {}  # first prompt token -> request id
        self.aborts: set[str] = set()
        post = engine._post

        def spy(command: Any) -> None:
            if isinstance(command, AddRequest):
                self.adds[command.prompt_token_ids[0]] = command.request_id
            elif isinstance(command, Abort):
                self.aborts.add(command.request_id)
            post(command)

        engine._post = spy

    def reset(self) -> None:
        self.adds.clear()
        self.aborts.clear()


@pytest.fixture(scope="module")
def rig() -> Iterator[tuple[Any, LiveServer, StepGate, Spy]]:
    from tallow.engine.async_engine import AsyncEngine
    from tallow.engine.llm import config_from_kwargs
    from tallow.plugin.manager import load_plugins
    from tallow.server.app import build_app

    engine = AsyncEngine.from_config(
        config_from_kwargs(
            model="random:tiny-llama",
            dtype="float32",
            device="cpu",
            max_model_len=2048,
            num_blocks=1024,
            block_size=16,
            max_num_batched_tokens=16,
        ),
        plugin_manager=load_plugins(None),
    )
    gate = StepGate(engine.core)
    spy = Spy(engine)
    with LiveServer(build_app(engine, make_config())) as srv:
        yield engine, srv, gate, spy


@dataclass
class Client:
    stage: str
    start_step: int
    marker: int
    reader: Any = None
    writer: Any = None
    done: bool = False
    response: bytes = b""
    events: int = 0
    reading: Any = field(default=None, repr=False)

    @property
    def body(self) -> bytes:
        # The marker leads the prompt, so no two clients ever share a prefix-cache block and
        # "prefilling" lasts the three chunks.
        return json.dumps(
            {
                "prompt": [self.marker] + [7] * (PROMPT_LEN - 1),
                "max_tokens": 3 if self.stage == "complete" else MAX_TOKENS,
                "ignore_eos": True,
                "temperature": 0.0,
                "stream": self.stage in ("decode", "stream", "complete"),
            }
        ).encode()

    async def send(self, port: int) -> None:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", port)
        body = self.body
        head = (
            f"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode()
        self.writer.write(head + (body[: len(body) // 2] if self.stage == "body" else body))
        await self.writer.drain()
        self.reading = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        while chunk := await self.reader.read(65536):
            self.response += chunk
            self.events = self.response.count(b"data: ")

    async def leave(self) -> None:
        self.reading.cancel()
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass
        self.done = True


def _seq(engine: Any, request_id: str | None) -> Any:
    if request_id is None:
        return None
    request = engine.core.scheduler.requests.get(request_id)
    return request.seqs[0] if request is not None else None


def _should_leave(client: Client, engine: Any, spy: Spy) -> bool:
    rid = spy.adds.get(client.marker)
    seq = _seq(engine, rid)
    if client.stage == "body":
        return True
    if client.stage == "queued":
        return rid is not None  # posted; the engine thread is held, so it is still queued
    if client.stage == "prefill":
        return seq is not None and 0 < seq.num_computed_tokens < PROMPT_LEN
    if client.stage in ("decode", "whole"):  # streamed (unread) or waited for whole
        return seq is not None and seq.num_output_tokens >= 2
    if client.stage == "stream":
        return client.events >= 2
    return False


async def _wait_for(predicate: Any, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


async def _drive(
    engine: Any, srv: LiveServer, gate: StepGate, spy: Spy, clients: list[Client]
) -> None:
    step = 0
    idle_rounds = 0
    while not all(c.done for c in clients):
        acted = False
        for c in clients:
            if c.writer is None and c.start_step <= step:
                await c.send(srv.port)
                acted = True
                if c.stage != "body":
                    await _wait_for(lambda c=c: c.marker in spy.adds, "the request's add")
        for c in clients:
            if c.writer is None or c.done:
                continue
            if c.reading.done():  # the response ended: only a "complete" client may get there
                assert c.stage == "complete", (c.stage, c.response[:300])
                c.done = True
                continue
            if c.stage == "complete":
                continue
            if _should_leave(c, engine, spy):
                await c.leave()
                acted = True
                rid = spy.adds.get(c.marker)
                if rid is not None:  # the server must notice before the engine moves on
                    await _wait_for(lambda rid=rid: rid in spy.aborts, f"the abort of {c.stage}")
        if acted:
            continue
        if await asyncio.to_thread(gate.permit_one):
            step += 1
            idle_rounds = 0
        else:  # the engine has no work: let the clients' I/O happen, then start the next
            idle_rounds += 1
            await asyncio.sleep(0.01)
            if idle_rounds > 5:
                step += 1
                idle_rounds = 0


def _settled(engine: Any, srv: LiveServer) -> bool:
    stats = engine.stats()
    state = srv.server.config.app.state.tallow
    return (
        stats["num_running"] == 0
        and stats["num_waiting"] == 0
        and stats["num_free_blocks"] == stats["num_total_blocks"]
        and state.inflight == 0
        and not engine.core.has_unfinished()
        and not engine._streams
        and not engine.processor.requests
    )


_markers = itertools.count(8)  # token ids of the tiny model: 0..511, one per client ever
clients_strategy = st.lists(
    st.tuples(st.sampled_from(STAGES), st.integers(min_value=0, max_value=6)),
    min_size=1,
    max_size=6,
)


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
)  # shrinking live runs is slow
@given(plan=clients_strategy)
def test_any_interleaving_of_disconnects_leaves_nothing_behind(rig, plan) -> None:
    engine, srv, gate, spy = rig
    spy.reset()
    clients = [Client(stage, start, next(_markers)) for stage, start in plan]
    gate.start()

    async def run() -> None:
        try:
            await asyncio.wait_for(_drive(engine, srv, gate, spy, clients), 120)
        finally:
            gate.release()
        deadline = time.monotonic() + 3  # a leaked request would run for many seconds
        while not _settled(engine, srv) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)

    asyncio.run(run())
    stats = engine.stats()
    assert _settled(engine, srv), (plan, stats)
    for c in clients:
        rid = spy.adds.get(c.marker)
        if c.stage == "body":
            assert rid is None  # never reached the engine
        elif c.stage == "complete":
            head, _, body = c.response.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), c.response[:200]
            # chunked transfer: the last event, then the terminating empty chunk
            assert b"data: [DONE]\n\n" in body and body.endswith(b"\r\n0\r\n\r\n")
        else:
            assert rid in spy.aborts, (c, plan)
