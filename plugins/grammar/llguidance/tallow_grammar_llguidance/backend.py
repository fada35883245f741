"""The llguidance grammar backend: tallow's grammar contract on llguidance's ``LLMatcher``.

The vocabulary reaches llguidance as raw bytes per token, with a greedy encoder over them
(see :class:`_Tokens`). A token without bytes (EOS, control tokens, ids past the tokenizer's
vocabulary) is given a name that starts with ``0xFF``, which llguidance takes for a special
token that no grammar text can produce; a real token starting with that byte is never UTF-8,
so treating it as special loses no text either.

Each spec is compiled once into a matcher at its start; sequences get deep copies of it.
Every grammar is handed over as Lark with forcing off (see :func:`_lark`); a JSON Schema as
``%json``, its ``x-guidance`` options replaced by the backend's: compact JSON unless
``any_whitespace``, and never ``lenient`` (which would drop the keywords llguidance cannot
enforce instead of refusing them).
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any, Sequence

import llguidance as llg
import torch
from llguidance.gbnf_to_lark import any_to_lark
from llguidance.torch import fill_next_token_bitmask, fill_next_token_bitmask_par

from tallow.plugin import (
    GrammarBackend,
    GrammarError,
    GrammarMatcher,
    GrammarSpec,
    TokenizerInfo,
    plugin_settings,
)

from .plugin import DISTRIBUTION
from .schema_paths import refusal_path, skipped
from .settings import LLGuidanceSettings


_NO_FORCING = '%llguidance {"no_forcing": true}\n'
_PLACE = re.compile(r"^at \d+\(\d+\):\s*")
# the header llguidance's GBNF converter writes, with no options in it
_HEADER = re.compile(r"\A\s*%llguidance\s*\{\s*\}\s*\n")


class _Tokens:
    """What ``llguidance.TokenizerWrapper`` reads from a tokenizer. llguidance tokenizes the
    bytes a grammar forces (``"Paris" | "Par"`` after ``P`` forces ``ar``) and takes them as
    consumed by those tokens, so encoding must cover every byte it can: greedily, longest
    token first (any tokenization of forced bytes will do)."""

    def __init__(self, tokens: list[bytes], eos: int, special: list[int]) -> None:
        self.tokens = tokens
        self.eos_token_id = eos
        self.bos_token_id = None
        self.special_token_ids = special
        skip = set(special)
        self._ids = {b: i for i, b in enumerate(tokens) if i not in skip}
        self._longest = max((len(b) for b in self._ids), default=1)

    def __call__(self, text: bytes | str) -> list[int]:
        data = text.encode() if isinstance(text, str) else text
        out: list[int] = []
        at = 0
        while at < len(data):
            for size in range(min(self._longest, len(data) - at), 0, -1):
                token = self._ids.get(data[at : at + size])
                if token is not None:
                    out.append(token)
                    at += size
                    break
            else:  # no token holds this byte: no grammar text through it can be produced
                at += 1
        return out


def _tokenizer(info: TokenizerInfo) -> llg.LLTokenizer:
    tokens = [b if b else b"\xff<tallow_%d>" % i for i, b in enumerate(info.token_bytes)]
    tokens += [b"\xff<tallow_%d>" % i for i in range(len(tokens), info.vocab_size)]
    special = [i for i, b in enumerate(tokens) if b.startswith(b"\xff")]
    wrapper = llg.TokenizerWrapper(_Tokens(tokens, info.eos_token_ids[0], special))
    return llg.LLTokenizer(wrapper, n_vocab=info.vocab_size, eos_token=list(info.eos_token_ids))


def _lark(body: str) -> str:
    """A Lark grammar of ``body`` that llguidance does not force bytes in: where the grammar
    allows only one continuation, llguidance would otherwise allow only the tokens of its own
    tokenization of it, where the contract wants every token whose bytes continue it (the
    split halves of a multi-byte character, a shorter token)."""
    return _NO_FORCING + _HEADER.sub("", body, count=1)


def _message(error: str) -> str:
    """llguidance's error in one line, without its place in the Lark text the backend wrote
    (``at 2(8): ``) and with the reason of a regex error (given on a later line)."""
    lines = [line.strip() for line in error.strip().splitlines() if line.strip()]
    if not lines:
        return "invalid grammar"
    first = _PLACE.sub("", lines[0]).replace("failed to compile JSON schema: ", "")
    reason = next((line for line in lines[1:] if line.startswith("error: ")), None)
    return f"{first} {reason[len('error: ') :]}" if reason else first


class LLGuidanceMatcher(GrammarMatcher):
    """One sequence's place in its grammar (an ``llguidance.LLMatcher``)."""

    def __init__(self, inner: llg.LLMatcher) -> None:
        self.inner = inner

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        fill_next_token_bitmask(self.inner, bitmask, row)

    def accept(self, token_id: int) -> bool:
        # consume_token would put the matcher in a lasting error state on a refused token;
        # try_consume_tokens refuses it and leaves the state as it was
        if self.inner.is_stopped():
            return False
        return self.inner.try_consume_tokens([token_id]) == 1

    def is_terminated(self) -> bool:
        # stopped: EOS was taken, or the grammar admits no more bytes (only EOS may follow)
        return self.inner.is_stopped()

    def rollback(self, num_tokens: int) -> None:
        if num_tokens and not self.inner.rollback(num_tokens):
            raise RuntimeError(
                f"llguidance cannot roll back {num_tokens} tokens: {self.inner.get_error()}"
            )


