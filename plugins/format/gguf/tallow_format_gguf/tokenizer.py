"""A ``tokenizers.Tokenizer`` (plus tokenizer and generation config) from GGUF vocab metadata.

GGUF carries no ``tokenizer.json``: it stores the vocabulary as ``tokenizer.ggml.*`` keys, and
llama.cpp defines how text becomes tokens. The tokenizer built here gives llama.cpp's tokens,
with the ``tokenizers`` library doing the work; the kind of vocabulary is
``tokenizer.ggml.model``:

- ``gpt2``: byte-level BPE, text cut by the ``tokenizer.ggml.pre`` family's patterns
  (:mod:`.vocab_bpe`, :mod:`.pretokenizers`);
- ``gemma4``: SentencePiece-style BPE with a merge list (:mod:`.vocab_bpe`);
- ``llama``: SentencePiece BPE ordered by scores (:mod:`.vocab_spm`);
- ``bert``: WordPiece (:mod:`.vocab_wpm`).

``tokenizer.ggml.token_type`` marks control and unknown tokens (special: matched whole in text,
skipped when decoding with ``skip_special_tokens``) and user-defined tokens (matched whole in
text, not special). llama.cpp's ``parse_special=false`` (control tokens are not matched in text,
user-defined ones are) is ``tokenizer.encode_special_tokens = True``.
"""

from __future__ import annotations

from typing import Any

from .pretokenizers import spec_for
from .vocab import CONTROL, UNKNOWN, USER_DEFINED, TokenizerBuildError, token_list, token_types
from .vocab_bpe import byte_level_model, gemma4_model
from .vocab_spm import respell_space_runs, sentencepiece_model
from .vocab_wpm import wordpiece_model

__all__ = ["TokenizerBuildError", "build_tokenizer"]

#: Texts of control tokens that end a turn in some family; llama.cpp stops on these as well as
#: on the declared EOS, and so does tallow.
END_OF_GENERATION_TEXTS = frozenset(
    {
        "<|eot_id|>",
        "<|eom_id|>",
        "<|im_end|>",
        "<|end|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "<EOT>",
        "<|return|>",
        "<|end_of_text|>",
        "<｜end▁of▁sentence｜>",
    }
)

_BUILDERS = {
    "gpt2": byte_level_model,
    "gemma4": gemma4_model,
    "llama": sentencepiece_model,
    "bert": wordpiece_model,
}

#: Tokens that keep the space after them in Phi-3, whose other special and user-defined tokens
#: swallow it (its tokenizer.json marks them ``rstrip``; GGUF has no field for that, so llama.cpp
#: recognises the model by name, and so does tallow).
_PHI3_KEEPS_SPACE_AFTER = frozenset({"<unk>", "<s>", "<|endoftext|>"})


def _strips_space_after(metadata: dict[str, Any], text: str) -> bool:
    name = str(metadata.get("general.name", "")).lower()
    return ("phi-3" in name or "phi3" in name) and text not in _PHI3_KEEPS_SPACE_AFTER


def _add_whole_tokens(
    tok: Any, tokens: list[str], types: list[int], skip: set[int], metadata: dict[str, Any]
) -> None:
    """Control and unknown tokens as special added tokens, user-defined ones as plain added
    tokens: both are matched whole in text before the model sees it."""
    from tokenizers import AddedToken

    def added(text: str, special: bool) -> AddedToken:
        return AddedToken(
            text, special=special, normalized=False, rstrip=_strips_space_after(metadata, text)
        )

    special = [added(t, True) for t, kind in zip(tokens, types) if kind in (CONTROL, UNKNOWN)]
    if special:
        tok.add_special_tokens(special)
    user = [
        added(t, False)
        for i, (t, kind) in enumerate(zip(tokens, types))
        if kind == USER_DEFINED and i not in skip
    ]
    if user:
        tok.add_tokens(user)


def _special_ids(model: str, metadata: dict[str, Any]) -> tuple[Any, Any, bool, bool]:
    """``(bos id, eos id, add bos, add eos)`` as llama.cpp reads them for this vocabulary kind.

    BERT vocabularies wrap text in ``[CLS]`` (id 101 unless told) … ``[SEP]``
    (``tokenizer.ggml.seperator_token_id``, 102 unless told)."""
    bos_id = metadata.get("tokenizer.ggml.bos_token_id")
    eos_id = metadata.get("tokenizer.ggml.eos_token_id")
    add_bos = metadata.get("tokenizer.ggml.add_bos_token")
    add_eos = metadata.get("tokenizer.ggml.add_eos_token")
    if model == "bert":
        bos_id = bos_id if bos_id is not None else metadata.get("tokenizer.ggml.cls_token_id", 101)
        eos_id = metadata.get("tokenizer.ggml.seperator_token_id", 102)
        add_bos = True if add_bos is None else add_bos
        add_eos = metadata.get("tokenizer.ggml.add_sep_token", True)
    elif model in ("llama", "gemma4"):
        # llama.cpp adds BOS to Gemma 4 prompts even when the file says not to.
        add_bos = True if add_bos is None or model == "gemma4" else add_bos
    elif add_bos is None:
        spec = spec_for(metadata.get("tokenizer.ggml.pre"))
        add_bos = bool(spec and spec.add_bos)
    return bos_id, eos_id, bool(add_bos), bool(add_eos)


