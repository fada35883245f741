"""The asynchronous engine the server uses.

A background thread owns the engine core and steps it while there is work; the asyncio side
tokenizes, detokenizes and checks stop strings
(:class:`~tallow.engine.output_processor.OutputProcessor`). The two sides talk
through a command queue (thread → core) and ``call_soon_threadsafe`` (core → asyncio), so HTTP
handling and text work never stall the device, and the device never waits on a lock held by
the event loop. A command is a small frozen dataclass (:class:`AddRequest`, :class:`Abort`,
:class:`FinishSequence`); the engine thread dispatches on its type.

The engine times its steps (the core's tracer is on) because the server's metrics add the
times up: ``step_seconds_total`` and ``host_seconds_total``, the host time the device may
have waited for.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import queue
import threading
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Sequence, TypeVar

import torch

from tallow.config import TallowConfig
from tallow.plugin.manager import PluginManager

from .builder import EngineFrontend, EngineParts, build_engine
from .core_output import CoreOutput
from .embedding import PoolingParams, finish_embedding
from .errors import AdmissionError, EngineDeadError
from .multimodal import MultimodalPrompt
from .outputs import EmbeddingOutput, RequestOutput
from .sampling.params import SamplingParams
from .sequence import SequenceStatus

log = logging.getLogger("tallow.engine")

_IDLE_WAIT_S = 0.05
_T = TypeVar("_T")


@dataclass(frozen=True)
class AddRequest:
    """Admit a request; ``admitted`` settles (on the event loop) once the core took it, or
    with the admission error."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams | PoolingParams
    priority: int
    admitted: asyncio.Future[None]
    #: the images of an expanded prompt, None: text only
    mm: MultimodalPrompt | None = None


@dataclass(frozen=True)
class Abort:
    """Abort a request (a no-op if it has finished or was never admitted)."""

    request_id: str


@dataclass(frozen=True)
class FinishSequence:
    """End one completion of a request early: the output processor saw a stop string."""

    request_id: str
    index: int


#: what the asyncio side posts to the engine thread
EngineCommand = AddRequest | Abort | FinishSequence

#: what a request's output queue carries: a completion's outputs, an embedding's pooled
#: vector, or the error that killed the engine
_StreamItem = RequestOutput | torch.Tensor | BaseException


def _settle(admitted: asyncio.Future[None], error: BaseException | None) -> None:
    """Settle an add's future on the event loop (unless its caller has gone)."""
    if admitted.done():
        return
    if error is None:
        admitted.set_result(None)
    else:
        admitted.set_exception(error)


