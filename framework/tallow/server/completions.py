"""``POST /v1/completions``: text completions, whole or streamed, with ``echo`` and logprobs.

``prompt`` may be a string, a list of strings, a list of token ids or a list of such lists;
each prompt gets ``n`` choices, numbered ``prompt_index * n + i`` as OpenAI numbers them.
``max_tokens: 0`` is accepted together with ``echo`` (scoring a prompt: its logprobs, no
completion).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .errors import APIError, from_exception, invalid
from .generation import aclose_quietly, run_generation, unless_disconnected
from .logprobs import completion_logprobs, merge_completion_logprobs, reported_tokens
from .protocol import (
    CompletionRequest, check_model, parse_request, reject_unsupported, stream_flags,
)
from .sampling import build_sampling_params, resolve_max_tokens
from .sse import DONE, StreamSession
from .state import ServerState
from .structured import compile_constraint, requested_constraint


@dataclass
class _Prompt:
    text: str
    ids: list[int]


async def _merge(gens: list[AsyncIterator[Any]]) -> AsyncIterator[tuple[int, Any]]:
    """Outputs of several engine streams as ``(stream index, output)``, as they arrive.

    Every stream is started at once, and all their first outputs are awaited before anything
    is yielded, so an engine refusal of any prompt surfaces before the response starts.
    """
    if len(gens) == 1:
        async for out in gens[0]:
            yield 0, out
        return
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
    tasks: list[asyncio.Task[Any]] = []
    try:
        firsts = await asyncio.gather(*(g.__anext__() for g in gens), return_exceptions=True)
        for first in firsts:
            if isinstance(first, BaseException):
                raise first
        for i, first in enumerate(firsts):
            yield i, first

        async def pump(i: int, gen: AsyncIterator[Any]) -> None:
            try:
                async for out in gen:
                    await queue.put((i, out))
            except Exception as exc:
                await queue.put((i, exc))
            finally:
                await queue.put((i, None))

        tasks = [asyncio.ensure_future(pump(i, g)) for i, g in enumerate(gens)
                 if not firsts[i].finished]
        running = len(tasks)
        while running:
            i, item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for task in tasks:
            task.cancel()
        for gen in gens:
            await aclose_quietly(gen)


class TextCompletion:
    """One completions request, from its parsed body to the response."""

    def __init__(self, state: ServerState, req: CompletionRequest) -> None:
        self.state = state
        self.req = req
        self.id = state.new_id("cmpl")
        self.created = int(time.time())
        self.include_usage, self.continuous_usage = stream_flags(req)
        self.n = req.n or 1
        self.echo = bool(req.echo)
        self.top = req.logprobs
        self.score_only = req.max_tokens == 0
        if self.score_only and not self.echo:
            raise invalid("max_tokens", "Invalid value for 'max_tokens': 0 is only allowed "
                          "with 'echo' (to score the prompt); expected at least 1.")
        self.prompts: list[_Prompt] = []
        self.timer = state.metrics.timer()

    async def prepare(self) -> list[Any]:
        """Tokenize the prompts and build one ``SamplingParams`` per prompt."""
        raw = self.req.prompt
        items: list[str | list[int]]
        if isinstance(raw, str):
            items = [raw]
        elif raw and all(isinstance(x, int) for x in raw):
            items = [list(raw)]  # type: ignore[arg-type]
        else:
            items = list(raw)  # type: ignore[arg-type]
        if not items:
            raise invalid("prompt", "Invalid value for 'prompt': expected at least one prompt.")
        self.state.check_fanout(len(items), self.n)
        vocab = getattr(self.state.tokenizer, "vocab_size", None)
        asked = requested_constraint(self.req)
        if asked is not None:
            await compile_constraint(self.state, asked)
        param_list = []
        for p, item in enumerate(items):
            where = "prompt" if len(items) == 1 else f"prompt[{p}]"
            if isinstance(item, str):
                ids = await self.state.encode(item, add_special_tokens=True)
                text = item
            else:
                if vocab and any(t < 0 or t >= vocab for t in item):
                    raise invalid(where, f"Invalid value for {where!r}: token ids must be in "
                                  f"0..{vocab - 1}.")
                ids = list(item)
                text = await self.state.run_blocking(
                    lambda ids=ids: self.state.tokenizer.decode(ids, skip_special_tokens=False),
                    size=len(ids) * 4)
            if not ids:
                raise invalid(where, f"Invalid value for {where!r}: the prompt is empty.")
            self.prompts.append(_Prompt(text, ids))
            # scoring (max_tokens 0) generates one token that is never shown
            requested = None if self.req.max_tokens is None else max(1, self.req.max_tokens)
            max_tokens = resolve_max_tokens(requested, len(ids), self.state.max_model_len, where)
            try:
                param_list.append(build_sampling_params(
                    self.req, max_tokens=max_tokens, vocab_size=vocab, logprobs=self.top,
                    prompt_logprobs=self.top if self.echo and self.top is not None else None,
                    structured_outputs=asked.spec if asked is not None else None))
            except Exception as exc:
                raise from_exception(exc) from None
        return param_list

    def start(self, params: list[Any]) -> AsyncIterator[tuple[int, Any]]:
        gens = [self.state.engine.generate(p.ids, sp, f"{self.id}-{i}", prompt=p.text,
                                           priority=self.req.priority or 0)
                for i, (p, sp) in enumerate(zip(self.prompts, params))]
        return _merge(gens)

    # -- shapes -------------------------------------------------------------------------
    def _usage(self, outs: dict[int, Any]) -> dict[str, Any]:
        prompt = sum(len(p.ids) for p in self.prompts)
        completion = 0 if self.score_only else sum(
            len(o.token_ids) for out in outs.values() for o in out.outputs)
        cached = sum(int(out.num_cached_tokens or 0) for out in outs.values())
        return {"prompt_tokens": prompt, "completion_tokens": completion,
                "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": cached}}

    def _chunk(self, choices: list[dict[str, Any]], usage: Any = None) -> str:
        body: dict[str, Any] = {"id": self.id, "object": "text_completion",
                                "created": self.created, "model": self.state.model_name,
                                "system_fingerprint": self.state.system_fingerprint,
                                "choices": choices}
        if self.include_usage or self.continuous_usage:
            body["usage"] = usage
        return json.dumps(body, ensure_ascii=False)

    def _prompt_logprobs(self, p: int, out: Any) -> dict[str, Any] | None:
        if self.top is None or not self.echo:
            return None
        positions = out.prompt_logprobs or [None] * len(self.prompts[p].ids)
        return completion_logprobs(list(positions), self.prompts[p].ids, self.top,
                                   self.state.token_text)

    def _finish_reason(self, o: Any) -> str:
        if self.score_only:
            return "length"
        if o.finish_reason == "abort":
            raise APIError(503, "The request was aborted by the server.", code="aborted")
        return o.finish_reason or "stop"

    # -- whole response -----------------------------------------------------------------
    async def respond(self, request: Request, gen: AsyncIterator[tuple[int, Any]],
                      first: tuple[int, Any]) -> Response:
        async def collect() -> dict[int, Any]:
            latest = {first[0]: first[1]}
            self.timer.tokens(max(len(o.token_ids) for o in first[1].outputs))
            try:
                async for p, out in gen:
                    latest[p] = out
                    self.timer.tokens(max(len(o.token_ids) for o in out.outputs))
            finally:
                await aclose_quietly(gen)
            return latest

        latest = await unless_disconnected(request, collect())
        choices = []
        for p in sorted(latest):
            out = latest[p]
            prompt_lp = self._prompt_logprobs(p, out)
            for o in out.outputs:
                text = "" if self.score_only else o.text
                logprobs = None
                if self.top is not None:
                    offset = len(self.prompts[p].text) if self.echo else 0
                    shown = 0 if self.score_only else reported_tokens(
                        o, self.state.eos_token_ids, bool(self.req.include_stop_str_in_output))
                    gen_lp = completion_logprobs(
                        (o.logprobs or [])[:shown], o.token_ids[:shown], self.top,
                        self.state.token_text, offset)
                    logprobs = merge_completion_logprobs(prompt_lp, gen_lp)
                choices.append({"index": p * self.n + o.index,
                                "text": (self.prompts[p].text if self.echo else "") + text,
                                "logprobs": logprobs,
                                "finish_reason": self._finish_reason(o)})
        choices.sort(key=lambda c: c["index"])
        self.timer.finish([c["finish_reason"] for c in choices],
                          sum(int(o.num_cached_tokens or 0) for o in latest.values()))
        return JSONResponse({"id": self.id, "object": "text_completion",
                             "created": self.created, "model": self.state.model_name,
                             "system_fingerprint": self.state.system_fingerprint,
                             "choices": choices, "usage": self._usage(latest)})

    # -- stream -------------------------------------------------------------------------
    async def stream(self, gen: AsyncIterator[tuple[int, Any]], first: tuple[int, Any],
                     session: StreamSession) -> AsyncIterator[str]:
        sent_text: dict[int, int] = {}
        sent_tokens: dict[int, int] = {}
        offsets: dict[int, int] = {}
        done: set[int] = set()
        latest: dict[int, Any] = {}
        item: tuple[int, Any] | None = first
        while item is not None:
            p, out = item
            latest[p] = out
            self.timer.tokens(max(len(o.token_ids) for o in out.outputs))
            usage = self._usage(latest) if self.continuous_usage else None
            for o in out.outputs:
                for chunk in self._choice_chunks(p, out, o, sent_text, sent_tokens,
                                                 offsets, done, usage):
                    yield chunk
            try:
                item = await gen.__anext__()
            except StopAsyncIteration:
                item = None
        self.timer.finish([o.finish_reason or "stop" for out in latest.values()
                           for o in out.outputs],
                          sum(int(o.num_cached_tokens or 0) for o in latest.values()))
        if self.include_usage:
            yield self._chunk([], self._usage(latest))
        yield DONE

    def _choice_chunks(self, p: int, out: Any, o: Any, sent_text: dict[int, int],
                       sent_tokens: dict[int, int], offsets: dict[int, int], done: set[int],
                       usage: Any) -> list[str]:
        index = p * self.n + o.index
        if index in done:
            return []
        chunks = []
        prefix = ""
        logprobs = None
        if index not in sent_text:
            sent_text[index] = sent_tokens[index] = 0
            offsets[index] = 0
            if self.echo:
                prefix = self.prompts[p].text
                logprobs = self._prompt_logprobs(p, out)
                offsets[index] = len(prefix)
        new_text = "" if self.score_only else o.text[sent_text[index]:]
        sent_text[index] = len(o.text)
        shown = reported_tokens(o, self.state.eos_token_ids,
                                        bool(self.req.include_stop_str_in_output))
        if self.top is not None and not self.score_only and o.logprobs is not None \
                and shown > sent_tokens[index]:
            piece = completion_logprobs(o.logprobs[sent_tokens[index]:shown],
                                        o.token_ids[sent_tokens[index]:shown], self.top,
                                        self.state.token_text, offsets[index])
            offsets[index] += sum(len(t) for t in piece["tokens"])
            logprobs = merge_completion_logprobs(logprobs, piece)
        sent_tokens[index] = max(sent_tokens[index], shown)
        if prefix or new_text or logprobs is not None:
            chunks.append(self._chunk([{"index": index, "text": prefix + new_text,
                                        "logprobs": logprobs, "finish_reason": None}], usage))
        if o.finished or self.score_only:
            done.add(index)
            chunks.append(self._chunk([{"index": index, "text": "", "logprobs": None,
                                        "finish_reason": self._finish_reason(o)}], usage))
        return chunks


async def create_completion(state: ServerState, request: Request,
                            body: dict[str, Any]) -> Response:
    req = parse_request(CompletionRequest, body)
    check_model(req.model, state.served_names)
    state.require_generation("/v1/completions")
    reject_unsupported(req)
    handler = TextCompletion(state, req)
    params = await handler.prepare()
    return await run_generation(state, request, lambda: handler.start(params), "prompt",
                                bool(req.stream), handler.respond, handler.stream,
                                handler.timer, len(params) * handler.n)
