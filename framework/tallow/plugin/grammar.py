"""Structured outputs: the contract of a grammar backend.

A grammar backend turns what a request asks its output to match — a JSON Schema, a regular
expression, a list of choices or an EBNF grammar (a :class:`GrammarSpec`) — into a compiled
grammar for the served model's vocabulary (a :class:`TokenizerInfo`), and gives each
constrained sequence a :class:`GrammarMatcher`. Every step, the engine asks the matchers of the
constrained sequences for the tokens that may come next, as a packed bitmask, masks the other
tokens' logits on the device before sampling, and feeds each sampled token back to its
matcher; a sequence whose grammar is finished stops.

The engine owns what every backend would otherwise repeat: the compile cache (by
:attr:`GrammarSpec.key`), the bitmask buffers, the mask kernel, keeping each matcher in step
with its sequence's tokens (:meth:`GrammarMatcher.rollback` when tokens are taken back), and the
choice of backend (:func:`tallow.plugin.select`, setting ``runner.grammar_backend``).

Bitmask layout (the same for every backend and the kernel): a row holds
``ceil(vocab_size / 32)`` int32 words; token ``t`` may come next iff bit ``t % 32`` of word
``t // 32`` is set.

This module imports no torch; tensors appear in annotations only.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Sequence

from .components import Component

if TYPE_CHECKING:  # pragma: no cover
    from tallow.config import TallowConfig
    import torch

#: what a :class:`GrammarSpec` may describe
GRAMMAR_KINDS = ("json", "regex", "choice", "grammar")


def bitmask_words(vocab_size: int) -> int:
    """int32 words in one bitmask row over ``vocab_size`` tokens."""
    return (vocab_size + 31) // 32


class GrammarError(ValueError):
    """A spec the backend cannot compile, or cannot enforce exactly.

    ``path`` says where in the spec the problem is: for a JSON Schema the dotted path of the
    keyword from the schema's root (``"properties.tags.uniqueItems"``), ``""`` for the spec as
    a whole; ``problem`` says what is wrong. The server answers 400 with the path appended to
    the request field that held the spec.
    """

    def __init__(self, problem: str, path: str = "") -> None:
        super().__init__(f"{path}: {problem}" if path else problem)
        self.problem = problem
        self.path = path


@dataclass(frozen=True)
class GrammarSpec:
    """What one constrained output must match.

    - ``"json"``: ``value`` is a JSON Schema as JSON text; the output is one JSON value valid
      against it (a backend may write it with or without whitespace between tokens).
    - ``"regex"``: ``value`` is a regular expression the whole output matches.
    - ``"choice"``: ``value`` is a tuple of strings; the output is exactly one of them.
    - ``"grammar"``: ``value`` is an EBNF grammar in GBNF notation (llama.cpp's: rules
      ``name ::= ...``, string literals, character classes, ``| * + ?``, a ``root`` rule); the
      output is a sentence of ``root``.

    Build JSON specs with :meth:`json_schema`, which writes the schema canonically (property
    order kept: it is the order a backend writes properties in).
    """

    kind: str
    value: str | tuple[str, ...]

    def __post_init__(self) -> None:
        if self.kind not in GRAMMAR_KINDS:
            raise ValueError(
                f"grammar kind must be one of {', '.join(GRAMMAR_KINDS)}, got {self.kind!r}"
            )
        if self.kind == "choice":
            if (
                not isinstance(self.value, tuple)
                or not self.value
                or not all(isinstance(c, str) for c in self.value)
            ):
                raise ValueError("a choice spec's value is a non-empty tuple of strings")
        elif not isinstance(self.value, str) or not self.value:
            raise ValueError(f"a {self.kind} spec's value is a non-empty string")

    @classmethod
    def json_schema(cls, schema: Mapping[str, object] | bool) -> "GrammarSpec":
        """The spec of a JSON Schema given as a mapping (or a boolean schema)."""
        return cls("json", json.dumps(schema, ensure_ascii=False, separators=(",", ":")))

    @property
    def schema(self) -> Any:  # Any: parsed JSON
        """The JSON Schema of a ``"json"`` spec, parsed."""
        if self.kind != "json":
            raise ValueError(f"a {self.kind} spec has no JSON Schema")
        assert isinstance(self.value, str)  # __post_init__ checked a "json" spec's value
        return json.loads(self.value)

    @property
    def key(self) -> str:
        """A digest naming the spec: equal specs have equal keys (the compile cache's key)."""
        body = json.dumps([self.kind, self.value], ensure_ascii=False)
        return hashlib.sha256(body.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class TokenizerInfo:
    """The served model's vocabulary, as grammars see it.

    ``vocab_size`` is the width of the model's logits (bitmask rows cover it); it may exceed
    the tokenizer's own vocabulary. ``token_bytes[t]`` is the text token ``t`` stands for, as
    raw bytes (a byte-level token may hold part of a UTF-8 character); None for a token that
    produces no text in an output (control and special tokens, unused ids), which a grammar
    never allows. Ids at and past ``len(token_bytes)`` are treated as None.
    ``eos_token_ids`` end an output; a matcher allows them exactly where its grammar may end.
    """

    vocab_size: int
    token_bytes: tuple[bytes | None, ...]
    eos_token_ids: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.token_bytes) > self.vocab_size:
            raise ValueError(
                f"token_bytes has {len(self.token_bytes)} entries, more than "
                f"vocab_size={self.vocab_size}"
            )
        if not self.eos_token_ids:
            raise ValueError("eos_token_ids: at least one token must end an output")
        for token in self.eos_token_ids:
            if not 0 <= token < self.vocab_size:
                raise ValueError(
                    f"eos_token_ids: {token} is not a token id below {self.vocab_size}"
                )

    @property
    def bitmask_words(self) -> int:
        return bitmask_words(self.vocab_size)


class GrammarMatcher:
    """Where one constrained sequence stands in its grammar.

    The engine calls, on the thread that drives the device:

    - :meth:`fill_bitmask` before each token is sampled (the engine has passed every earlier
      token to :meth:`accept` by then);
    - :meth:`accept` with each sampled token (through :meth:`GrammarBackend.accept_tokens`,
      for the whole step at once), and then :meth:`is_terminated`;
    - :meth:`rollback` when tokens it accepted are taken back from the sequence.
    """

    def fill_bitmask(self, bitmask: "torch.Tensor", row: int) -> None:
        """Write row ``row`` of ``bitmask`` (a CPU int32 tensor [rows, words], see the module
        docstring): the bit of token ``t`` set iff ``t`` may come next — its bytes continue
        the grammar, or it is an EOS token and the text so far is complete — and every other
        bit clear (tokens without bytes, ids past the vocabulary). Does not change the
        state."""
        raise NotImplementedError

    def accept(self, token_id: int) -> bool:
        """Advance by ``token_id``. Returns False, leaving the state unchanged, for a token the
        grammar does not allow here or after termination. Accepting an EOS token where the
        grammar may end terminates the matcher."""
        raise NotImplementedError

    def is_terminated(self) -> bool:
        """True once nothing more may follow: an EOS token was accepted, or the text is
        complete and no token but EOS could continue it. The engine ends the sequence then
        (finish reason ``"stop"``) without sampling the EOS."""
        raise NotImplementedError

    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens (termination included), as though they
        had never been accepted. ``num_tokens`` is at most the number accepted."""
        raise NotImplementedError


class GrammarBackend(Component):
    """Compiles :class:`GrammarSpec` s for one vocabulary and makes their matchers.

    Registered through ``tallow_register_grammar_backends``; the engine builds one instance as
    ``cls(tokenizer, config)`` (``tokenizer`` the served model's :class:`TokenizerInfo`,
    ``config`` the :class:`tallow.config.TallowConfig`; settings under
    ``plugins.settings.<distribution>``) when the first constrained request arrives, and calls
    it from several threads (the server compiles off its event loop): :meth:`compile` must be
    thread-safe.

    :attr:`kinds` lists the spec kinds it compiles; the engine refuses the others itself.
    """

    #: the :data:`GRAMMAR_KINDS` this backend compiles
    kinds: ClassVar[tuple[str, ...]] = ()
    #: the :class:`GrammarMatcher` subclass :meth:`matcher` makes (see :meth:`own_matchers`)
    matcher_type: ClassVar[type[GrammarMatcher]] = GrammarMatcher

    def __init__(self, tokenizer: TokenizerInfo, config: TallowConfig | None = None) -> None:
        self.tokenizer = tokenizer
        self.config = config

    def compile(self, spec: GrammarSpec) -> object:
        """The compiled grammar of ``spec`` (any object :meth:`matcher` takes; the engine caches
        it by :attr:`GrammarSpec.key` and shares it between sequences). Raises
        :class:`GrammarError` for a spec that is malformed or that the backend cannot enforce
        exactly — a JSON Schema keyword it would ignore, say: an output that the grammar
        allows must satisfy the spec."""
        raise NotImplementedError

    def matcher(self, compiled: object) -> GrammarMatcher:
        """A fresh matcher at the start of ``compiled``."""
        raise NotImplementedError

    #: whether :meth:`export_compiled` and :meth:`import_compiled` work: the engine then
    #: compiles in a worker process of its own, which it stops when a compile overruns
    #: ``runner.grammar_compile_timeout_s``
    exports_compiled: ClassVar[bool] = False

    def export_compiled(self, compiled: object) -> bytes:
        """``compiled`` (from :meth:`compile`) as bytes that :meth:`import_compiled` of another
        instance of this backend, built for the same vocabulary, turns back into it."""
        raise NotImplementedError

    def import_compiled(self, data: bytes) -> object:
        """The compiled grammar :meth:`export_compiled` wrote."""
        raise NotImplementedError

    def accept_tokens(
        self, matchers: Sequence[GrammarMatcher], tokens: Sequence[int]
    ) -> list[bool]:
        """``matchers[i].accept(tokens[i])`` for every ``i``: whether each was accepted. A
        backend may advance them in one call; the engine calls this once per step with the
        token each constrained sequence has just sampled."""
        return [matcher.accept(token) for matcher, token in zip(matchers, tokens)]

    def own_matchers(
        self, matchers: Sequence[GrammarMatcher], what: str
    ) -> list[Any]:  # Any: the backend's own matcher_type, for its library
        """``matchers`` as a list, each checked to be a :attr:`matcher_type`: a batched
        :meth:`accept_tokens` or :meth:`fill_bitmasks` that hands their native states to its
        library must not be given another backend's matchers. Raises ``TypeError`` naming
        ``what`` otherwise."""
        ours = [m for m in matchers if isinstance(m, self.matcher_type)]
        if len(ours) != len(matchers):
            raise TypeError(f"{what} takes this backend's matchers only")
        return ours

    def fill_bitmasks(
        self, matchers: Sequence[GrammarMatcher], bitmask: "torch.Tensor", rows: Sequence[int]
    ) -> None:
        """``matchers[i].fill_bitmask(bitmask, rows[i])`` for every ``i``. A backend may do it
        in parallel; the engine calls this once per step for all constrained rows."""
        for matcher, row in zip(matchers, rows):
            matcher.fill_bitmask(bitmask, row)