class AsyncEngine(EngineFrontend):
    def __init__(self, parts: EngineParts) -> None:
        super().__init__(parts)
        self.core.trace_steps()  # the step and host-time metrics are read from the timings
        self._commands: queue.SimpleQueue[EngineCommand] = queue.SimpleQueue()
        self._wake = threading.Event()
        #: request id → its outputs (an embedding request gets its pooled vector), or the error
        self._streams: dict[str, asyncio.Queue[_StreamItem]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._counters = {
            "prompt_tokens_total": 0,
            "generation_tokens_total": 0,
            "steps_total": 0,
            "step_seconds_total": 0.0,
            "host_seconds_total": 0.0,
        }
        self.error: BaseException | None = None
        if parts.parallel is not None:  # a lost tensor-parallel rank fails every request
            parts.parallel.on_failure(self._group_failed)

    @classmethod
    def from_config(
        cls, config: TallowConfig, plugin_manager: PluginManager | None = None
    ) -> "AsyncEngine":
        return cls(build_engine(config, plugin_manager))

    # -- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="tallow-engine", daemon=True)
        self._thread.start()

    async def shutdown(self) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 10)
            self._thread = None
        structured = getattr(self, "structured", None)
        if structured is not None:
            structured.close()  # its grammar compile worker process

    # -- the engine thread --------------------------------------------------------------
    def _post(self, command: EngineCommand) -> None:
        self._commands.put(command)
        self._wake.set()

    def _run(self) -> None:
        device = self.parts.loaded.device
        if device.type == "cuda":
            torch.cuda.set_device(device)
        try:
            while not self._stopping.is_set():
                self._drain_commands()
                if not self.core.has_unfinished():
                    self._wake.wait(_IDLE_WAIT_S)
                    self._wake.clear()
                    continue
                out = self.core.step()
                if out.updates or out.finished or out.prompt_logprobs or out.pooled:
                    self._deliver(self._on_core_output, out)
                c = self._counters
                c["steps_total"] += 1
                c["step_seconds_total"] += out.step_time
                c["host_seconds_total"] += out.host_time
        except BaseException as exc:  # the engine is dead: fail every waiting request loudly
            parallel = self.parts.parallel
            if self.error is None and parallel is not None and isinstance(exc, Exception):
                parallel.diagnose()  # a lost rank makes a collective raise: name the rank
            if self.error is not None:  # a lost tensor-parallel rank, already reported
                return
            log.exception("engine loop failed")
            self.error = exc
            self._deliver(self._fail_all, exc)

    def _group_failed(self, reason: str) -> None:
        """A rank of the tensor-parallel group was lost (the watchdog's thread calls this):
        waiting and new requests fail with ``reason`` (a 503), whatever the engine thread is
        blocked in."""
        self.error = EngineDeadError(reason)
        self._deliver(self._fail_all, self.error)

    def _deliver(self, fn: Callable[[_T], None], arg: _T) -> None:
        """Call ``fn(arg)`` on the event loop (nothing once the loop is closed)."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(fn, arg)

    def _drain_commands(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            self._execute(command)

    def _execute(self, command: EngineCommand) -> None:
        match command:
            case AddRequest():
                error: BaseException | None = None
                try:
                    self.core.add_request(
                        command.request_id,
                        command.prompt_token_ids,
                        command.params,
                        priority=command.priority,
                        mm=command.mm,
                    )
                except BaseException as exc:
                    error = exc
                self._deliver(functools.partial(_settle, command.admitted), error)
            case Abort():
                self.core.abort(command.request_id)
            case FinishSequence():
                self.core.finish_sequence(
                    command.request_id, command.index, SequenceStatus.FINISHED_STOPPED
                )

    # -- the asyncio side ---------------------------------------------------------------
    def _on_core_output(self, out: CoreOutput) -> None:
        for request_id, vector in out.pooled.items():
            stream = self._streams.get(request_id)
            if stream is not None:
                stream.put_nowait(vector)
        outputs, to_stop = self.processor.process(out)
        self._counters["generation_tokens_total"] += len(out.updates)
        for rid, index in to_stop:
            self._post(FinishSequence(rid, index))
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if stream is not None:
                stream.put_nowait(output)

    def _fail_all(self, exc: BaseException) -> None:
        for stream in self._streams.values():
            stream.put_nowait(exc)

    async def _open(
        self, request_id: str, prompt_token_ids: list[int], field: str
    ) -> asyncio.Queue[_StreamItem]:
        """The output queue of a new request, once the engine runs and the request is
        admissible on this side (``field`` names its tokens in errors)."""
        if self.error is not None:
            raise EngineDeadError(f"the engine has failed: {self.error}")
        if self._thread is None:
            await self.start()
        if not prompt_token_ids:
            raise AdmissionError(f"{field}: must contain at least one token", field=field)
        if request_id in self._streams:
            raise AdmissionError(f"request id {request_id!r} is already in use", field="request_id")
        stream: asyncio.Queue[_StreamItem] = asyncio.Queue()
        self._streams[request_id] = stream
        return stream

    def _submit(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams | PoolingParams,
        priority: int,
        mm: MultimodalPrompt | None = None,
    ) -> asyncio.Future[None]:
        """Post the request to the engine thread; the future settles when it was admitted."""
        assert self._loop is not None
        admitted = self._loop.create_future()
        self._post(AddRequest(request_id, list(prompt_token_ids), params, priority, admitted, mm))
        return admitted

    async def generate(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        request_id: str,
        *,
        prompt: str | None = None,
        priority: int = 0,
        images: Sequence[Any] | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Stream the outputs of one request (cumulative text per completion).

        Admission errors are raised before the first output. Closing the iterator early (a
        client went away) aborts the request and frees its KV blocks. ``images`` go with a
        prompt holding one image placeholder token per image (a vision-language model).
        """
        if images:
            # decoding and resizing images is host work: off the event loop
            prompt_token_ids, mm = await asyncio.to_thread(
                self.expand_images, list(prompt_token_ids), images
            )
        else:
            mm = None
        stream = await self._open(request_id, prompt_token_ids, "prompt")
        self.processor.add_request(request_id, prompt, prompt_token_ids, params)
        admitted = self._submit(request_id, prompt_token_ids, params, priority, mm)
        finished = False
        try:
            # Until its final output arrives the request may be in the engine, or on its way
            # there in the command queue: leaving at any point, even here before the engine has
            # taken the "add" (a client that went away), posts an abort, which the engine
            # thread takes after the add. A refused request makes that abort a no-op.
            await admitted
            self._counters["prompt_tokens_total"] += len(prompt_token_ids)
            while True:
                item = await stream.get()
                if isinstance(item, BaseException):
                    raise EngineDeadError(f"the engine has failed: {item}") from item
                assert isinstance(item, RequestOutput)  # a completion's stream
                if item.finished:
                    finished = True
                yield item
                if finished:
                    return
        finally:
            self._streams.pop(request_id, None)
            if not finished:
                self._post(Abort(request_id))
                self.processor.abort_request(request_id)

    async def embed(
        self, prompt_token_ids: list[int], params: PoolingParams, request_id: str
    ) -> EmbeddingOutput:
        """The embedding of one input (on an engine built to embed). Admission errors are
        raised as for :meth:`generate`; cancelling the call aborts the request."""
        stream = await self._open(request_id, prompt_token_ids, "input")
        admitted = self._submit(request_id, prompt_token_ids, params, 0)
        finished = False
        try:
            await admitted  # leaving before the add is taken still posts the abort below
            self._counters["prompt_tokens_total"] += len(prompt_token_ids)
            item = await stream.get()
            if isinstance(item, BaseException):
                raise EngineDeadError(f"the engine has failed: {item}") from item
            assert isinstance(item, torch.Tensor)  # an embedding's stream: its pooled vector
            finished = True
            assert self.embedding is not None  # the engine took an embedding request
            return EmbeddingOutput(
                request_id,
                list(prompt_token_ids),
                finish_embedding(item, self.embedding, params.dimensions),
            )
        finally:
            self._streams.pop(request_id, None)
            if not finished:
                self._post(Abort(request_id))

    async def abort(self, request_id: str) -> None:
        self._post(Abort(request_id))
        final = self.processor.abort_request(request_id)
        stream = self._streams.get(request_id)
        if stream is not None and final is not None:
            stream.put_nowait(final)

    def stats(self) -> dict[str, float]:
        stats = self.core.stats()
        stats.update(self._counters)
        return stats