def _token_at(tokens: list[str], token_id: Any) -> str | None:
    return tokens[token_id] if isinstance(token_id, int) and 0 <= token_id < len(tokens) else None


def build_tokenizer(metadata: dict[str, Any]) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """``(tokenizers.Tokenizer, tokenizer_config, generation_config)`` from GGUF metadata.

    The tokenizer's post-processor adds BOS/EOS as ``tokenizer.ggml.add_bos_token`` /
    ``add_eos_token`` say, with llama.cpp's defaults per vocabulary kind (SentencePiece and
    Gemma 4 add BOS; BERT wraps text in ``[CLS]`` … ``[SEP]``). Raises
    :class:`TokenizerBuildError` naming the metadata key that is missing or wrong.
    """
    from tokenizers import processors

    model = metadata.get("tokenizer.ggml.model")
    builder = _BUILDERS.get(model)  # type: ignore[arg-type]
    if builder is None:
        raise TokenizerBuildError(
            f"GGUF metadata key 'tokenizer.ggml.model' is {model!r}; tallow builds tokenizers "
            f"for {', '.join(repr(k) for k in _BUILDERS)}"
        )
    tokens = token_list(metadata)
    types = token_types(metadata, len(tokens))
    respelled: set[int] = set()
    if model == "llama":
        tokens, respelled = respell_space_runs(tokens)
    tok = builder(tokens, types, metadata)
    _add_whole_tokens(tok, tokens, types, respelled, metadata)
    if tok.get_vocab_size(with_added_tokens=True) != len(tokens):
        raise TokenizerBuildError(
            f"the GGUF vocabulary has {len(tokens)} tokens but the built tokenizer has "
            f"{tok.get_vocab_size(with_added_tokens=True)}; 'tokenizer.ggml.tokens' may list a "
            "control token twice"
        )

    bos_id, eos_id, add_bos, add_eos = _special_ids(model, metadata)
    bos, eos = _token_at(tokens, bos_id), _token_at(tokens, eos_id)
    add_bos = add_bos and bos is not None
    add_eos = add_eos and eos is not None
    single = " ".join(
        [*([f"{bos}:0"] if add_bos else []), "$A:0", *([f"{eos}:0"] if add_eos else [])]
    )
    pair = (
        single
        + " "
        + " ".join([*([f"{bos}:1"] if add_bos else []), "$B:1", *([f"{eos}:1"] if add_eos else [])])
    )
    pairs = ([(bos, bos_id)] if add_bos else []) + ([(eos, eos_id)] if add_eos else [])
    tok.post_processor = processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=pairs
    )

    tokenizer_config: dict[str, Any] = {
        "bos_token": bos,
        "eos_token": eos,
        "unk_token": _token_at(tokens, metadata.get("tokenizer.ggml.unknown_token_id")),
        "pad_token": _token_at(tokens, metadata.get("tokenizer.ggml.padding_token_id")),
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "clean_up_tokenization_spaces": False,
    }
    template = metadata.get("tokenizer.chat_template")
    if isinstance(template, str) and template:
        tokenizer_config["chat_template"] = template
    # Extra templates are stored as tokenizer.chat_template.<name> (e.g. "tool_use").
    prefix = "tokenizer.chat_template."
    named = {
        key[len(prefix) :]: value
        for key, value in metadata.items()
        if key.startswith(prefix) and isinstance(value, str) and value
    }
    if named:
        tokenizer_config["named_chat_templates"] = named

    stop_ids: list[int] = []
    for key in ("eos_token_id", "eot_token_id", "eom_token_id"):
        token_id = metadata.get(f"tokenizer.ggml.{key}")
        if isinstance(token_id, int) and 0 <= token_id < len(tokens):
            stop_ids.append(token_id)
    stop_ids += [
        i
        for i, (t, kind) in enumerate(zip(tokens, types))
        if kind == CONTROL and t in END_OF_GENERATION_TEXTS
    ]
    generation_config: dict[str, Any] = {}
    if stop_ids:
        generation_config["eos_token_id"] = sorted(set(stop_ids))
    if isinstance(metadata.get("tokenizer.ggml.bos_token_id"), int):
        generation_config["bos_token_id"] = metadata["tokenizer.ggml.bos_token_id"]
    return tok, tokenizer_config, generation_config
