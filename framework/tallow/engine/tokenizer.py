"""The engine's tokenizer: a ``tokenizers.Tokenizer`` plus its ``tokenizer_config``.

Every weight format hands the engine a ``tokenizers.Tokenizer`` and a
``tokenizer_config.json``-style dict (:class:`tallow.plugin.Checkpoint`). This class gives them
the behaviour of a Hugging Face fast tokenizer loaded from the same files: the same ids from
``encode`` (BOS/EOS added as the config says), the same text from ``decode``, and chat templates
rendered in the same environment (:mod:`tallow.engine.chat_template`).
"""

from __future__ import annotations

import functools
import json
import pathlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tallow.plugin import Checkpoint

from .chat_template import ChatTemplateError, render_chat_template

_SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")
#: texts longer than this are tokenized by the library's GIL-releasing batch call
_GIL_FREE_CHARS = 8192


def _token_content(value: Any) -> str | None:  # Any: a config's raw special token, checked here
    """A special token as configs write it: a string, or an AddedToken dict with ``content``."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        content = value.get("content")
        if isinstance(content, str):
            return content
    raise ValueError(
        f"tokenizer_config: a special token must be a string or {{'content': str}}, got {value!r}"
    )


def _ids(value: Any) -> list[int]:  # Any: a config's raw id or ids, checked here
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


def _clean_up_spaces(text: str) -> str:
    # The WordPiece-era cleanup transformers applies when clean_up_tokenization_spaces is set.
    for before, after in (
        (" .", "."),
        (" ?", "?"),
        (" !", "!"),
        (" ,", ","),
        (" ' ", "'"),
        (" n't", "n't"),
        (" 'm", "'m"),
        (" 's", "'s"),
        (" 've", "'ve"),
        (" 're", "'re"),
    ):
        text = text.replace(before, after)
    return text


class Tokenizer:
    """Text ↔ token ids, and chat templates, for one model.

    ``tokenizer`` is a ``tokenizers.Tokenizer``. Its post-processor decides what
    ``encode(add_special_tokens=True)`` adds, as with transformers loading a ``tokenizer.json``;
    a tokenizer without one gets a post-processor built from the config's ``add_bos_token`` /
    ``add_eos_token`` (the given tokenizer object is modified then).
    """

    def __init__(
        self,
        tokenizer: Any,
        tokenizer_config: Mapping[str, Any]
        | None = None,  # Any: a tokenizers.Tokenizer; the library is untyped
        generation_config: Mapping[str, Any] | None = None,
    ) -> None:
        if tokenizer is None or not hasattr(tokenizer, "encode"):
            raise ValueError(
                f"Tokenizer needs a tokenizers.Tokenizer, got {type(tokenizer).__name__}"
            )
        self._tok = tokenizer
        self.tokenizer_config: dict[str, Any] = dict(tokenizer_config or {})
        self.generation_config: dict[str, Any] = dict(generation_config or {})
        self.special_tokens: dict[str, str] = {}
        for name in _SPECIAL_NAMES:
            content = _token_content(self.tokenizer_config.get(name))
            if content is not None:
                self.special_tokens[name] = content
        cfg = self.tokenizer_config
        # A tokenizer.json may carry padding and truncation settings (sentence-transformers'
        # pad every input to 128 tokens); transformers turns them off unless a call asks for
        # them, and so does tallow: ids are exactly the text's.
        if getattr(tokenizer, "padding", None) is not None:
            tokenizer.no_padding()
        if getattr(tokenizer, "truncation", None) is not None:
            tokenizer.no_truncation()
        if tokenizer.post_processor is None:
            self._set_post_processor(bool(cfg.get("add_bos_token")), bool(cfg.get("add_eos_token")))
        self._special_ids = self._collect_special_ids()
        self._is_bpe = type(tokenizer.model).__name__ == "BPE"
        self._byte_fallback_ids: frozenset[int] | None = None

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint) -> "Tokenizer":
        """The tokenizer a :class:`tallow.plugin.Checkpoint` carries.

        Raises ``ValueError`` when the checkpoint has none (with the format's reason if it gave
        one), so that the caller can point the user at ``model.tokenizer``.
        """
        if checkpoint.tokenizer is None:
            reason = (checkpoint.extra or {}).get("tokenizer_error")
            raise ValueError(
                f"the model source {checkpoint.source!r} carries no usable tokenizer"
                + (f" ({reason})" if reason else "")
                + "; set model.tokenizer to a directory with the model's tokenizer.json "
                "(--tokenizer, TALLOW_MODEL__TOKENIZER, tokenizer: in the YAML file's model "
                "section, or LLM(tokenizer=...))"
            )
        return cls(checkpoint.tokenizer, checkpoint.tokenizer_config, checkpoint.generation_config)

    @classmethod
    def from_directory(cls, path: str | pathlib.Path) -> "Tokenizer":
        """A tokenizer from ``tokenizer.json`` (+ ``tokenizer_config.json`` and
        ``generation_config.json`` when present) in a directory."""
        from tokenizers import Tokenizer as HFTokenizer

        root = pathlib.Path(path).expanduser()
        tok_file = root / "tokenizer.json"
        if not tok_file.is_file():
            raise ValueError(
                f"model.tokenizer {str(path)!r}: expected a directory containing tokenizer.json"
            )

        def read_json(name: str) -> dict[str, Any]:
            file = root / name
            if not file.is_file():
                return {}
            try:
                data = json.loads(file.read_text(encoding="utf-8"))
            except ValueError as exc:
                raise ValueError(f"{file}: not valid JSON ({exc})") from None
            if not isinstance(data, dict):
                raise ValueError(f"{file}: expected a JSON object")
            return data

        config = read_json("tokenizer_config.json")
        template_file = root / "chat_template.jinja"
        if "chat_template" not in config and template_file.is_file():
            config["chat_template"] = template_file.read_text(encoding="utf-8")
        return cls(
            HFTokenizer.from_file(str(tok_file)), config, read_json("generation_config.json")
        )

    def _set_post_processor(self, add_bos: bool, add_eos: bool) -> None:
        from tokenizers import processors

        bos, eos = self.special_tokens.get("bos_token"), self.special_tokens.get("eos_token")
        bos_id = self._tok.token_to_id(bos) if bos is not None else None
        eos_id = self._tok.token_to_id(eos) if eos is not None else None
        add_bos = add_bos and bos_id is not None
        add_eos = add_eos and eos_id is not None
        head = [f"{bos}:0"] if add_bos else []
        tail = [f"{eos}:0"] if add_eos else []
        single = " ".join([*head, "$A:0", *tail])
        pair = " ".join(
            [single, *([f"{bos}:1"] if add_bos else []), "$B:1", *([f"{eos}:1"] if add_eos else [])]
        )
        pairs = ([(bos, bos_id)] if add_bos else []) + ([(eos, eos_id)] if add_eos else [])
        self._tok.post_processor = processors.TemplateProcessing(
            single=single, pair=pair, special_tokens=pairs
        )

    def _collect_special_ids(self) -> frozenset[int]:
        ids = {i for i, tok in self._tok.get_added_tokens_decoder().items() if tok.special}
        for content in self.special_tokens.values():
            tid = self._tok.token_to_id(content)
            if tid is not None:
                ids.add(tid)
        return frozenset(ids)

    # -- ids -----------------------------------------------------------------------------
    @property
    def backend(self) -> Any:
        """The underlying ``tokenizers.Tokenizer``."""
        return self._tok

    @property
    def vocab_size(self) -> int:
        """Number of token ids the tokenizer knows, added tokens included."""
        size: int = self._tok.get_vocab_size(with_added_tokens=True)
        return size

    def _id_of(self, name: str) -> int | None:
        content = self.special_tokens.get(name)
        return self._tok.token_to_id(content) if content is not None else None

    @property
    def bos_token_id(self) -> int | None:
        return self._id_of("bos_token")

    @property
    def eos_token_id(self) -> int | None:
        return self._id_of("eos_token")

    @property
    def pad_token_id(self) -> int | None:
        return self._id_of("pad_token")

    @property
    def unk_token_id(self) -> int | None:
        return self._id_of("unk_token")

    @property
    def eos_token_ids(self) -> set[int]:
        """Ids that end generation: the EOS token and the generation config's ``eos_token_id``."""
        ids = set(_ids(self.generation_config.get("eos_token_id")))
        if self.eos_token_id is not None:
            ids.add(self.eos_token_id)
        return ids

    @property
    def all_special_ids(self) -> list[int]:
        """Ids of every special token (added tokens marked special, and bos/eos/unk/pad)."""
        return sorted(self._special_ids)

    def get_vocab(self) -> dict[str, int]:
        vocab: dict[str, int] = self._tok.get_vocab(with_added_tokens=True)
        return vocab

    # -- text ↔ ids ----------------------------------------------------------------------
    def _encoding(self, text: str, add_special_tokens: bool) -> Any:  # Any: tokenizers.Encoding
        # The library's batch call releases the GIL while it works and its single call does
        # not: a long text goes through the batch call, so other threads (the server's event
        # loop) run while it is tokenized in a worker thread.
        if len(text) > _GIL_FREE_CHARS:
            return self._tok.encode_batch([text], add_special_tokens=add_special_tokens)[0]
        return self._tok.encode(text, add_special_tokens=add_special_tokens)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; with ``add_special_tokens`` the post-processor adds BOS/EOS."""
        if not isinstance(text, str):
            raise TypeError(f"encode expects a str, got {type(text).__name__}")
        ids: list[int] = self._encoding(text, add_special_tokens).ids
        return ids

    @functools.cached_property
    def max_token_chars(self) -> int:
        """The most characters of text one token stands for (the longest vocabulary entry,
        added tokens included): ``n`` tokens never hold more than ``n * max_token_chars``
        characters, so a longer text is known too long before it is tokenized."""
        return max((len(piece) for piece in self.get_vocab()), default=1) or 1

    def encode_truncated(self, text: str, max_tokens: int) -> list[int]:
        """Token ids of ``text`` with special tokens, at most ``max_tokens`` of them: the text's
        own tokens are cut (at the end, or at the start when ``tokenizer_config`` says
        ``truncation_side: left``) so that they and the special tokens fit, as transformers
        truncates with ``truncation=True, max_length=max_tokens``."""
        if not isinstance(text, str):
            raise TypeError(f"encode_truncated expects a str, got {type(text).__name__}")
        special = self._tok.num_special_tokens_to_add(False)
        if max_tokens < special:
            raise ValueError(
                f"cannot fit an input into {max_tokens} tokens: the tokenizer adds "
                f"{special} special tokens"
            )
        encoding = self._encoding(text, False)
        if len(encoding.ids) > max_tokens - special:
            side = "left" if self.tokenizer_config.get("truncation_side") == "left" else "right"
            encoding.truncate(max_tokens - special, direction=side)
        ids: list[int] = self._tok.post_process(encoding, add_special_tokens=True).ids
        return ids

    def encode_batch(
        self, texts: Sequence[str], add_special_tokens: bool = True
    ) -> list[list[int]]:
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"encode_batch: texts[{i}] is {type(text).__name__}, not str")
        return [
            e.ids
            for e in self._tok.encode_batch(list(texts), add_special_tokens=add_special_tokens)
        ]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """The text of ``ids``; special tokens are left out when ``skip_special_tokens``."""
        text: str = self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)
        # The cleanup was designed for WordPiece and would drop real spaces from BPE output.
        if self.tokenizer_config.get("clean_up_tokenization_spaces") and not self._is_bpe:
            text = _clean_up_spaces(text)
        return text

    def convert_ids_to_tokens(self, ids: int | Iterable[int]) -> Any:
        """Vocabulary strings of ``ids`` (one string for one int); None for an unknown id."""
        if isinstance(ids, int):
            return self._tok.id_to_token(ids)
        return [self._tok.id_to_token(i) for i in ids]

    def convert_tokens_to_ids(self, tokens: str | Iterable[str]) -> Any:
        if isinstance(tokens, str):
            return self._tok.token_to_id(tokens)
        return [self._tok.token_to_id(t) for t in tokens]

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_ids

    @property
    def byte_fallback_ids(self) -> frozenset[int]:
        """Ids of the ``<0xNN>`` byte tokens of a byte-fallback (SentencePiece-style) model;
        empty for other models. Their text depends on the bytes around them, which the
        detokenizer needs to know."""
        if self._byte_fallback_ids is None:
            ids: set[int] = set()
            if getattr(self._tok.model, "byte_fallback", False):
                for b in range(256):
                    tid = self._tok.token_to_id(f"<0x{b:02X}>")
                    if tid is not None:
                        ids.add(tid)
            self._byte_fallback_ids = frozenset(ids)
        return self._byte_fallback_ids

    # -- chat ----------------------------------------------------------------------------
    @property
    def chat_template(self) -> str | None:
        """The model's chat template (a Jinja source), or None if it has none.

        A config holding several named templates (a list of ``{"name", "template"}``) yields
        the one named ``default``.
        """
        template = self.tokenizer_config.get("chat_template")
        if isinstance(template, list):
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            return named.get("default")
        return template

    def _named_template(self, name: str) -> str | None:
        """A named template: from the HF list form of ``chat_template``, or from
        ``named_chat_templates`` (``{name: template}``, as GGUF files store extra ones)."""
        template = self.tokenizer_config.get("chat_template")
        if isinstance(template, list):
            for t in template:
                if isinstance(t, dict) and t.get("name") == name:
                    return t.get("template")
        named = self.tokenizer_config.get("named_chat_templates")
        if isinstance(named, Mapping):
            found = named.get(name)
            if isinstance(found, str):
                return found
        return None

    def apply_chat_template(
        self,
        messages: Sequence[Any],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        chat_template: str | None = None,
        time_limit_s: float | None = None,
        **template_kwargs: Any,
    ) -> str:  # Any: extra template variables, any value
        """The prompt text for ``messages``, rendered as transformers' ``apply_chat_template``
        renders it (``tokenize=False``).

        ``chat_template`` overrides the model's; with ``tools`` a ``tool_use`` named template is
        preferred when the config has one. ``template_kwargs`` become template variables
        (``documents``, ``continue_final_message``, ``enable_thinking``, ...). ``time_limit_s``
        bounds the render (see :func:`tallow.engine.chat_template.render_chat_template`). Raises
        ``ValueError`` (:class:`ChatTemplateError`) if there is no template or it fails.
        """
        template = chat_template
        if template is None and tools:
            template = self._named_template("tool_use")
        if template is None:
            template = self.chat_template
        if not template:
            raise ChatTemplateError(
                "the model has no chat template (tokenizer_config has no chat_template); use "
                "the completions API or pass a chat template"
            )
        documents = template_kwargs.pop("documents", None)
        continue_final = bool(template_kwargs.pop("continue_final_message", False))
        return render_chat_template(
            template,
            messages,
            tools=tools,
            documents=documents,
            add_generation_prompt=add_generation_prompt and not continue_final,
            continue_final_message=continue_final,
            special_tokens=self.special_tokens,
            time_limit_s=time_limit_s,
            **template_kwargs,
        )

    def __repr__(self) -> str:
        return (
            f"Tokenizer(vocab_size={self.vocab_size}, "
            f"bos={self.special_tokens.get('bos_token')!r}, "
            f"eos={self.special_tokens.get('eos_token')!r})"
        )


__all__ = ["Tokenizer"]
