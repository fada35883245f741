"""Streaming token ids to text, emitting only text that later tokens cannot change.

Decoding one token at a time is wrong in two ways: a character whose UTF-8 bytes span several
tokens decodes to U+FFFD until its last byte arrives, and SentencePiece decoders treat the first
token of a text specially (they drop its leading space). So the detokenizer decodes a short window
of recent tokens twice — without and with the new tokens — and emits the difference:

- ``prefix_offset..read_offset``: tokens already emitted, kept as context;
- ``read_offset..end``: tokens not yet emitted.

When the window's text ends in U+FFFD (an incomplete character) nothing is emitted and the offsets
stay, so the bytes are decoded together once the character is complete. Byte-fallback models
(``<0xNN>`` tokens) need more: their decoder turns a whole run of byte tokens into U+FFFD when
any byte of the run is invalid, so text is held while the run may still grow (the last token is a
byte token). Both decodes of a window
start at the same token, so any first-token rule of the decoder applies equally to both and
cancels out. The concatenated output therefore equals ``tokenizer.decode(output_ids)``.
"""

from __future__ import annotations

import weakref
from typing import Sequence

from .tokenizer import Tokenizer

_REPLACEMENT = "\ufffd"

#: tokenizer -> (texts of single tokens without skipping special tokens, with skipping): the
#: context a detokenizer keeps is usually the one token emitted last, and decoding it on every
#: step cost as much as decoding the new window. Shared by every sequence of the tokenizer.
_ONE_TOKEN_TEXTS: weakref.WeakKeyDictionary[Tokenizer, tuple[dict[int, str], dict[int, str]]] = (
    weakref.WeakKeyDictionary()
)


def _one_token_texts(tokenizer: Tokenizer, skip_special_tokens: bool) -> dict[int, str]:
    try:
        texts = _ONE_TOKEN_TEXTS.setdefault(tokenizer, ({}, {}))
    except TypeError:  # a tokenizer that cannot be weakly referenced or hashed: no sharing
        return {}
    return texts[bool(skip_special_tokens)]


class IncrementalDetokenizer:
    """Text of one sequence's output tokens, delivered as they are generated.

    ``tokenizer`` is a :class:`tallow.engine.tokenizer.Tokenizer` (anything with
    ``decode(ids, skip_special_tokens=...)``). ``prompt_token_ids`` identifies the request; the text
    is that of the output alone, exactly ``tokenizer.decode(output_ids, skip_special_tokens)``.
    ``spaces_between_special_tokens`` is accepted for API compatibility: the tokenizer's decoder
    decides how special tokens join text.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_token_ids: Sequence[int] = (),
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        self.prompt_token_ids = list(prompt_token_ids)
        self.skip_special_tokens = skip_special_tokens
        self.spaces_between_special_tokens = spaces_between_special_tokens
        self.output_token_ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self._prefix_text = ""
        self._pieces: list[str] = []
        self._text_cache: str | None = ""
        self._byte_ids: frozenset[int] = frozenset(getattr(tokenizer, "byte_fallback_ids", ()))
        is_special = getattr(tokenizer, "is_special", None)
        self._skipped = is_special if (skip_special_tokens and is_special) else (lambda _: False)
        self._one_token_texts = _one_token_texts(tokenizer, skip_special_tokens)

    def _decode(self, ids: Sequence[int]) -> str:
        if not ids:
            return ""
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def _decode_context(self, ids: list[int]) -> str:
        """``_decode(ids)``, from the shared cache when ``ids`` is one token."""
        if len(ids) != 1:
            return self._decode(ids)
        text = self._one_token_texts.get(ids[0])
        if text is None:
            text = self._one_token_texts[ids[0]] = self._decode(ids)
        return text

    def push(self, token_id: int) -> str:
        """Add one generated token; return the text it makes final (possibly ``""``)."""
        self.output_token_ids.append(int(token_id))
        return self._advance(final=False)

    def push_many(self, token_ids: Sequence[int]) -> str:
        """Add several tokens at once (e.g. speculative or multi-step output)."""
        self.output_token_ids.extend(int(t) for t in token_ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """Emit whatever is held back (an incomplete character at the very end of generation).

        Call once when the sequence finishes; afterwards ``text`` equals
        ``tokenizer.decode(output_token_ids)``.
        """
        return self._advance(final=True)

    def _in_byte_run(self) -> bool:
        """True when the last token the decoder sees is a byte-fallback token."""
        if not self._byte_ids:
            return False
        for tid in reversed(self.output_token_ids):
            if not self._skipped(tid):
                return tid in self._byte_ids
        return False

    def _advance(self, final: bool) -> str:
        ids = self.output_token_ids
        if self._read_offset >= len(ids):
            return ""
        if not final and self._in_byte_run():
            return ""
        window = self._decode(ids[self._prefix_offset :])
        if not final and window.endswith(_REPLACEMENT):
            return ""
        if not window.startswith(self._prefix_text):
            # Not expected from a prefix-stable decoder; fall back to the whole text so the
            # output stays exactly decode(output_ids).
            full = self._decode(ids)
            delta = full[len(self.text) :] if full.startswith(self.text) else ""
        else:
            delta = window[len(self._prefix_text) :]
        if not delta and not final:
            # e.g. a skipped special token: keep the window, nothing to emit yet.
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(ids)
        self._prefix_text = self._decode_context(ids[self._prefix_offset : self._read_offset])
        if delta:
            self._pieces.append(delta)
            self._text_cache = None
        return delta

    @property
    def text(self) -> str:
        """All text emitted so far."""
        if self._text_cache is None:
            self._text_cache = "".join(self._pieces)
        return self._text_cache


__all__ = ["IncrementalDetokenizer"]
