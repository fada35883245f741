"""``POST /v1/completions``: text completions, whole or streamed, with ``echo`` and logprobs.

``prompt`` may be a string, a list of strings, a list of token ids or a list of such lists;
each prompt gets ``n`` choices, numbered ``prompt_index * n + i`` as OpenAI numbers them.
``max_tokens: 0`` is accepted together with ``echo`` (scoring a prompt: its logprobs, no
completion).

:class:`TextCompletion` is the completions side of
:class:`~tallow.server.serving.OpenAIServing`: prompts taken as given (text or token ids), and
choices shaped as text with OpenAI's completions logprobs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import AsyncIterator

from tallow.engine.outputs import CompletionOutput, RequestOutput
from tallow.engine.sampling.params import SamplingParams

from .errors import invalid
from .logprobs import CompletionLogprobs, completion_logprobs, merge_completion_logprobs
from .protocol import CompletionRequest
from .sampling import resolve_max_tokens
from .serving import Choice, Item, OpenAIServing, Starter, Usage, merge_streams
from .state import ServerState
from .structured import compile_constraint, requested_constraint


@dataclass
class _Prompt:
    text: str
    ids: list[int]


@dataclass
class _Sent:
    """What the stream has sent of one choice: text characters, tokens with logprobs, and
    where the next token's text starts (``text_offset``)."""

    text: int = 0
    tokens: int = 0
    offset: int = 0


class TextCompletion(OpenAIServing[CompletionRequest]):
    """One completions request, from its parsed body to the response."""

    request_type = CompletionRequest
    path = "/v1/completions"
    prompt_param = "prompt"
    id_prefix = "cmpl"
    response_object = "text_completion"
    chunk_object = "text_completion"

    def __init__(self, state: ServerState, req: CompletionRequest) -> None:
        super().__init__(state, req)
        self.n = req.n or 1
        self.echo = bool(req.echo)
        self.top = req.logprobs
        self.score_only = req.max_tokens == 0
        if self.score_only and not self.echo:
            raise invalid(
                "max_tokens",
                "Invalid value for 'max_tokens': 0 is only allowed "
                "with 'echo' (to score the prompt); expected at least 1.",
            )
        self.prompts: list[_Prompt] = []
        self._sent: dict[int, _Sent] = {}  # by choice index
        self._done: set[int] = set()

    async def start(self) -> tuple[Starter, int]:
        params = await self.prepare()
        self.prompt_count = len(params)

        def begin() -> AsyncIterator[Item]:
            return merge_streams(
                [
                    self.state.engine.generate(
                        p.ids, sp, f"{self.id}-{i}", prompt=p.text, priority=self.req.priority or 0
                    )
                    for i, (p, sp) in enumerate(zip(self.prompts, params))
                ]
            )

        return begin, len(params) * self.n

    async def prepare(self) -> list[SamplingParams]:
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
                    raise invalid(
                        where, f"Invalid value for {where!r}: token ids must be in 0..{vocab - 1}."
                    )
                ids = list(item)
                text = await self.state.run_blocking(
                    lambda ids=ids: self.state.tokenizer.decode(ids, skip_special_tokens=False),
                    size=len(ids) * 4,
                )
            if not ids:
                raise invalid(where, f"Invalid value for {where!r}: the prompt is empty.")
            self.prompts.append(_Prompt(text, ids))
            # scoring (max_tokens 0) generates one token that is never shown
            requested = None if self.req.max_tokens is None else max(1, self.req.max_tokens)
            max_tokens = resolve_max_tokens(requested, len(ids), self.state.max_model_len, where)
            param_list.append(
                self.sampling_params(
                    max_tokens,
                    self.top,
                    prompt_logprobs=self.top if self.echo and self.top is not None else None,
                    structured_outputs=asked.spec if asked is not None else None,
                )
            )
        return param_list

    # -- shapes -------------------------------------------------------------------------
    def prompt_tokens(self) -> int:
        return sum(len(p.ids) for p in self.prompts)

    def completion_tokens(self) -> int:
        return 0 if self.score_only else super().completion_tokens()

    def _prompt_logprobs(self, p: int, out: RequestOutput) -> CompletionLogprobs | None:
        if self.top is None or not self.echo:
            return None
        positions = out.prompt_logprobs or [None] * len(self.prompts[p].ids)
        return completion_logprobs(
            list(positions), self.prompts[p].ids, self.top, self.state.token_text
        )

    def _finish_reason(self, o: CompletionOutput) -> str:
        return "length" if self.score_only else self.engine_finish_reason(o)

    # -- whole response -----------------------------------------------------------------
    def choices(self) -> list[Choice]:
        choices: list[Choice] = []
        for p in sorted(self.latest):
            out = self.latest[p]
            prompt_lp = self._prompt_logprobs(p, out)
            for o in out.outputs:
                text = "" if self.score_only else o.text
                logprobs = None
                if self.top is not None:
                    offset = len(self.prompts[p].text) if self.echo else 0
                    shown = 0 if self.score_only else self.reported(o)
                    gen_lp = completion_logprobs(
                        (o.logprobs or [])[:shown],
                        o.token_ids[:shown],
                        self.top,
                        self.state.token_text,
                        offset,
                    )
                    logprobs = merge_completion_logprobs(prompt_lp, gen_lp)
                choices.append(
                    {
                        "index": p * self.n + o.index,
                        "text": (self.prompts[p].text if self.echo else "") + text,
                        "logprobs": logprobs,
                        "finish_reason": self._finish_reason(o),
                    }
                )
        choices.sort(key=lambda c: c["index"])
        return choices

    # -- stream -------------------------------------------------------------------------
    def choice_chunks(self, item: Item, usage: Usage | None) -> list[str]:
        p, out = item
        return [chunk for o in out.outputs for chunk in self._choice_chunks(p, out, o, usage)]

    def _choice_chunks(
        self, p: int, out: RequestOutput, o: CompletionOutput, usage: Usage | None
    ) -> list[str]:
        index = p * self.n + o.index
        if index in self._done:
            return []
        chunks = []
        prefix = ""
        logprobs = None
        sent = self._sent.get(index)
        if sent is None:
            sent = self._sent[index] = _Sent()
            if self.echo:
                prefix = self.prompts[p].text
                logprobs = self._prompt_logprobs(p, out)
                sent.offset = len(prefix)
        new_text = "" if self.score_only else o.text[sent.text :]
        sent.text = len(o.text)
        shown = self.reported(o)
        if (
            self.top is not None
            and not self.score_only
            and o.logprobs is not None
            and shown > sent.tokens
        ):
            piece = completion_logprobs(
                o.logprobs[sent.tokens : shown],
                o.token_ids[sent.tokens : shown],
                self.top,
                self.state.token_text,
                sent.offset,
            )
            sent.offset += sum(len(t) for t in piece["tokens"])
            logprobs = merge_completion_logprobs(logprobs, piece)
        sent.tokens = max(sent.tokens, shown)
        if prefix or new_text or logprobs is not None:
            chunks.append(
                self.chunk(
                    [
                        {
                            "index": index,
                            "text": prefix + new_text,
                            "logprobs": logprobs,
                            "finish_reason": None,
                        }
                    ],
                    usage,
                )
            )
        if o.finished or self.score_only:
            self._done.add(index)
            reason = self.reasons[index] = self._finish_reason(o)
            chunks.append(
                self.chunk(
                    [{"index": index, "text": "", "logprobs": None, "finish_reason": reason}], usage
                )
            )
        return chunks


create_completion = TextCompletion.serve
