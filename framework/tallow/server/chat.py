"""``POST /v1/chat/completions``: whole responses and SSE streams, with tools and logprobs.

:class:`ChatCompletion` is the chat side of :class:`~tallow.server.serving.OpenAIServing`: the
prompt rendered from the messages by the model's chat template, and choices shaped as
messages or deltas, with tool calls parsed out of the text. With a reasoning parser
(:mod:`tallow.server.reasoning`) the text is first split into ``reasoning_content`` and content,
and tool calls are parsed from the content only.
"""

from __future__ import annotations

import logging
from typing import Any

from tallow.engine.outputs import CompletionOutput
from tallow.engine.sampling.params import SamplingParams
from tallow.plugin import GrammarSpec
from tallow.plugin.tool_parsing import StreamDelta

from .errors import invalid, unsupported
from .logprobs import chat_logprobs
from .images import load_image_url
from .messages import image_urls, normalize_messages
from .protocol import ChatCompletionRequest
from .reasoning import ChoiceReasoning
from .sampling import resolve_max_tokens
from .serving import Choice, Item, OpenAIServing, Starter, Usage, single_stream
from .state import ServerState
from .structured import (
    Constraint,
    compile_constraint,
    compile_tool_parameters,
    requested_constraint,
)
from .tools import ChoiceTools, Final, plan_tools

log = logging.getLogger("tallow.server")

_RESERVED_TEMPLATE_KEYS = {
    "chat_template",
    "messages",
    "tools",
    "add_generation_prompt",
    "documents",
}


class _Choice:
    """Bookkeeping of one of the ``n`` choices: the text given to its reasoning and tool
    parsers so far, the reasoning not yet sent and the tool parser's latest delta, the tokens
    whose logprobs were sent, whether it has ended."""

    def __init__(self, tools: ChoiceTools, reasoning: ChoiceReasoning) -> None:
        self.tools = tools
        self.reasoning = reasoning
        self.reasoning_delta = ""
        self.text_len = 0
        self.delta: StreamDelta | None = None
        self.tokens = 0
        self.finished = False
        self.started = False


