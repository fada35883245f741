"""A grammar backend for choice lists and regular expressions, in plain Python.

Each step, a matcher tries every token of the vocabulary against its spec: a choice spec keeps
the tokens whose bytes continue one of the choices, a regex spec those after which the text
can still become a full match (the ``regex`` package's partial matching). That is a loop over
the whole vocabulary per step, which is fine for small vocabularies and tests; a production
backend precomputes automata over the vocabulary instead (tallow-grammar-xgrammar does).

Tokens that split a UTF-8 character are never allowed under a regex spec: the text must decode
after every token.
"""

from __future__ import annotations

from typing import Any, Callable

import regex
import torch

from tallow.plugin import GrammarBackend, GrammarError, GrammarMatcher, GrammarSpec

#: (viable, complete): whether text may still grow into a match, whether it is one
Oracle = tuple[Callable[[bytes], bool], Callable[[bytes], bool]]


def _choice_oracle(choices: tuple[str, ...]) -> Oracle:
    wanted = [c.encode() for c in choices]
    return (lambda text: any(w.startswith(text) for w in wanted),
            lambda text: text in wanted)


def _regex_oracle(pattern: str) -> Oracle:
    try:
        compiled = regex.compile(pattern)
    except regex.error as exc:
        raise GrammarError(f"not a regular expression: {exc}") from None

    def decoded(text: bytes) -> str | None:
        try:
            return text.decode("utf-8")
        except UnicodeDecodeError:
            return None

    def viable(text: bytes) -> bool:
        string = decoded(text)
        return string is not None and compiled.fullmatch(string, partial=True) is not None

    def complete(text: bytes) -> bool:
        string = decoded(text)
        return string is not None and compiled.fullmatch(string) is not None

    return viable, complete


class ScanMatcher(GrammarMatcher):
    def __init__(self, backend: "ScanBackend", oracle: Oracle) -> None:
        self.backend = backend
        self.viable, self.complete = oracle
        self.tokens: list[int] = []
        self.text = b""
        self.ended = False  # an EOS was accepted

    def allowed(self) -> list[int]:
        info = self.backend.tokenizer
        if self.ended:
            return []
        ids = [t for t, piece in enumerate(info.token_bytes)
               if piece is not None and self.viable(self.text + piece)]
        if self.complete(self.text):
            ids += info.eos_token_ids
        return ids

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        bits = torch.zeros(bitmask.shape[1] * 32, dtype=torch.int64)
        bits[self.allowed()] = 1
        words = (bits.view(-1, 32) << torch.arange(32)).sum(-1)
        bitmask[row] = ((words + 2**31) % 2**32 - 2**31).to(torch.int32)

    def accept(self, token_id: int) -> bool:
        if self.is_terminated() or token_id not in self.allowed():
            return False
        self.tokens.append(token_id)
        if token_id in self.backend.tokenizer.eos_token_ids:
            self.ended = True
        else:
            self.text += self.backend.tokenizer.token_bytes[token_id]
        return True

    def is_terminated(self) -> bool:
        if self.ended:
            return True
        eos = set(self.backend.tokenizer.eos_token_ids)
        return self.complete(self.text) and set(self.allowed()) <= eos

    def rollback(self, num_tokens: int) -> None:
        info = self.backend.tokenizer
        for token in reversed(self.tokens[len(self.tokens) - num_tokens:]):
            if token in info.eos_token_ids:
                self.ended = False
            else:
                self.text = self.text[:len(self.text) - len(info.token_bytes[token])]
        del self.tokens[len(self.tokens) - num_tokens:]


class ScanBackend(GrammarBackend):
    name = "{{ cookiecutter.component_name }}"
    kinds = ("regex", "choice")

    def compile(self, spec: GrammarSpec) -> Any:
        if spec.kind == "choice":
            return _choice_oracle(spec.value)  # type: ignore[arg-type]
        if spec.kind == "regex":
            return _regex_oracle(spec.value)  # type: ignore[arg-type]
        raise GrammarError(f"{spec.kind} specs are not supported (only regex and choice)")

    def matcher(self, compiled: Any) -> ScanMatcher:
        return ScanMatcher(self, compiled)
