"""The server-side tool loop: chat completions that use the tools of the server's providers.

When a request uses server tools (:func:`wants_server_tools`), the provided tools are rendered
into the prompt next to the request's own ``tools`` and the model's output is parsed as usual.
Each call to a provided tool is run by the server; the assistant message with those calls and
one ``tool`` message per result are appended to the conversation (rendered by the model's own
chat template) and the model generates again. The loop ends when a response calls no provided
tool — its content and any calls to the client's tools are the answer, the latter with
``finish_reason: "tool_calls"`` as usual — or when ``server.max_tool_rounds`` rounds of calls
have run and the model still calls one (those calls are not run, they are reported as errors,
and ``finish_reason`` is ``"length"``). A response that calls provided and client tools
together runs the provided ones and then returns the client's.

The loop ends in an answer. A call identical (same tool, same arguments) to one already run in
the request is not run again: it is answered with the earlier result (reported with
``"repeated": true``), and the next round is generated with the tools withdrawn — rendered
without tools and read without a tool parser — so the model must reply in prose from the results
it has. The round after the ``server.max_tool_rounds``-th round of calls is generated the same
way.

With a reasoning parser (:mod:`.reasoning`), each round's output is split first: its reasoning
is reported as ``reasoning_content`` (of the message, all rounds together; of the deltas, as it
is generated), tool calls are parsed from the content only, and the assistant message of a round
that ran calls carries its reasoning into the next round's prompt (as ``reasoning_content``,
and ``thinking`` when it has no content; :func:`.messages.reasoning_fields`), since a model that
calls tools while it reasons continues from that reasoning.

A failed call (the provider says so, it raised, it timed out) is a tool result the model sees,
marked as an error; it never fails the request. Each run call is reported in the extension
field ``server_tool_calls`` — of the message in a whole response, of the deltas in a stream,
where a call is sent when it starts and its ``result`` when it ends — and ``usage`` adds up
every round. Content streams as it is generated, round after round; both shapes come from one
sequence of events (:meth:`ToolLoop.events`), so a stream assembles to the whole response.

A request that goes away cancels the loop: the generation of the current round is aborted
(its KV blocks freed) and a tool call in flight is cancelled.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import AsyncIterator, Union

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tallow.engine.outputs import RequestOutput
from tallow.plugin import ToolResult
from tallow.plugin.tool_parsing import StreamDelta, ToolCall, ToolCallDelta

from .chat import ChatCompletion, _delta_dict
from .errors import APIError, invalid
from .generation import aclose_quietly, first_output, run_generation, unless_disconnected
from .messages import normalize_messages, reasoning_fields
from .protocol import ChatCompletionRequest
from .reasoning import ChoiceReasoning
from .serving import Choice, Usage
from .sse import DONE, StreamSession
from .served import EngineStream
from .state import ServerState
from .tool_providers import ProvidedTool
from .tools import Final, plan_tools, tool_name

#: the extension field of messages and deltas that reports the calls the server ran
EXTENSION_FIELD = "server_tool_calls"
#: the user turn added before the round generated without tools
ANSWER_NOW = (
    "Answer my question now in plain sentences, using the tool results above. Do not "
    "call any tool and do not write JSON."
)


def wants_server_tools(state: ServerState, req: ChatCompletionRequest) -> bool:
    """Whether ``req`` runs the tool loop: its ``server_tools`` field, else the server's
    ``server.server_tools`` default. Asking for it explicitly where it cannot run is a 400;
    the server default silently leaves out requests it cannot serve (``n`` > 1, ``logprobs``,
    a forced or ``none`` ``tool_choice``, no tool parser for the model, no providers)."""
    explicit = req.server_tools
    if explicit is False:
        return False
    if (
        explicit is None
        and getattr(getattr(state.config, "server", None), "server_tools", "off") != "always"
    ):
        return False
    problem = _cannot_loop(state, req)
    if problem is None:
        return True
    if explicit:
        raise invalid(*problem)
    return False


def _cannot_loop(state: ServerState, req: ChatCompletionRequest) -> tuple[str, str] | None:
    if not state.tool_providers.active:
        return (
            "server_tools",
            "Invalid value for 'server_tools': this server runs no tool "
            "providers (configure one, e.g. MCP servers; see GET /v1/tools).",
        )
    if (req.n or 1) > 1:
        return ("n", "'server_tools' needs n = 1.")
    if req.logprobs:
        return ("logprobs", "'server_tools' cannot be combined with 'logprobs'.")
    choice = req.tool_choice
    if choice is not None and choice != "auto":
        return ("tool_choice", "'server_tools' needs 'tool_choice' to be 'auto' or absent.")
    if state.tool_parsing.parser is None:
        return (
            "server_tools",
            "Tool calling is not available: no tool parser matches the "
            "served model; start the server with --tool-parser NAME.",
        )
    return None


# ---------------------------------------------------------------------------------------------
# Events: what one loop produces, in order; the response shapes are rendered from them
# ---------------------------------------------------------------------------------------------
@dataclass
class Content:
    text: str


@dataclass
class Reasoning:
    text: str


@dataclass
class CallStarted:
    entry: dict[str, object]  # index, id, type, function {name, arguments}, provider, round


@dataclass
class CallEnded:
    index: int
    id: str
    result: dict[str, object]  # content, is_error


@dataclass
class End:
    finish_reason: str
    client_calls: list[ToolCall] = field(default_factory=list)


Event = Union[Content, Reasoning, CallStarted, CallEnded, End]


def call_index(entry: dict[str, object]) -> int:
    """The ``index`` of a reported call (:meth:`ToolLoop._entry` sets it)."""
    index = entry["index"]
    assert isinstance(index, int)
    return index


def _whole_calls(pieces: list[StreamDelta]) -> list[ToolCall]:
    """The calls in a finished choice's last deltas. The loop's tools are ``auto``, whose
    parsers send each call whole, in one delta carrying its id, name and arguments."""
    calls = []
    for piece in pieces:
        for d in piece.tool_calls:
            assert d.id is not None and d.name is not None
            calls.append(ToolCall(d.name, d.arguments, d.id))
    return calls


def _call_key(call: ToolCall) -> tuple[str, str]:
    """What makes two calls the same: the tool and its arguments, keys in any order."""
    try:
        arguments = json.dumps(json.loads(call.arguments), sort_keys=True)
    except json.JSONDecodeError:
        arguments = call.arguments
    return call.name, arguments


class ToolLoop:
    """One chat request running the tool loop (see the module docstring)."""

    def __init__(
        self, state: ServerState, req: ChatCompletionRequest, provided: dict[str, ProvidedTool]
    ) -> None:
        self.state = state
        self.req = req
        self.handler = ChatCompletion(state, req)
        client_tools = list(req.tools or [])
        shadowed = {
            tool_name(t)
            for t in client_tools
            if isinstance(t, dict) and isinstance(t.get("function"), dict)
        }
        # A client's own tool wins over a provided tool of the same name.
        self.provided = {n: t for n, t in provided.items() if n not in shadowed}
        tools = client_tools + [t.definition for t in self.provided.values()]
        self.handler.plan = plan_tools(tools, "auto", req.parallel_tool_calls, state.tool_parsing)
        self.messages = normalize_messages(req.messages, images=state.takes_images)
        self.budget = req.max_completion_tokens or req.max_tokens
        self.max_rounds = int(getattr(getattr(state.config, "server", None), "max_tool_rounds", 8))
        self.rounds = 0
        #: results of the calls run so far, by tool and canonical arguments
        self._results: dict[tuple[str, str], ToolResult] = {}
        self._reported = 0  # server calls reported so far (their index)
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cached_tokens = 0

    @property
    def id(self) -> str:
        return self.handler.id

    async def run(self, request: Request) -> Response:
        """Start the first round and answer whole or as a stream."""
        ids, params, prompt = await self.handler.prepare(self.messages)
        self.prompt_tokens += len(ids)
        images = self.handler.image_kwargs()
        return await run_generation(
            self.state,
            request,
            lambda: self.state.engine.generate(
                ids, params, self.id, prompt=prompt, priority=self.req.priority or 0, **images
            ),
            "messages",
            bool(self.req.stream),
            self.respond,
            self.stream,
            self.handler.timer,
            1,
        )

    def usage(self) -> Usage:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }

    # -- the loop -------------------------------------------------------------------------
    async def events(self, gen: EngineStream, first: RequestOutput) -> AsyncIterator[Event]:
        """Run the rounds, starting with the first round's engine stream ``gen`` (whose first
        output is ``first``); every later round's stream is opened and closed here."""
        while True:
            choice = self.handler.plan.choice()
            thinking = ChoiceReasoning(self.state.reasoning.parser, self.handler.prompt_text)
            written = ""  # this round's content
            thought = ""  # this round's reasoning
            fed = 0  # characters of the output given to the parsers
            out = first
            try:
                while True:
                    o = out.outputs[0]
                    self.handler.timer.tokens(self.completion_tokens + len(o.token_ids))
                    new, fed = o.text[fed:], len(o.text)
                    split = thinking.feed(new) if new else None
                    if split is not None and split.reasoning:
                        thought += split.reasoning
                        yield Reasoning(split.reasoning)
                    delta = choice.feed(split.content) if split and split.content else None
                    if delta is not None and delta.content:
                        written += delta.content
                        yield Content(delta.content)
                    if out.finished:
                        break
                    try:
                        out = await gen.__anext__()
                    except StopAsyncIteration:
                        break
            finally:
                await aclose_quietly(gen)
            o = out.outputs[0]
            self.completion_tokens += len(o.token_ids)
            self.cached_tokens += int(out.num_cached_tokens or 0)
            last = thinking.finish()
            if last.reasoning:
                thought += last.reasoning
                yield Reasoning(last.reasoning)
            pieces = [choice.feed(last.content)] if last.content else []
            pieces += choice.finish()
            rest = "".join(p.content for p in pieces if p.content)
            if rest:
                written += rest
                yield Content(rest)
            calls = _whole_calls(pieces)
            mine = [c for c in calls if c.name in self.provided]
            theirs = [c for c in calls if c.name not in self.provided]
            if not mine:
                yield End(ChatCompletion.tool_finish_reason(o, Final(None, theirs), choice), theirs)
                return
            if self.rounds >= self.max_rounds:
                for event in self._not_run(mine):
                    yield event
                yield End("length")
                return
            self.rounds += 1
            repeated = False
            async for event in self._run_calls(mine, written, thought):
                repeated |= isinstance(event, CallEnded) and bool(event.result.get("repeated"))
                yield event
            if theirs:
                yield End("tool_calls", theirs)
                return
            if repeated or self.rounds >= self.max_rounds:
                self._withdraw_tools()
            started = await self._next_round()
            if started is None:
                yield End("length")
                return
            gen, first = started

    def _entry(self, call: ToolCall, round_no: int) -> dict[str, object]:
        entry: dict[str, object] = {
            "index": self._reported,
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
            "provider": self.provided[call.name].provider,
            "round": round_no,
        }
        self._reported += 1
        return entry

    async def _run_calls(
        self, calls: list[ToolCall], content: str, reasoning: str
    ) -> AsyncIterator[Event]:
        """Run this round's calls to provided tools (concurrently), report them, and append
        them (with the round's content and reasoning) and their results to the conversation."""
        entries = [self._entry(call, self.rounds) for call in calls]
        for entry in entries:
            yield CallStarted(entry)
        # a call already run in this request (or earlier in this round) is not run again
        keys = [_call_key(call) for call in calls]
        tasks: dict[tuple[str, str], asyncio.Future[ToolResult]] = {}
        repeats = []
        for key, call in zip(keys, calls):
            repeats.append(key in self._results or key in tasks)
            if not repeats[-1]:
                tasks[key] = asyncio.ensure_future(self._call(call))
        results = []
        try:
            for call, entry, key, repeat in zip(calls, entries, keys, repeats):
                result = self._results[key] if key in self._results else await tasks[key]
                self._results[key] = result
                results.append(result)
                ended: dict[str, object] = {"content": result.content, "is_error": result.is_error}
                if repeat:
                    ended["repeated"] = True
                yield CallEnded(call_index(entry), call.id, ended)
        finally:
            for task in tasks.values():
                task.cancel()  # the request went away: cancel the calls still running
        self.messages.append(
            {
                "role": "assistant",
                "content": content or None,
                "tool_calls": [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": json.loads(c.arguments)},
                    }
                    for c in calls
                ],
                **reasoning_fields(reasoning, content),
            }
        )
        for call, result, repeat in zip(calls, results, repeats):
            # Chat templates have no error flag for tool results: the text says it.
            text = f"Error: {result.content}" if result.is_error else result.content
            if repeat:
                text += (
                    "\n(This exact call was already made; this is its earlier result. "
                    "Answer the user with the results you have.)"
                )
            self.messages.append(
                {"role": "tool", "content": text, "tool_call_id": call.id, "name": call.name}
            )

    def _withdraw_tools(self) -> None:
        """Generate from now on without tools: none in the prompt, no tool parser, and the
        user's turn asking for the answer (small models heed a user turn more than a note in
        a tool result)."""
        self.handler.plan = plan_tools(None, None, None, self.state.tool_parsing)
        self.messages.append({"role": "user", "content": ANSWER_NOW})

    async def _call(self, call: ToolCall) -> ToolResult:
        try:
            arguments = json.loads(call.arguments)
        except json.JSONDecodeError as exc:  # the parsers validate calls; kept as a guard
            return ToolResult(f"the arguments are not JSON: {exc}", True)
        return await self.state.tool_providers.call(self.provided[call.name], arguments)

    def _not_run(self, calls: list[ToolCall]) -> list[Event]:
        events: list[Event] = []
        why = (
            f"not run: the server already ran {self.max_rounds} rounds of tool calls for "
            "this request (server.max_tool_rounds)"
        )
        for call in calls:
            entry = self._entry(call, self.rounds + 1)
            events += [
                CallStarted(entry),
                CallEnded(call_index(entry), call.id, {"content": why, "is_error": True}),
            ]
        return events

    async def _next_round(self) -> tuple[EngineStream, RequestOutput] | None:
        """Start the next round's generation; None when no token is left to generate (the
        request's budget is spent or the conversation fills the context)."""
        budget = None
        if self.budget is not None:
            budget = self.budget - self.completion_tokens
            if budget <= 0:
                return None
        try:
            ids, params, prompt = await self.handler.prepare(self.messages, budget)
        except APIError as exc:
            if exc.code == "context_length_exceeded":
                return None
            raise
        self.prompt_tokens += len(ids)
        gen = self.state.engine.generate(
            ids,
            params,
            f"{self.id}-{self.rounds}",
            prompt=prompt,
            priority=self.req.priority or 0,
            **self.handler.image_kwargs(),
        )
        try:
            first = await first_output(gen, "messages")
        except BaseException:
            await aclose_quietly(gen)
            raise
        return gen, first

    # -- whole response -------------------------------------------------------------------
    async def respond(self, request: Request, gen: EngineStream, first: RequestOutput) -> Response:
        async def collect() -> tuple[str, str, list[dict[str, object]], End]:
            content = reasoning = ""
            entries: list[dict[str, object]] = []
            end = End("stop")
            async for event in self.events(gen, first):
                if isinstance(event, Content):
                    content += event.text
                elif isinstance(event, Reasoning):
                    reasoning += event.text
                elif isinstance(event, CallStarted):
                    entries.append(dict(event.entry))
                elif isinstance(event, CallEnded):
                    entries[event.index]["result"] = event.result
                else:
                    end = event
            return content, reasoning, entries, end

        content, reasoning, entries, end = await unless_disconnected(request, collect())
        message: dict[str, object] = {
            "role": "assistant",
            "content": content if content or not end.client_calls else None,
            "refusal": None,
        }
        if self.handler.shows_reasoning():
            message["reasoning_content"] = reasoning or None
        if end.client_calls:
            message["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in end.client_calls
            ]
        message[EXTENSION_FIELD] = entries
        self.handler.timer.finish([end.finish_reason], self.cached_tokens)
        choice: Choice = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": end.finish_reason,
        }
        return JSONResponse(self.handler.body([choice], self.usage()))

    # -- stream ---------------------------------------------------------------------------
    async def stream(
        self, gen: EngineStream, first: RequestOutput, session: StreamSession
    ) -> AsyncIterator[str]:
        h = self.handler

        def chunk(delta: dict[str, object], finish: str | None = None) -> str:
            usage = self.usage() if h.continuous_usage else None
            return h.chunk(
                [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}], usage
            )

        yield chunk({"role": "assistant", "content": ""})
        async for event in self.events(gen, first):
            if isinstance(event, Content):
                yield chunk({"content": event.text})
            elif isinstance(event, Reasoning):
                if h.shows_reasoning():
                    yield chunk({"reasoning_content": event.text})
            elif isinstance(event, CallStarted):
                yield chunk({EXTENSION_FIELD: [event.entry]})
            elif isinstance(event, CallEnded):
                yield chunk(
                    {
                        EXTENSION_FIELD: [
                            {"index": event.index, "id": event.id, "result": event.result}
                        ]
                    }
                )
            else:
                for i, c in enumerate(event.client_calls):
                    yield chunk(
                        _delta_dict(
                            StreamDelta(
                                tool_calls=[
                                    ToolCallDelta(i, id=c.id, name=c.name, arguments=c.arguments)
                                ]
                            )
                        )
                    )
                yield chunk({}, event.finish_reason)
                h.timer.finish([event.finish_reason], self.cached_tokens)
        if h.include_usage:
            yield h.chunk([], self.usage())
        yield DONE
