"""A tiny tokenizer for tests: a word-level ``tokenizers`` tokenizer over a small vocabulary,
saved as a Hugging Face tokenizer directory (``tokenizer.json`` + ``tokenizer_config.json``)
next to a tiny checkpoint, so the engine can serve it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tokenizers import Tokenizer

#: special tokens first, so their ids are 0, 1, 2
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")
DEFAULT_WORDS = (
    "the a an of to in and is it on for with as at by from this that be are was "
    "hello world model token block cache plugin test fast slow red green blue one two three "
    "four five six seven eight nine ten . , ! ? : ; ( ) [ ] { }"
).split()
CHAT_TEMPLATE = (
    "{% for m in messages %}<s> {{ m.role }} : {{ m.content }} </s> {% endfor %}"
    "{% if add_generation_prompt %}<s> assistant : {% endif %}"
)


def tiny_tokenizer(words: tuple[str, ...] | list[str] = DEFAULT_WORDS) -> Tokenizer:
    """A word-level ``tokenizers.Tokenizer``: the special tokens, then ``words`` in order
    (split on whitespace and punctuation; unknown words become ``<unk>``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(dict.fromkeys([*SPECIAL_TOKENS, *words]))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()]
    )
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return tok


def save_tokenizer(
    directory: str | Path,
    tokenizer: Any | None = None,
    *,
    chat_template: str | None = CHAT_TEMPLATE,
) -> Path:
    """Write ``tokenizer`` (default: :func:`tiny_tokenizer`) and a ``tokenizer_config.json``
    (``<s>``/``</s>`` as BOS/EOS, no BOS added, ``chat_template``) into ``directory``."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    (tokenizer or tiny_tokenizer()).save(str(root / "tokenizer.json"))
    config: dict[str, Any] = {
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "add_bos_token": False,
    }
    if chat_template:
        config["chat_template"] = chat_template
    (root / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    return root