class LLGuidanceBackend(GrammarBackend):
    """JSON Schema, regex, choice and GBNF grammars compiled by llguidance (see the module
    docstring); settings under ``plugins.settings.tallow-grammar-llguidance``."""

    name = "llguidance"
    kinds = ("json", "regex", "choice", "grammar")
    matcher_type = LLGuidanceMatcher

    def __init__(self, tokenizer: TokenizerInfo, config: Any = None) -> None:
        super().__init__(tokenizer, config)
        self.settings = plugin_settings(LLGuidanceSettings, config, DISTRIBUTION)
        self.lltokenizer = _tokenizer(tokenizer)
        self._executor = llg.LLExecutor(self.settings.max_threads)
        # options applied after the schema's own "x-guidance", so a request cannot loosen them
        self._json_options = {
            "whitespace_flexible": self.settings.any_whitespace,
            "lenient": False,
            "coerce_one_of": False,
        }
        if not self.settings.any_whitespace:
            self._json_options |= {"item_separator": ",", "key_separator": ":"}
        self._lock = threading.Lock()

    def compile(self, spec: GrammarSpec) -> llg.LLMatcher:
        # LLMatcher reports a grammar it cannot build through is_error, never by raising
        matcher = llg.LLMatcher(self.lltokenizer, self._grammar(spec), log_level=0)
        if matcher.is_error():
            message = matcher.get_error()
            path = refusal_path(spec.schema, message) if spec.kind == "json" else ""
            what = "enforce this JSON Schema" if spec.kind == "json" else f"compile the {spec.kind}"
            raise GrammarError(f"llguidance cannot {what}: {_message(message)}", path)
        return matcher

    def _grammar(self, spec: GrammarSpec) -> str:
        if spec.kind == "json":
            found = skipped(spec.schema)
            if found is not None:
                raise GrammarError(found[1], found[0])
            schema = spec.schema
            if isinstance(schema, dict):  # the schema's own options give way to ours
                schema = {**schema, "x-guidance": self._json_options}
            elif schema is True:
                schema = {"x-guidance": self._json_options}
            return _lark(f"start: %json {json.dumps(schema, ensure_ascii=False)}")
        if spec.kind == "regex":
            made = json.loads(llg.LLMatcher.grammar_from_regex(spec.value))  # type: ignore
            return _lark(made["grammars"][0]["lark_grammar"])
        if spec.kind == "choice":
            # JSON string literals are Lark string literals, escapes included
            return _lark("start: " + " | ".join(json.dumps(c) for c in spec.value))
        try:
            return _lark(any_to_lark(spec.value))  # type: ignore[arg-type]
        except Exception as exc:  # the GBNF converter reports every error as an exception
            raise GrammarError(f"llguidance cannot read the GBNF grammar: {exc}") from None

    def matcher(self, compiled: llg.LLMatcher) -> LLGuidanceMatcher:
        return LLGuidanceMatcher(compiled.deep_copy())

    def fill_bitmasks(
        self, matchers: Sequence[GrammarMatcher], bitmask: torch.Tensor, rows: Sequence[int]
    ) -> None:
        if len(matchers) < self.settings.parallel_rows:
            for matcher, row in zip(matchers, rows):
                matcher.fill_bitmask(bitmask, row)
            return
        ours = self.own_matchers(matchers, "fill_bitmasks")
        with self._lock:  # one executor, its threads shared
            fill_next_token_bitmask_par(
                self._executor, [(m.inner, row) for m, row in zip(ours, rows)], bitmask
            )
