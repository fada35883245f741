"""The engine's per-position logprobs → OpenAI's two logprobs shapes.

Chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}], "refusal": null}``.
Completions: ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``, where a prompt's
first position (echo) has no logprob and is ``null``.

A position is a dict token id → ``Logprob`` holding the chosen token and the top-k alternatives
(the chosen one may rank outside the top k). The alternatives are listed by rank.
"""

from __future__ import annotations

from typing import Callable, Collection, Sequence, TypedDict

from tallow.engine.outputs import CompletionOutput, Logprob, PositionLogprobs

TokenText = Callable[[int], str]


class CompletionLogprobs(TypedDict):
    """The ``logprobs`` of a completions choice (OpenAI's legacy shape)."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


def reported_tokens(
    output: CompletionOutput, eos_token_ids: Collection[int] = (), include_stop: bool = False
) -> int:
    """How many of ``output``'s tokens have logprobs reported.

    A token that ended the completion as a stop token (EOS, with ``stop_reason`` None, or one of
    ``stop_token_ids``, with ``stop_reason`` its id) is not part of the answer's text, so, as
    with OpenAI, it is not reported — unless stop strings were asked to stay in the output.
    """
    count = len(output.token_ids)
    if not count or include_stop or output.finish_reason != "stop":
        return count
    last = output.token_ids[-1]
    if output.stop_reason == last or (output.stop_reason is None and last in eos_token_ids):
        count -= 1
    return count


def _ranked(position: PositionLogprobs, k: int) -> list[tuple[int, Logprob]]:
    items = list(position.items())
    items.sort(
        key=lambda item: (item[1].rank if item[1].rank is not None else 1 << 30, -item[1].logprob)
    )
    return items[:k]


def _text(token_id: int, lp: Logprob | None, token_text: TokenText) -> str:
    decoded = getattr(lp, "decoded_token", None)
    return decoded if decoded is not None else token_text(token_id)


def _entry(text: str, logprob: float) -> dict[str, object]:
    # -inf is not JSON; OpenAI reports -9999.0 for tokens with no probability mass.
    value = max(float(logprob), -9999.0)
    return {"token": text, "logprob": value, "bytes": list(text.encode("utf-8"))}


def chat_logprobs(
    positions: Sequence[PositionLogprobs], token_ids: Sequence[int], top: int, token_text: TokenText
) -> list[dict[str, object]]:
    """The ``content`` list of a chat choice's ``logprobs`` for ``token_ids``."""
    out = []
    for token_id, position in zip(token_ids, positions):
        chosen = position.get(token_id)
        logprob = chosen.logprob if chosen is not None else float("-inf")
        entry = _entry(_text(token_id, chosen, token_text), logprob)
        entry["top_logprobs"] = (
            [_entry(_text(tid, lp, token_text), lp.logprob) for tid, lp in _ranked(position, top)]
            if top
            else []
        )
        out.append(entry)
    return out


def completion_logprobs(
    positions: Sequence[PositionLogprobs | None],
    token_ids: Sequence[int],
    top: int,
    token_text: TokenText,
    offset: int = 0,
) -> CompletionLogprobs:
    """A completion choice's ``logprobs``; ``offset`` is where the first token's text starts."""
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] = []
    text_offset: list[int] = []
    for token_id, position in zip(token_ids, positions):
        chosen = position.get(token_id) if position is not None else None
        text = _text(token_id, chosen, token_text)
        tokens.append(text)
        text_offset.append(offset)
        offset += len(text)
        if position is None:
            token_logprobs.append(None)
            top_logprobs.append(None)
            continue
        token_logprobs.append(max(chosen.logprob, -9999.0) if chosen is not None else -9999.0)
        alternatives = (
            {
                _text(tid, lp, token_text): max(lp.logprob, -9999.0)
                for tid, lp in _ranked(position, top)
            }
            if top
            else {}
        )
        top_logprobs.append(alternatives)
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top_logprobs,
        "text_offset": text_offset,
    }


def merge_completion_logprobs(
    first: CompletionLogprobs | None, second: CompletionLogprobs
) -> CompletionLogprobs:
    """``first`` followed by ``second`` (echoed prompt, then generated tokens)."""
    if first is None:
        return second
    return {
        "tokens": first["tokens"] + second["tokens"],
        "token_logprobs": first["token_logprobs"] + second["token_logprobs"],
        "top_logprobs": first["top_logprobs"] + second["top_logprobs"],
        "text_offset": first["text_offset"] + second["text_offset"],
    }
