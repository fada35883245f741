"""What chat and text completions share: :class:`OpenAIServing`, one generating request from
its parsed body to the whole response or the SSE stream.

The base class owns the flow: checking the request (model, endpoint, unsupported fields,
``stream_options``), the sampling parameters, admission and the client's disconnects (through
:func:`~tallow.server.generation.run_generation`), following the engine's outputs, ``usage``,
finish reasons, the response envelope and the stream's ending (usage chunk, ``[DONE]``).
A subclass supplies only what differs: how it builds its prompts and starts the engine
(:meth:`OpenAIServing.start`), and the shape of its choices, whole and streamed.

Outputs are followed as ``(prompt index, RequestOutput)`` pairs: a chat request has one prompt,
a completions request one per prompt it was given.
"""

from __future__ import annotations

import asyncio
import json
import time
from abc import ABC, abstractmethod
from typing import (
    AsyncIterator,
    Callable,
    ClassVar,
    Generic,
    Mapping,
    Protocol,
    TypedDict,
    TypeVar,
    cast,
)

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tallow.engine.outputs import CompletionOutput, RequestOutput
from tallow.engine.sampling.params import SamplingParams
from tallow.plugin import GrammarSpec

from .errors import APIError, from_exception
from .generation import aclose_quietly, run_generation, unless_disconnected
from .logprobs import reported_tokens
from .protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    SamplingFields,
    check_model,
    parse_request,
    reject_unsupported,
    stream_flags,
)
from .sampling import build_sampling_params
from .sse import DONE, StreamSession
from .served import EngineStream
from .state import ServerState

R = TypeVar("R", bound=SamplingFields)
#: one engine output of one of the request's prompts: (prompt index, RequestOutput)
Item = tuple[int, RequestOutput]
#: starts a request's engine streams (called once it is admitted)
Starter = Callable[[], AsyncIterator[Item]]
#: the ``usage`` object of a response (sent on stream chunks as null unless asked for)
Usage = dict[str, object]


class _ChoiceKeys(TypedDict):
    index: int
    finish_reason: str | None
    logprobs: Mapping[str, object] | None


class Choice(_ChoiceKeys, total=False):
    """One choice of a whole response or of a stream chunk, as sent."""

    message: dict[str, object]  # chat, whole response
    delta: dict[str, object]  # chat, stream chunk
    text: str  # completions


class Handler(Protocol):
    """What :meth:`OpenAIServing.create` returns: anything that answers the request."""

    async def run(self, request: Request) -> Response: ...


async def single_stream(gen: EngineStream) -> AsyncIterator[Item]:
    """The outputs of one engine stream as :data:`Item` (closing this closes ``gen``)."""
    try:
        async for out in gen:
            yield 0, out
    finally:
        await aclose_quietly(gen)


async def merge_streams(gens: list[EngineStream]) -> AsyncIterator[Item]:
    """Outputs of several engine streams as ``(stream index, output)``, as they arrive.

    Every stream is started at once, and all their first outputs are awaited before anything
    is yielded, so an engine refusal of any prompt surfaces before the response starts.
    """
    if len(gens) == 1:
        async for item in single_stream(gens[0]):
            yield item
        return
    queue: asyncio.Queue[tuple[int, RequestOutput | Exception | None]] = asyncio.Queue()
    tasks: list[asyncio.Task[None]] = []
    try:
        gathered: list[RequestOutput | BaseException] = await asyncio.gather(
            *(g.__anext__() for g in gens), return_exceptions=True
        )
        firsts: list[RequestOutput] = []
        for first in gathered:
            if isinstance(first, BaseException):
                raise first
            firsts.append(first)
        for i, out in enumerate(firsts):
            yield i, out

        async def pump(i: int, gen: EngineStream) -> None:
            try:
                async for out in gen:
                    await queue.put((i, out))
            except Exception as exc:
                await queue.put((i, exc))
            finally:
                await queue.put((i, None))

        tasks = [
            asyncio.ensure_future(pump(i, g)) for i, g in enumerate(gens) if not firsts[i].finished
        ]
        running = len(tasks)
        while running:
            i, got = await queue.get()
            if got is None:
                running -= 1
            elif isinstance(got, BaseException):
                raise got
            else:
                yield i, got
    finally:
        for task in tasks:
            task.cancel()
        for gen in gens:
            await aclose_quietly(gen)


