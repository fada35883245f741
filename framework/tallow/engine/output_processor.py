"""Turns the core's token updates into :class:`RequestOutput` objects: incremental
detokenization, stop strings, logprobs with decoded tokens.

It runs on the caller's side (the asyncio thread of the server, or the ``LLM`` loop), never on
the thread that drives the device.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from .core_output import CoreOutput, TokenUpdate
from .detokenizer import IncrementalDetokenizer
from .outputs import CompletionOutput, Logprob, RequestOutput
from .sampling.params import SamplingParams
from .tokenizer import Tokenizer


@dataclass
class _Completion:
    detok: IncrementalDetokenizer
    output: CompletionOutput
    full_text: str = ""  # all detokenized text, before stop-string handling
    emitted: int = 0  # characters of full_text released into output.text


@dataclass
class RequestState:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    completions: list[_Completion]
    arrival: float = field(default_factory=time.time)
    first_token: float | None = None
    num_cached_tokens: int = 0
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    finished: bool = False
    stream: bool = True  # False: build an output only when the request finishes
    #: characters held back from the text while they could still become a stop string
    stop_hold: int = 0


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.requests: dict[str, RequestState] = {}

    def add_request(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        stream: bool = True,
    ) -> RequestState:
        completions = []
        for i in range(params.n):
            detok = IncrementalDetokenizer(
                self.tokenizer,
                prompt_token_ids,
                skip_special_tokens=params.skip_special_tokens,
                spaces_between_special_tokens=params.spaces_between_special_tokens,
            )
            out = CompletionOutput(
                index=i,
                logprobs=[] if params.logprobs is not None else None,
                cumulative_logprob=0.0 if params.logprobs is not None else None,
            )
            completions.append(_Completion(detok, out))
        state = RequestState(
            request_id, prompt, list(prompt_token_ids), params, completions, stream=stream
        )
        state.stop_hold = max((len(s) for s in params.stop), default=1) - 1
        if params.prompt_logprobs is not None:
            state.prompt_logprobs = []
        self.requests[request_id] = state
        return state

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Mark a request aborted; returns its final output (or None if unknown)."""
        state = self.requests.pop(request_id, None)
        if state is None:
            return None
        for c in state.completions:
            if c.output.finish_reason is None:
                c.output.finish_reason = "abort"
        state.finished = True
        return self._make_output(state)

    # -----------------------------------------------------------------------------------
    def process(self, core_out: CoreOutput) -> tuple[list[RequestOutput], list[tuple[str, int]]]:
        """Apply one step's updates.

        Returns the outputs of requests that changed, and the (request_id, index) completions
        that a stop string ended — the caller must finish them in the core.
        """
        touched: dict[str, RequestState] = {}
        to_stop: list[tuple[str, int]] = []
        now = time.time()
        for request_id, lps in core_out.prompt_logprobs.items():
            state = self.requests.get(request_id)
            if state is not None and state.prompt_logprobs is not None:
                state.prompt_logprobs.extend(self._decode_logprobs(e) for e in lps)
        for request_id, cached in core_out.num_cached_tokens.items():
            state = self.requests.get(request_id)
            if state is not None:
                state.num_cached_tokens = cached
        for update in core_out.updates:
            state = self.requests.get(update.request_id)
            if state is None:
                continue
            completion = state.completions[update.index]
            if completion.output.finish_reason is not None:
                continue  # a token sampled before the core heard of a stop string
            if state.first_token is None:
                state.first_token = now
            if self._apply(state, completion, update):
                to_stop.append((update.request_id, update.index))
            touched[update.request_id] = state
        outputs = []
        for state in touched.values():
            if all(c.output.finish_reason is not None for c in state.completions):
                state.finished = True
                self.requests.pop(state.request_id, None)
            if state.stream or state.finished:
                outputs.append(self._make_output(state))
        return outputs, to_stop

    def _apply(self, state: RequestState, c: _Completion, update: TokenUpdate) -> bool:
        """Add one token; True when a stop string ended this completion."""
        params = state.params
        out = c.output
        token = update.token
        out.token_ids.append(token.token_id)
        if out.logprobs is not None and token.logprob is not None:
            entry = {
                token.token_id: Logprob(token.logprob, token.rank, self._token_text(token.token_id))
            }
            for rank, (tid, lp) in enumerate(token.top, start=1):
                entry.setdefault(tid, Logprob(lp, rank, self._token_text(tid)))
            out.logprobs.append(entry)
            out.cumulative_logprob = (out.cumulative_logprob or 0.0) + token.logprob
        c.full_text += c.detok.push(token.token_id)
        if update.finish_reason is not None:
            c.full_text += c.detok.flush()  # release bytes held back for a UTF-8 sequence
        stopped = False
        if update.finish_reason is not None:
            out.finish_reason, out.stop_reason = update.finish_reason, update.stop_reason
        elif params.stop and len(out.token_ids) >= params.min_tokens:
            hit = _find_stop(c.full_text, params.stop, c.emitted)
            if hit is not None:
                pos, stop = hit
                end = pos + len(stop) if params.include_stop_str_in_output else pos
                c.full_text = c.full_text[:end]
                out.finish_reason, out.stop_reason = "stop", stop
                stopped = True
        if out.finish_reason is not None:
            c.emitted = len(c.full_text)
        else:
            # Hold back what could still become a stop string, so it never reaches a client.
            c.emitted = max(c.emitted, len(c.full_text) - state.stop_hold)
        out.text = c.full_text[: c.emitted]
        return stopped

    def _token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def _decode_logprobs(self, entry: dict[int, Logprob] | None) -> dict[int, Logprob] | None:
        if entry is None:
            return None
        for tid, lp in entry.items():
            if lp.decoded_token is None:
                lp.decoded_token = self._token_text(tid)
        return entry

    def _make_output(self, state: RequestState) -> RequestOutput:
        outputs = [
            CompletionOutput(
                index=c.output.index,
                text=c.output.text,
                token_ids=list(c.output.token_ids),
                cumulative_logprob=c.output.cumulative_logprob,
                logprobs=list(c.output.logprobs) if c.output.logprobs is not None else None,
                finish_reason=c.output.finish_reason,
                stop_reason=c.output.stop_reason,
            )
            for c in state.completions
        ]
        metrics = {"arrival_time": state.arrival}
        if state.first_token is not None:
            metrics["first_token_time"] = state.first_token
        if state.finished:
            metrics["finished_time"] = time.time()
        return RequestOutput(
            request_id=state.request_id,
            prompt=state.prompt,
            prompt_token_ids=state.prompt_token_ids,
            outputs=outputs,
            finished=state.finished,
            prompt_logprobs=list(state.prompt_logprobs)
            if state.prompt_logprobs is not None
            else None,
            num_cached_tokens=state.num_cached_tokens,
            metrics=metrics,
        )


def _find_stop(text: str, stops: list[str], emitted: int) -> tuple[int, str] | None:
    """The earliest stop string in the not-yet-emitted tail of ``text``."""
    best: tuple[int, str] | None = None
    for stop in stops:
        if not stop:
            continue
        pos = text.find(stop, max(0, emitted - len(stop) + 1))
        if pos != -1 and (best is None or pos < best[0]):
            best = (pos, stop)
    return best
