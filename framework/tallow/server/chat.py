"""``POST /v1/chat/completions``: whole responses and SSE streams, with tools and logprobs."""

from __future__ import annotations

import json
import logging
import time
from typing import Any, AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .errors import APIError, from_exception, invalid
from .logprobs import chat_logprobs, reported_tokens
from .messages import normalize_messages
from .protocol import ChatCompletionRequest, stream_flags
from .generation import aclose_quietly, unless_disconnected
from .sampling import build_sampling_params, resolve_max_tokens
from .sse import DONE, StreamSession
from .state import ServerState
from .structured import (
    Constraint, compile_constraint, compile_tool_parameters, requested_constraint,
)
from .tools import ChoiceTools, Final, plan_tools

log = logging.getLogger("tallow.server")

_RESERVED_TEMPLATE_KEYS = {"chat_template", "messages", "tools", "add_generation_prompt",
                           "documents"}


class _Choice:
    """Streaming bookkeeping of one of the ``n`` choices."""

    def __init__(self, tools: ChoiceTools) -> None:
        self.tools = tools
        self.text_len = 0
        self.tokens = 0
        self.finished = False
        self.started = False
        self.reason: str | None = None


class ChatCompletion:
    """One chat-completion request, from its parsed body to the response."""

    def __init__(self, state: ServerState, req: ChatCompletionRequest) -> None:
        self.state = state
        self.req = req
        self.id = state.new_id("chatcmpl")
        self.created = int(time.time())
        self.include_usage, self.continuous_usage = stream_flags(req)
        self.top = (req.top_logprobs or 0) if req.logprobs else None
        structured = state.structured
        self.plan = plan_tools(req.tools, req.tool_choice, req.parallel_tool_calls,
                               state.tool_parsing,
                               constrain=structured is not None and structured.available)
        self.prompt_ids: list[int] = []
        self.timer = state.metrics.timer()

    async def prepare(self, messages: list[dict[str, Any]] | None = None,
                      budget: int | None = None) -> tuple[list[int], Any, str]:
        """Render and tokenize the prompt of ``messages`` (normalized; default: the request's)
        and build the sampling parameters (``budget``: most tokens to generate instead of the
        request's own limit)."""
        self.state.check_fanout(1, self.req.n or 1)
        if messages is None:
            messages = normalize_messages(self.req.messages)
        kwargs = self.req.chat_template_kwargs or {}
        for key in sorted(set(kwargs) & _RESERVED_TEMPLATE_KEYS):
            # the template is the model's: a request may pass variables, not replace it
            raise invalid(f"chat_template_kwargs.{key}", f"Invalid value for "
                          f"'chat_template_kwargs': {key!r} cannot be set by a request.")
        prompt = await self.state.render_chat(messages, self.plan.prompt_tools, kwargs=kwargs)
        prompt += self.plan.prompt_suffix
        ids = await self.state.encode(prompt, add_special_tokens=False)
        self.prompt_ids = ids
        param = ("max_completion_tokens" if self.req.max_completion_tokens is not None
                 else "max_tokens")
        requested = budget or self.req.max_completion_tokens or self.req.max_tokens
        max_tokens = resolve_max_tokens(requested, len(ids), self.state.max_model_len,
                                        "messages", param)
        spec = await self._output_constraint()
        try:
            params = build_sampling_params(self.req, max_tokens=max_tokens,
                                           vocab_size=getattr(self.state.tokenizer,
                                                              "vocab_size", None),
                                           logprobs=self.top, structured_outputs=spec)
        except Exception as exc:
            raise from_exception(exc) from None
        return ids, params, prompt

    async def _output_constraint(self) -> Any:
        """The GrammarSpec the output must match (compiled already), or None: a forced tool
        call under a grammar, or what the request asks for (response_format and friends)."""
        asked = requested_constraint(self.req)
        if self.plan.forced and self.plan.constrained:
            if asked is not None:
                field = asked.field.split(".")[0]
                raise invalid(field, f"{field!r} cannot be combined with a forced "
                              "'tool_choice': the output is the tool call.")
            call = Constraint(self.plan.call_spec(), "tool_choice")
            await compile_tool_parameters(self.state, self.plan.tools or [], call)
            return call.spec
        if asked is None:
            return None
        await compile_constraint(self.state, asked)
        return asked.spec

    # -- shapes -------------------------------------------------------------------------
    def _usage(self, out: Any) -> dict[str, Any]:
        completion = sum(len(o.token_ids) for o in out.outputs)
        return {"prompt_tokens": len(self.prompt_ids), "completion_tokens": completion,
                "total_tokens": len(self.prompt_ids) + completion,
                "prompt_tokens_details": {"cached_tokens": int(out.num_cached_tokens or 0)}}

    def _chunk(self, choices: list[dict[str, Any]], usage: Any = None) -> str:
        body: dict[str, Any] = {"id": self.id, "object": "chat.completion.chunk",
                                "created": self.created, "model": self.state.model_name,
                                "system_fingerprint": self.state.system_fingerprint,
                                "choices": choices}
        if self.include_usage or self.continuous_usage:
            body["usage"] = usage
        return json.dumps(body, ensure_ascii=False)

    @staticmethod
    def _finish_reason(o: Any, final: Final, tools: Any) -> str:
        if final.tool_calls:
            return "length" if tools.truncated else "tool_calls"
        if tools.complete:
            return "stop"
        if o.finish_reason == "abort":
            raise APIError(503, "The request was aborted by the server (shutting down?).",
                           code="aborted")
        return o.finish_reason or "stop"

    # -- whole response -----------------------------------------------------------------
    async def respond(self, request: Request, gen: AsyncIterator[Any], first: Any) -> Response:
        choices = [self.plan.choice() for _ in first.outputs]
        fed = [0] * len(choices)

        async def collect() -> Any:
            last = first
            try:
                out = first
                while True:
                    self.timer.tokens(max(len(o.token_ids) for o in out.outputs))
                    for o in out.outputs:
                        choices[o.index].feed(o.text[fed[o.index]:])
                        fed[o.index] = len(o.text)
                    last = out
                    if out.finished or all(c.complete for c in choices):
                        return last
                    out = await gen.__anext__()
            except StopAsyncIteration:
                return last
            finally:
                await aclose_quietly(gen)

        last = await unless_disconnected(request, collect())
        result = []
        for o in last.outputs:
            tools = choices[o.index]
            final = tools.final(o.text)
            message: dict[str, Any] = {"role": "assistant", "content": final.content,
                                       "refusal": None}
            if final.tool_calls:
                message["tool_calls"] = [
                    {"id": c.id, "type": "function",
                     "function": {"name": c.name, "arguments": c.arguments}}
                    for c in final.tool_calls]
            logprobs = None
            if self.top is not None and o.logprobs is not None:
                shown = reported_tokens(o, self.state.eos_token_ids,
                                        bool(self.req.include_stop_str_in_output))
                logprobs = {"content": chat_logprobs(o.logprobs[:shown], o.token_ids[:shown],
                                                     self.top, self.state.token_text),
                            "refusal": None}
            result.append({"index": o.index, "message": message, "logprobs": logprobs,
                           "finish_reason": self._finish_reason(o, final, tools)})
        self.timer.finish([c["finish_reason"] for c in result], last.num_cached_tokens)
        return JSONResponse({"id": self.id, "object": "chat.completion",
                             "created": self.created, "model": self.state.model_name,
                             "system_fingerprint": self.state.system_fingerprint,
                             "choices": result, "usage": self._usage(last)})

    # -- stream -------------------------------------------------------------------------
    async def stream(self, gen: AsyncIterator[Any], first: Any,
                     session: StreamSession) -> AsyncIterator[str]:
        choices = [_Choice(self.plan.choice()) for _ in first.outputs]
        last = first
        out = first
        while True:
            last = out
            self.timer.tokens(max(len(o.token_ids) for o in out.outputs))
            for o in out.outputs:
                for chunk in self._choice_chunks(choices[o.index], o, out):
                    yield chunk
            if all(c.finished for c in choices):
                break
            if all(c.finished or c.tools.complete for c in choices):
                # Every forced call is closed: stop generating and finish the choices.
                await aclose_quietly(gen)
                for o in out.outputs:
                    for chunk in self._choice_chunks(choices[o.index], o, out, force=True):
                        yield chunk
                break
            try:
                out = await gen.__anext__()
            except StopAsyncIteration:
                break
        self.timer.finish([c.reason or "stop" for c in choices], last.num_cached_tokens)
        if self.include_usage:
            yield self._chunk([], self._usage(last))
        yield DONE

    def _choice_chunks(self, c: _Choice, o: Any, out: Any, force: bool = False) -> list[str]:
        if c.finished:
            return []
        chunks: list[str] = []
        usage = self._usage(out) if self.continuous_usage else None
        if not c.started:
            c.started = True
            chunks.append(self._chunk([{"index": o.index,
                                        "delta": {"role": "assistant", "content": ""},
                                        "logprobs": None, "finish_reason": None}], usage))
        new_text = o.text[c.text_len:]
        c.text_len = len(o.text)
        delta = c.tools.feed(new_text) if new_text else None
        logprobs = None
        shown = reported_tokens(o, self.state.eos_token_ids,
                                bool(self.req.include_stop_str_in_output))
        if self.top is not None and o.logprobs is not None and shown > c.tokens:
            logprobs = {"content": chat_logprobs(o.logprobs[c.tokens:shown],
                                                 o.token_ids[c.tokens:shown],
                                                 self.top, self.state.token_text),
                        "refusal": None}
        c.tokens = max(c.tokens, shown)
        pieces = [delta] if delta else []
        ending = o.finished or force
        if ending:
            pieces += c.tools.finish()
        for i, piece in enumerate(pieces):
            chunks.append(self._chunk([{"index": o.index, "delta": _delta_dict(piece),
                                        "logprobs": logprobs if i == 0 else None,
                                        "finish_reason": None}], usage))
        if not pieces and logprobs is not None:
            chunks.append(self._chunk([{"index": o.index, "delta": {"content": ""},
                                        "logprobs": logprobs, "finish_reason": None}], usage))
        if ending:
            c.finished = True
            if any(p.tool_calls for p in pieces) or c.tools.sent_calls:
                reason = "length" if c.tools.truncated else "tool_calls"
            elif force:
                reason = "stop"
            elif o.finish_reason == "abort":
                raise APIError(503, "The request was aborted by the server.", code="aborted")
            else:
                reason = o.finish_reason or "stop"
            c.reason = reason
            chunks.append(self._chunk([{"index": o.index, "delta": {}, "logprobs": None,
                                        "finish_reason": reason}], usage))
        return chunks


def _delta_dict(piece: Any) -> dict[str, Any]:
    delta: dict[str, Any] = {}
    if piece.content or not piece.tool_calls:
        delta["content"] = piece.content
    if piece.tool_calls:
        calls = []
        for t in piece.tool_calls:
            entry: dict[str, Any] = {"index": t.index}
            fn: dict[str, Any] = {}
            if t.id is not None:
                entry["id"] = t.id
                entry["type"] = "function"
            if t.name is not None:
                fn["name"] = t.name
            fn["arguments"] = t.arguments
            entry["function"] = fn
            calls.append(entry)
        delta["tool_calls"] = calls
    return delta