class OpenAIServing(ABC, Generic[R]):
    """One chat or text completion request (see the module docstring)."""

    #: the request body's model
    request_type: ClassVar[type[ChatCompletionRequest] | type[CompletionRequest]]
    #: the endpoint's path, for the "this server does not generate" refusal
    path: ClassVar[str]
    #: the request field blamed for an engine refusal of the prompt
    prompt_param: ClassVar[str]
    #: prefix of response ids ("chatcmpl", "cmpl")
    id_prefix: ClassVar[str]
    #: the ``object`` of a whole response and of a stream chunk
    response_object: ClassVar[str]
    chunk_object: ClassVar[str]

    def __init__(self, state: ServerState, req: R) -> None:
        self.state = state
        self.req = req
        self.id = state.new_id(self.id_prefix)
        self.created = int(time.time())
        self.include_usage, self.continuous_usage = stream_flags(req)
        self.timer = state.metrics.timer()
        #: the latest output of each prompt, by prompt index
        self.latest: dict[int, RequestOutput] = {}
        #: the finish reason reported for each choice, by choice index (for the metrics)
        self.reasons: dict[int, str] = {}
        #: how many prompts the request generates from (set by :meth:`start`)
        self.prompt_count = 1

    # -- the flow -------------------------------------------------------------------------
    @classmethod
    async def serve(cls, state: ServerState, request: Request, body: dict[str, object]) -> Response:
        """Answer one HTTP request: check it, start its generation, respond or stream."""
        req = parse_request(cls.request_type, body)
        check_model(req.model, state.served_names)
        state.require_generation(cls.path)
        reject_unsupported(req)
        handler = await cls.create(state, cast(R, req))  # a subclass's request_type is its R
        return await handler.run(request)

    @classmethod
    async def create(cls, state: ServerState, req: R) -> Handler:
        """The handler of a checked request, anything with ``run(request)`` (a subclass may
        hand some requests to another, as chat does to the server-side tool loop)."""
        return cls(state, req)

    async def run(self, request: Request) -> Response:
        start, sequences = await self.start()
        return await run_generation(
            self.state,
            request,
            start,
            self.prompt_param,
            bool(self.req.stream),
            self.respond,
            self.stream,
            self.timer,
            sequences,
        )

    @abstractmethod
    async def start(self) -> tuple[Starter, int]:
        """Build the prompts and their sampling parameters (refusing what is wrong with them
        before admission); return a function starting the engine's stream of :data:`Item`
        and how many sequences it generates."""

    def sampling_params(
        self,
        max_tokens: int,
        logprobs: int | None,
        prompt_logprobs: int | None = None,
        structured_outputs: GrammarSpec | None = None,
    ) -> SamplingParams:
        """The request's ``SamplingParams``; a value the engine refuses is a 400."""
        try:
            return build_sampling_params(
                self.req,
                max_tokens=max_tokens,
                vocab_size=getattr(self.state.tokenizer, "vocab_size", None),
                logprobs=logprobs,
                prompt_logprobs=prompt_logprobs,
                structured_outputs=structured_outputs,
            )
        except Exception as exc:
            raise from_exception(exc) from None

    # -- what a subclass tells of its outputs ---------------------------------------------
    @abstractmethod
    def prompt_tokens(self) -> int:
        """Tokens of every prompt of the request."""

    def completion_tokens(self) -> int:
        return sum(len(o.token_ids) for out in self.latest.values() for o in out.outputs)

    def received(self, item: Item) -> None:
        """Called with each output as it arrives, before it is shown."""

    def can_stop(self) -> bool:
        """Whether every choice is complete although the engine still generates (a forced
        tool call closed): generation stops there."""
        return False

    @abstractmethod
    def choices(self) -> list[Choice]:
        """The choices of the whole response, from :attr:`latest`."""

    @abstractmethod
    def choice_chunks(self, item: Item, usage: Usage | None) -> list[str]:
        """The stream chunks an output adds."""

    def closing_chunks(self, usage: Usage | None) -> list[str]:
        """The chunks ending every choice when :meth:`can_stop` stopped the generation."""
        return []

    # -- shapes ---------------------------------------------------------------------------
    def usage(self) -> Usage:
        prompt, completion = self.prompt_tokens(), self.completion_tokens()
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens()},
        }

    def cached_tokens(self) -> int:
        return sum(int(out.num_cached_tokens or 0) for out in self.latest.values())

    def envelope(self, obj: str, choices: list[Choice]) -> dict[str, object]:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.state.model_name,
            "system_fingerprint": self.state.system_fingerprint,
            "choices": choices,
        }

    def chunk(self, choices: list[Choice], usage: Usage | None = None) -> str:
        """One stream event; ``usage`` is sent (null on most chunks) when the request asked
        for it through ``stream_options``."""
        body = self.envelope(self.chunk_object, choices)
        if self.include_usage or self.continuous_usage:
            body["usage"] = usage
        return json.dumps(body, ensure_ascii=False)

    def body(self, choices: list[Choice], usage: Usage) -> dict[str, object]:
        """A whole response."""
        return {**self.envelope(self.response_object, choices), "usage": usage}

    def reported(self, o: CompletionOutput) -> int:
        """How many of a choice's tokens have logprobs reported."""
        return reported_tokens(
            o, self.state.eos_token_ids, bool(self.req.include_stop_str_in_output)
        )

    @staticmethod
    def engine_finish_reason(o: CompletionOutput) -> str:
        """A choice's finish reason as the engine gives it; an aborted request is a 503."""
        if o.finish_reason == "abort":
            raise APIError(
                503, "The request was aborted by the server (shutting down?).", code="aborted"
            )
        return o.finish_reason or "stop"

    # -- following the engine -------------------------------------------------------------
    def _take(self, item: Item) -> None:
        index, out = item
        self.latest[index] = out
        self.timer.tokens(max(len(o.token_ids) for o in out.outputs))
        self.received(item)

    def _finished(self) -> bool:
        return len(self.latest) == self.prompt_count and all(
            out.finished for out in self.latest.values()
        )

    def _finish_timer(self) -> None:
        self.timer.finish([self.reasons[i] for i in sorted(self.reasons)], self.cached_tokens())

    async def respond(self, request: Request, gen: AsyncIterator[Item], first: Item) -> Response:
        """The whole response, once every choice has finished."""

        async def collect() -> None:
            item = first
            try:
                while True:
                    self._take(item)
                    if self._finished() or self.can_stop():
                        return
                    item = await gen.__anext__()
            except StopAsyncIteration:
                return
            finally:
                await aclose_quietly(gen)

        await unless_disconnected(request, collect())
        choices = self.choices()
        self.reasons = {
            c["index"]: reason for c in choices if (reason := c["finish_reason"]) is not None
        }  # always set when whole
        self._finish_timer()
        return JSONResponse(self.body(choices, self.usage()))

    async def stream(
        self, gen: AsyncIterator[Item], first: Item, session: StreamSession
    ) -> AsyncIterator[str]:
        """The SSE events of the response, as the outputs arrive."""
        item = first
        while True:
            self._take(item)
            usage = self.usage() if self.continuous_usage else None
            for chunk in self.choice_chunks(item, usage):
                yield chunk
            if self._finished():
                break
            if self.can_stop():
                # Every forced call is closed: stop generating and finish the choices.
                await aclose_quietly(gen)
                for chunk in self.closing_chunks(usage):
                    yield chunk
                break
            try:
                item = await gen.__anext__()
            except StopAsyncIteration:
                break
        self._finish_timer()
        if self.include_usage:
            yield self.chunk([], self.usage())
        yield DONE