class ChatCompletion(OpenAIServing[ChatCompletionRequest]):
    """One chat-completion request, from its parsed body to the response."""

    request_type = ChatCompletionRequest
    path = "/v1/chat/completions"
    prompt_param = "messages"
    id_prefix = "chatcmpl"
    response_object = "chat.completion"
    chunk_object = "chat.completion.chunk"

    def __init__(self, state: ServerState, req: ChatCompletionRequest) -> None:
        super().__init__(state, req)
        self.top = (req.top_logprobs or 0) if req.logprobs else None
        structured = state.structured
        self.plan = plan_tools(
            req.tools,
            req.tool_choice,
            req.parallel_tool_calls,
            state.tool_parsing,
            constrain=structured is not None and structured.available,
        )
        self.prompt_ids: list[int] = []
        #: the rendered prompt of the latest :meth:`prepare` (what the reasoning parser is told)
        self.prompt_text = ""
        #: the request's images, in the order of their parts (a model that takes images)
        self.images: list[Any] = []
        self._choices: list[_Choice] = []

    async def start(self) -> tuple[Starter, int]:
        ids, params, prompt = await self.prepare()
        extra = self.image_kwargs()
        return (
            lambda: single_stream(
                self.state.engine.generate(
                    ids, params, self.id, prompt=prompt, priority=self.req.priority or 0, **extra
                )
            ),
            self.req.n or 1,
        )

    def image_kwargs(self) -> dict[str, Any]:
        """What ``engine.generate`` is given besides the prompt: the request's images, if
        it has some."""
        return {"images": self.images} if self.images else {}

    async def load_images(self) -> None:
        """Decode the images of the request's ``image_url`` parts (within the server's
        limits) into :attr:`images`."""
        self.images = [
            await load_image_url(url, self.state.image_policy, param=param)
            for url, param in image_urls(self.req.messages)
        ]

    async def prepare(
        self, messages: list[dict[str, object]] | None = None, budget: int | None = None
    ) -> tuple[list[int], SamplingParams, str]:
        """Render and tokenize the prompt of ``messages`` (normalized; default: the request's)
        and build the sampling parameters (``budget``: most tokens to generate instead of the
        request's own limit)."""
        self.state.check_fanout(1, self.req.n or 1)
        if messages is None:
            messages = normalize_messages(self.req.messages, images=self.state.takes_images)
        if self.state.takes_images and not self.images:
            await self.load_images()
        kwargs = dict(self.req.chat_template_kwargs or {})
        for key in sorted(set(kwargs) & _RESERVED_TEMPLATE_KEYS):
            # the template is the model's: a request may pass variables, not replace it
            raise invalid(
                f"chat_template_kwargs.{key}",
                f"Invalid value for 'chat_template_kwargs': {key!r} cannot be set by a request.",
            )
        effort = self.req.reasoning_effort
        if effort is not None:
            template = getattr(self.state.tokenizer, "chat_template", None)
            if not isinstance(template, str) or "reasoning_effort" not in template:
                raise unsupported("reasoning_effort", "the served model does not reason")
            if not isinstance(effort, str):
                raise invalid("reasoning_effort", "'reasoning_effort' must be a string.")
            kwargs.setdefault("reasoning_effort", effort)
        prompt = await self.state.render_chat(messages, self.plan.prompt_tools, kwargs=kwargs)
        prompt += self.plan.prompt_suffix
        ids = await self.state.encode(prompt, add_special_tokens=False, field="messages")
        self.prompt_ids = ids
        self.prompt_text = prompt
        param = (
            "max_completion_tokens" if self.req.max_completion_tokens is not None else "max_tokens"
        )
        requested = budget or self.req.max_completion_tokens or self.req.max_tokens
        max_tokens = resolve_max_tokens(
            requested, len(ids), self.state.max_model_len, "messages", param
        )
        spec = await self._output_constraint()
        params = self.sampling_params(max_tokens, self.top, structured_outputs=spec)
        if self.keeps_special_tokens():
            params.skip_special_tokens = False
        return ids, params, prompt

    def keeps_special_tokens(self) -> bool:
        """Whether the output is detokenized with its special tokens: a parser that reads this
        request's output declares ``reads_special_tokens`` (harmony's markup is made of them).
        The reasoning parser reads every response; the tool parsers read it when the request
        uses tools. This overrides the request's ``skip_special_tokens``, which the parser's
        markup would otherwise lose; the parsers keep that markup out of the content."""
        parsers: list[type[object] | None] = [self.state.reasoning.parser]
        if self.plan.mode != "none":
            parsers += [self.plan.parser_cls, *self.plan.fallback_cls]
        return any(
            bool(getattr(p, "reads_special_tokens", False)) for p in parsers if p is not None
        )

    async def _output_constraint(self) -> GrammarSpec | None:
        """The GrammarSpec the output must match (compiled already), or None: a forced tool
        call under a grammar, or what the request asks for (response_format and friends)."""
        asked = requested_constraint(self.req)
        if self.plan.forced and self.plan.constrained:
            if asked is not None:
                field = asked.field.split(".")[0]
                raise invalid(
                    field,
                    f"{field!r} cannot be combined with a forced "
                    "'tool_choice': the output is the tool call.",
                )
            call = Constraint(self.plan.call_spec(), "tool_choice")
            await compile_tool_parameters(self.state, self.plan.tools or [], call)
            return call.spec
        if asked is None:
            return None
        await compile_constraint(self.state, asked)
        return asked.spec

    # -- following the outputs ----------------------------------------------------------
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    def received(self, item: Item) -> None:
        """Give each choice's new text to its tool parser."""
        _, out = item
        if self.images and out.prompt_token_ids:
            # the engine expanded each image into its tokens: they are prompt tokens too
            self.prompt_ids = list(out.prompt_token_ids)
        if not self._choices:
            parser = self.state.reasoning.parser
            self._choices = [
                _Choice(
                    self.plan.choice(stream_calls=True),
                    ChoiceReasoning(parser, self.prompt_text),
                )
                for _ in out.outputs
            ]
        for o in out.outputs:
            c = self._choices[o.index]
            if c.finished:
                continue
            new_text = o.text[c.text_len :]
            c.text_len = len(o.text)
            split = c.reasoning.feed(new_text) if new_text else None
            if split is not None:
                c.reasoning_delta += split.reasoning
            c.delta = c.tools.feed(split.content) if split and split.content else None

    def can_stop(self) -> bool:
        return all(c.finished or c.tools.complete for c in self._choices)

    @staticmethod
    def tool_finish_reason(o: CompletionOutput, final: Final, tools: ChoiceTools) -> str:
        """A choice's finish reason once its tool calls are known."""
        if final.tool_calls:
            return "length" if tools.truncated else "tool_calls"
        if tools.complete:
            return "stop"
        return OpenAIServing.engine_finish_reason(o)

    def _logprobs(self, o: CompletionOutput, start: int, end: int) -> dict[str, object]:
        assert o.logprobs is not None  # asked for: the engine reports them
        return {
            "content": chat_logprobs(
                o.logprobs[start:end], o.token_ids[start:end], self.top or 0, self.state.token_text
            ),
            "refusal": None,
        }

    # -- whole response -----------------------------------------------------------------
    def choices(self) -> list[Choice]:
        result: list[Choice] = []
        for o in self.latest[0].outputs:
            choice = self._choices[o.index]
            tools = choice.tools
            split = choice.reasoning.split(o.text)
            final = tools.final(split.content)
            message: dict[str, object] = {
                "role": "assistant",
                "content": final.content,
                "refusal": None,
            }
            if self.shows_reasoning():
                message["reasoning_content"] = split.reasoning or None
            if final.tool_calls:
                message["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments},
                    }
                    for c in final.tool_calls
                ]
            logprobs = None
            if self.top is not None and o.logprobs is not None:
                logprobs = self._logprobs(o, 0, self.reported(o))
            result.append(
                {
                    "index": o.index,
                    "message": message,
                    "logprobs": logprobs,
                    "finish_reason": self.tool_finish_reason(o, final, tools),
                }
            )
        return result

    def shows_reasoning(self) -> bool:
        """Whether responses carry ``reasoning_content``: a reasoning parser is configured and
        the request did not turn it off (``include_reasoning: false``)."""
        return self.state.reasoning.parser is not None and self.req.include_reasoning is not False

    # -- stream -------------------------------------------------------------------------
    def choice_chunks(self, item: Item, usage: Usage | None) -> list[str]:
        _, out = item
        return [
            chunk
            for o in out.outputs
            for chunk in self._choice_chunks(self._choices[o.index], o, usage)
        ]

    def closing_chunks(self, usage: Usage | None) -> list[str]:
        return [
            chunk
            for o in self.latest[0].outputs
            for chunk in self._choice_chunks(self._choices[o.index], o, usage, force=True)
        ]

    def _choice_chunks(
        self, c: _Choice, o: CompletionOutput, usage: Usage | None, force: bool = False
    ) -> list[str]:
        if c.finished:
            return []
        chunks: list[str] = []
        if not c.started:
            c.started = True
            chunks.append(
                self.chunk(
                    [
                        {
                            "index": o.index,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ],
                    usage,
                )
            )
        delta, c.delta = c.delta, None
        logprobs = None
        shown = self.reported(o)
        if self.top is not None and o.logprobs is not None and shown > c.tokens:
            logprobs = self._logprobs(o, c.tokens, shown)
        c.tokens = max(c.tokens, shown)
        pieces = [delta] if delta else []
        ending = o.finished or force
        if ending:
            rest = c.reasoning.finish()
            c.reasoning_delta += rest.reasoning
            if rest.content:
                more = c.tools.feed(rest.content)
                pieces += [more] if more else []
            pieces += c.tools.finish()
        thought, c.reasoning_delta = c.reasoning_delta, ""
        if thought and self.shows_reasoning():
            chunks.append(
                self.chunk(
                    [
                        {
                            "index": o.index,
                            "delta": {"reasoning_content": thought},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ],
                    usage,
                )
            )
        for i, piece in enumerate(pieces):
            chunks.append(
                self.chunk(
                    [
                        {
                            "index": o.index,
                            "delta": _delta_dict(piece),
                            "logprobs": logprobs if i == 0 else None,
                            "finish_reason": None,
                        }
                    ],
                    usage,
                )
            )
        if not pieces and logprobs is not None:
            chunks.append(
                self.chunk(
                    [
                        {
                            "index": o.index,
                            "delta": {"content": ""},
                            "logprobs": logprobs,
                            "finish_reason": None,
                        }
                    ],
                    usage,
                )
            )
        if ending:
            c.finished = True
            if any(p.tool_calls for p in pieces) or c.tools.sent_calls:
                reason = "length" if c.tools.truncated else "tool_calls"
            elif force:
                reason = "stop"
            else:
                reason = self.engine_finish_reason(o)
            self.reasons[o.index] = reason
            chunks.append(
                self.chunk(
                    [{"index": o.index, "delta": {}, "logprobs": None, "finish_reason": reason}],
                    usage,
                )
            )
        return chunks


def _delta_dict(piece: StreamDelta) -> dict[str, object]:
    delta: dict[str, object] = {}
    if piece.content or not piece.tool_calls:
        delta["content"] = piece.content
    if piece.tool_calls:
        calls = []
        for t in piece.tool_calls:
            entry: dict[str, object] = {"index": t.index}
            fn: dict[str, str] = {}
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
