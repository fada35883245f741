"""The xgrammar grammar backend: tallow's grammar contract on ``xgrammar``'s compiler and
matchers.

The vocabulary reaches xgrammar as raw bytes per token (``VocabType.RAW``): tallow has already
undone the tokenizer's own encoding, so no guessing of the vocabulary type happens here.
Tokens without bytes are given to xgrammar as empty strings, which it treats as special tokens
that a grammar never allows.

JSON outputs are compact by default (no whitespace between tokens, ``,`` and ``:`` as
separators). Whatever xgrammar allows, a JSON row's mask is also cleared of tokens that hold
a raw control character, which no JSON text may contain (xgrammar's length-bounded string
rule lets them through), and of UTF-16 surrogates encoded as UTF-8 (``ED A0``..``ED BF``),
which are not UTF-8 but which xgrammar's string rule allows: a surrogate's three bytes decode to
three replacement characters, so its string would fail ``maxLength`` and the text would not be
UTF-8. Within a token those bytes are cleared like control characters; across tokens, a row
whose last token ends with ``ED`` loses the tokens that start with ``A0``..``BF``.
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np
import torch
import xgrammar as xgr

from tallow.plugin import (
    GrammarBackend,
    GrammarError,
    GrammarMatcher,
    GrammarSpec,
    TokenizerInfo,
    plugin_settings,
)

from .plugin import DISTRIBUTION
from .schema_support import regex_problem, unenforced
from .settings import XGrammarSettings

log = logging.getLogger("tallow.grammar.xgrammar")

try:  # the bindings behind xgr.BatchGrammarMatcher (see _batch_accept)
    from xgrammar.matcher import _core as _xgr_core
except ImportError:  # pragma: no cover - a later xgrammar may move them
    _xgr_core = None

_CONTROL = re.compile(rb"[\x00-\x1f]|\xed[\xa0-\xbf]")
_CONTROL_BUT_WHITESPACE = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f]|\xed[\xa0-\xbf]")
#: the lead byte of a three-byte sequence that would encode a surrogate if the next byte were
#: A0..BF
_SURROGATE_LEAD = 0xED
# xgrammar prefixes its messages with a timestamp and its source location
_SOURCE_PREFIX = re.compile(r"^\[[^\]]*\]\s*\S+:\d+:\s*")


def _message(exc: BaseException) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return _SOURCE_PREFIX.sub("", first)


def _batch_accept(matchers: list["XGrammarMatcher"], tokens: list[int]) -> list[Any]:
    """``BatchGrammarMatcher.batch_accept_token``: each matcher accepts its token (in C++,
    with the GIL released), one truthy result each. Called on the bindings when they are
    where xgrammar 0.2 keeps them: its wrapper reads the result array back one indexed call
    per row, where a slice reads it in one."""
    if _xgr_core is None:
        return xgr.BatchGrammarMatcher.batch_accept_token([m.inner for m in matchers], tokens)
    got = _xgr_core.BatchGrammarMatcher.batch_accept_token(
        [m.native for m in matchers], tokens, False
    )
    return got[0 : len(got)]


def _ebnf_literal(text: str) -> str:
    """``text`` as an EBNF string literal."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _rows_of(token_ids: Sequence[int], vocab_size: int) -> torch.Tensor:
    """A one-row bitmask with the bits of ``token_ids`` set."""
    bits = torch.zeros(((vocab_size + 31) // 32) * 32, dtype=torch.bool)
    bits[list(token_ids)] = True
    weights = torch.tensor([1 << i for i in range(31)] + [-(1 << 31)], dtype=torch.int64)
    words = (bits.view(-1, 32).to(torch.int64) * weights).sum(-1)
    return words.to(torch.int32)


def _runs(rows: Iterable[int]) -> list[tuple[int, int]]:
    """``rows`` (ascending or not) as ``[start, stop)`` runs of consecutive rows."""
    runs: list[tuple[int, int]] = []
    for row in rows:
        if runs and runs[-1][1] == row:
            runs[-1] = (runs[-1][0], row + 1)
        else:
            runs.append((row, row + 1))
    return runs


@dataclass(frozen=True)
class _Compiled:
    grammar: Any  # xgrammar.CompiledGrammar
    #: a JSON grammar: its masks lose the tokens holding control characters or surrogates
    json: bool


class XGrammarMatcher(GrammarMatcher):
    """One sequence's place in its grammar (an ``xgrammar.GrammarMatcher``)."""

    def __init__(self, backend: "XGrammarBackend", compiled: _Compiled) -> None:
        self.backend = backend
        self.json = compiled.json
        self.inner = xgr.GrammarMatcher(compiled.grammar)
        #: the bindings' matcher behind ``inner`` (the wrapper's methods, each a Python call
        #: and a property read more, run for every constrained row every step)
        self.native = self.inner._handle if _xgr_core is not None else self.inner
        self._ended: bool | None = None  # is_terminated, worked out once per state
        #: per accepted token: whether it ends with a surrogate's lead byte (JSON grammars)
        self._lead_last: list[bool] = []

    @property
    def after_surrogate_lead(self) -> bool:
        """The last accepted token ends with ``ED`` (its next byte must not be A0..BF)."""
        return bool(self._lead_last) and self._lead_last[-1]

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        self.inner.fill_next_token_bitmask(bitmask, row)
        if self.json:
            bitmask[row] &= self.backend.json_tokens
            if self.after_surrogate_lead:
                bitmask[row] &= self.backend.no_surrogate_tail

    def accept(self, token_id: int) -> bool:
        if self.is_terminated():  # xgrammar would still take the stop token here
            return False
        accepted = self.inner.accept_token(token_id)
        if accepted:
            self.accepted(token_id)
        return accepted

    def accepted(self, token_id: int) -> None:
        """Note that ``self.inner`` has just accepted ``token_id``."""
        self._ended = None
        if self.json:
            self._lead_last.append(token_id in self.backend.surrogate_leads)

    def is_terminated(self) -> bool:
        if self._ended is None:
            self._ended = self._nothing_may_follow()
        return self._ended

    def _nothing_may_follow(self) -> bool:
        if self.native.is_terminated():
            return True
        if not self.native.is_completed():
            return False
        scratch = torch.empty(1, self.backend.tokenizer.bitmask_words, dtype=torch.int32)
        self.fill_bitmask(scratch, 0)
        return not bool((scratch[0] & ~self.backend.eos_tokens).any())

    def rollback(self, num_tokens: int) -> None:
        if num_tokens:
            self.inner.rollback(num_tokens)
            del self._lead_last[-num_tokens:]
            self._ended = None


class XGrammarBackend(GrammarBackend):
    """JSON Schema, regex, choice and EBNF grammars compiled by xgrammar (see the module
    docstring); settings under ``plugins.settings.tallow-grammar-xgrammar``."""

    name = "xgrammar"
    kinds = ("json", "regex", "choice", "grammar")
    matcher_type = XGrammarMatcher

    def __init__(self, tokenizer: TokenizerInfo, config: Any = None) -> None:
        super().__init__(tokenizer, config)
        self.settings = plugin_settings(XGrammarSettings, config, DISTRIBUTION)
        vocab = [b or b"" for b in tokenizer.token_bytes]
        vocab += [b""] * (tokenizer.vocab_size - len(vocab))
        info = xgr.TokenizerInfo(
            vocab,
            xgr.VocabType.RAW,
            vocab_size=tokenizer.vocab_size,
            stop_token_ids=list(tokenizer.eos_token_ids),
        )
        self._info = info
        # tallow caches compiled grammars itself (by spec), so xgrammar's cache stays off
        self.compiler = xgr.GrammarCompiler(
            info, max_threads=self.settings.max_threads, cache_enabled=False
        )
        control = _CONTROL_BUT_WHITESPACE if self.settings.any_whitespace else _CONTROL
        json_ok = [i for i, b in enumerate(vocab) if not control.search(b)]
        #: one bitmask row: the tokens a JSON text may hold anywhere
        self.json_tokens = _rows_of(json_ok, tokenizer.vocab_size)
        self._json_words = self.json_tokens.numpy()
        #: tokens that end with a surrogate's lead byte, and one bitmask row: the tokens that
        #: may follow one (those not starting with A0..BF)
        self.surrogate_leads = frozenset(
            i for i, b in enumerate(vocab) if b[-1:] == bytes([_SURROGATE_LEAD])
        )
        self.no_surrogate_tail = _rows_of(
            [i for i, b in enumerate(vocab) if not 0xA0 <= (b[0] if b else 0) <= 0xBF],
            tokenizer.vocab_size,
        )
        self._no_surrogate_tail_words = self.no_surrogate_tail.numpy()
        #: one bitmask row: the EOS tokens
        self.eos_tokens = _rows_of(tokenizer.eos_token_ids, tokenizer.vocab_size)
        self._batch = xgr.BatchGrammarMatcher(self.settings.max_threads)
        self._batch_lock = threading.Lock()

    def compile(self, spec: GrammarSpec) -> _Compiled:
        try:
            if spec.kind == "json":
                return _Compiled(self._compile_json(spec), json=True)
            if spec.kind == "regex":
                why = regex_problem(spec.value)  # type: ignore[arg-type]
                if why:
                    raise GrammarError(f"{why} cannot be enforced by xgrammar")
                return _Compiled(self.compiler.compile_regex(spec.value), json=False)
            if spec.kind == "choice":
                rule = " | ".join(_ebnf_literal(choice) for choice in spec.value)
                return _Compiled(self.compiler.compile_grammar(f"root ::= {rule}"), json=False)
            return _Compiled(self.compiler.compile_grammar(spec.value), json=False)
        except GrammarError:
            raise
        except Exception as exc:  # xgrammar reports every parse error as an exception
            raise GrammarError(
                f"xgrammar cannot compile the {spec.kind}: {_message(exc)}"
            ) from None

    def _compile_json(self, spec: GrammarSpec) -> Any:
        found = unenforced(spec.schema)
        if found is not None:
            path, problem = found
            raise GrammarError(problem, path)
        separators = None if self.settings.any_whitespace else (",", ":")
        return self.compiler.compile_json_schema(
            spec.value,
            any_whitespace=self.settings.any_whitespace,
            separators=separators,
            strict_mode=True,
        )

    def matcher(self, compiled: _Compiled) -> XGrammarMatcher:
        return XGrammarMatcher(self, compiled)

    exports_compiled = True

    def export_compiled(self, compiled: object) -> bytes:
        assert isinstance(compiled, _Compiled)
        kind = b"J" if compiled.json else b"G"
        return kind + compiled.grammar.serialize_json().encode("utf-8")

    def import_compiled(self, data: bytes) -> _Compiled:
        grammar = xgr.CompiledGrammar.deserialize_json(data[1:].decode("utf-8"), self._info)
        return _Compiled(grammar, json=data[:1] == b"J")

    def accept_tokens(
        self, matchers: Sequence[GrammarMatcher], tokens: Sequence[int]
    ) -> list[bool]:
        ours = self.own_matchers(matchers, "accept_tokens")
        # Termination comes from each matcher's cache where the stop checks have worked it
        # out (for every row the engine advances, they have): this runs for every
        # constrained row every step, on the engine thread.
        live = [m._ended is False or not m.is_terminated() for m in ours]
        if all(live):  # one call for the step: xgrammar advances them with the GIL released
            results = [bool(ok) for ok in _batch_accept(ours, list(tokens))]
        elif any(live):
            got = iter(
                _batch_accept(
                    [m for m, k in zip(ours, live) if k], [t for t, k in zip(tokens, live) if k]
                )
            )
            results = [bool(next(got)) if k else False for k in live]
        else:
            results = [False] * len(ours)
        for matcher, token, ok in zip(ours, tokens, results):
            if ok:
                matcher.accepted(token)
        return results

    def fill_bitmasks(
        self, matchers: Sequence[GrammarMatcher], bitmask: torch.Tensor, rows: Sequence[int]
    ) -> None:
        rows = list(rows)
        if len(matchers) < self.settings.parallel_rows:
            for matcher, row in zip(matchers, rows):
                matcher.fill_bitmask(bitmask, row)
            return
        ours = self.own_matchers(matchers, "fill_bitmasks")
        # What the rows need after xgrammar's fill is worked out before it: the engine's
        # grammar thread runs this beside the engine thread, and each stretch of Python after
        # the native fill (which releases the GIL) waits for the GIL again
        native = [m.native for m in ours]
        json_runs = _runs(row for m, row in zip(ours, rows) if m.json)
        after_lead = [row for m, row in zip(ours, rows) if m.json and m.after_surrogate_lead]
        with self._batch_lock:  # one batch matcher, its threads shared
            if _xgr_core is None:
                self._batch.batch_fill_next_token_bitmask(native, bitmask, rows)
            else:  # the wrapper's own list of handles would be made under the GIL again
                self._batch._handle.batch_fill_next_token_bitmask(native, bitmask, rows, False)
        words = bitmask.numpy()
        for start, stop in json_runs:
            # in place on a slice (indexing by a list of rows would copy them out and back),
            # by numpy: one thread, where torch would wake its whole CPU thread pool beside
            # the engine's thread
            np.bitwise_and(words[start:stop], self._json_words, out=words[start:stop])
        for row in after_lead:
            np.bitwise_and(words[row], self._no_surrogate_tail_words, out=words[row])
