"""A ``tokenizers.Tokenizer`` (plus tokenizer and generation config) from GGUF vocab metadata.

GGUF carries no ``tokenizer.json``: it stores the vocabulary as ``tokenizer.ggml.*`` keys.

- ``tokenizer.ggml.model = "gpt2"``: byte-level BPE. Tokens are spelled in the GPT-2 byte
  alphabet and ``tokenizer.ggml.merges`` lists the merges. The text is split before BPE by a
  regular expression chosen by ``tokenizer.ggml.pre`` (the family the vocabulary was trained
  with: ``qwen2``, ``llama-bpe``, ...).
- ``tokenizer.ggml.model = "llama"``: SentencePiece BPE. Tokens use ``▁`` for spaces, unknown
  bytes fall back to ``<0xNN>`` tokens, and the merge order follows ``tokenizer.ggml.scores``
  (a higher score merges first).

``tokenizer.ggml.token_type`` marks control and unknown tokens (special: matched whole in text,
skipped when decoding with ``skip_special_tokens``) and user-defined tokens (matched whole in
text, not special).
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("tallow.gguf")

# llama.cpp token types (gguf.TokenType).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
#: Split patterns by ``tokenizer.ggml.pre``. Each is the pre-tokenization the family's merges
#: were learned with; a wrong one changes token boundaries, so unknown names fall back to GPT-2's.
_SPLIT_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_SPLIT_QWEN2 = (
    _CONTRACTIONS
    + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLIT_LLAMA3 = (
    _CONTRACTIONS
    + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_UPPER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"
_LOWER = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_SPLIT_GPT4O = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}?"
    rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTIONS}?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLIT_TEKKEN = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+"
    rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

PRE_TOKENIZER_SPLITS: dict[str, str] = {
    **dict.fromkeys(("default", "gpt2", "gpt-2"), _SPLIT_GPT2),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez", "kormo"), _SPLIT_QWEN2),
    **dict.fromkeys(("llama-bpe", "llama3", "llama-v3", "smaug-bpe", "falcon3", "falcon-h1",
                     "dbrx", "pixtral", "lfm2", "midm-2.0"), _SPLIT_LLAMA3),
    **dict.fromkeys(("gpt-4o", "llama4", "minimax-m2", "kanana2"), _SPLIT_GPT4O),
    "tekken": _SPLIT_TEKKEN,
}

#: Texts of control tokens that end a turn in some family; llama.cpp stops on these as well as
#: on the declared EOS, and so does tallow.
END_OF_GENERATION_TEXTS = frozenset({
    "<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
    "<EOT>", "<|return|>", "<|end_of_text|>", "<｜end▁of▁sentence｜>",
})


class TokenizerBuildError(ValueError):
    """The GGUF vocabulary metadata cannot be turned into a tokenizer."""


def byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible byte → printable character map.

    Printable Latin-1 bytes stand for themselves; the others (controls, space, ...) are moved to
    code points from U+0100 up, in byte order.
    """
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: chr(b) for b in keep}
    shifted = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + shifted)
            shifted += 1
    return mapping


def _token_list(metadata: dict[str, Any]) -> list[str]:
    tokens = metadata.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens:
        raise TokenizerBuildError("GGUF metadata key 'tokenizer.ggml.tokens' is missing or empty; "
                                  "expected the vocabulary as a list of strings")
    return tokens


def _token_types(metadata: dict[str, Any], n: int) -> list[int]:
    types = metadata.get("tokenizer.ggml.token_type")
    if types is None:
        return [NORMAL] * n
    if len(types) != n:
        raise TokenizerBuildError(
            f"GGUF metadata key 'tokenizer.ggml.token_type' has {len(types)} entries, expected "
            f"{n} (one per token)")
    return [int(t) for t in types]


def _unique_vocab(tokens: list[str]) -> dict[str, int]:
    """token → id; a repeated spelling (unused padding slots) gets a placeholder name so that every
    id keeps a vocabulary entry and the vocabulary keeps its size."""
    vocab: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        if tok in vocab:
            log.debug("GGUF vocab: token %d repeats %r (token %d); renamed", i, tok, vocab[tok])
            tok = f"<tallow-duplicate-{i}>"
        vocab[tok] = i
    return vocab


def _byte_level_model(tokens: list[str], types: list[int], metadata: dict[str, Any]) -> Any:
    from tokenizers import Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    alphabet = byte_alphabet()
    allowed = set(alphabet.values())
    spelled = []
    for tok, kind in zip(tokens, types):
        # Control and user-defined tokens are stored as their literal text and matched as added
        # tokens; an ordinary token outside the byte alphabet is spelled into it.
        if kind in (CONTROL, USER_DEFINED) or set(tok) <= allowed:
            spelled.append(tok)
        else:
            spelled.append("".join(alphabet[b] for b in tok.encode("utf-8")))
    merges_raw = metadata.get("tokenizer.ggml.merges")
    if not isinstance(merges_raw, list):
        raise TokenizerBuildError("GGUF metadata key 'tokenizer.ggml.merges' is missing; a 'gpt2' "
                                  "(byte-level BPE) vocabulary needs its merges")
    merges = []
    for i, line in enumerate(merges_raw):
        left, sep, right = line.partition(" ")
        if not sep or not left or not right:
            raise TokenizerBuildError(f"tokenizer.ggml.merges[{i}] = {line!r}: expected two "
                                      "tokens separated by one space")
        merges.append((left, right))
    tok = HFTokenizer(models.BPE(vocab=_unique_vocab(spelled), merges=merges,
                                 fuse_unk=False, byte_fallback=False))
    pre = metadata.get("tokenizer.ggml.pre") or "default"
    split = PRE_TOKENIZER_SPLITS.get(pre)
    if split is None:
        log.warning("GGUF tokenizer.ggml.pre %r is not known to tallow; splitting text as GPT-2 "
                    "does (known: %s)", pre, ", ".join(sorted(PRE_TOKENIZER_SPLITS)))
        split = _SPLIT_GPT2
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    return tok


def _sentencepiece_merges(tokens: list[str], types: list[int],
                          scores: list[float]) -> list[tuple[str, str]]:
    """BPE merges implied by a scored SentencePiece vocabulary: ``a b`` for every normal or
    user-defined token ``ab`` whose halves are tokens.

    SentencePiece matches user-defined pieces before anything else, so merges building them
    come first, in vocabulary order; then merges building normal pieces, by score (higher
    first). Ties fall to the vocabulary order of the result, then to the longer left part.
    """
    index = {t: i for i, t in enumerate(tokens) if types[i] in (NORMAL, USER_DEFINED, BYTE)}
    ranked: list[tuple[int, float, int, int, int, int, int, str, str]] = []
    for tok_id, tok in enumerate(tokens):
        kind = types[tok_id]
        if kind not in (NORMAL, USER_DEFINED) or len(tok) < 2:
            continue
        group = 0 if kind == USER_DEFINED else 1
        score = 0.0 if kind == USER_DEFINED else -scores[tok_id]
        for cut in range(1, len(tok)):
            left, right = tok[:cut], tok[cut:]
            if left in index and right in index:
                ranked.append((group, score, tok_id, -len(left), -len(right), index[left],
                               index[right], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def _sentencepiece_model(tokens: list[str], types: list[int], metadata: dict[str, Any]) -> Any:
    from tokenizers import decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    scores = metadata.get("tokenizer.ggml.scores")
    if not isinstance(scores, list) or len(scores) != len(tokens):
        raise TokenizerBuildError("GGUF metadata key 'tokenizer.ggml.scores' is missing or not "
                                  "one score per token; a 'llama' (SentencePiece) vocabulary "
                                  "needs it to order merges")
    merges_raw = metadata.get("tokenizer.ggml.merges")
    if isinstance(merges_raw, list):
        merges = [tuple(m.split(" ", 1)) for m in merges_raw]
    else:
        merges = _sentencepiece_merges(tokens, types, [float(s) for s in scores])
    unk_id = metadata.get("tokenizer.ggml.unknown_token_id")
    if unk_id is None and UNKNOWN in types:
        unk_id = types.index(UNKNOWN)
    unk = tokens[unk_id] if isinstance(unk_id, int) and 0 <= unk_id < len(tokens) else None
    tok = HFTokenizer(models.BPE(vocab=_unique_vocab(tokens), merges=merges,
                                 unk_token=unk, fuse_unk=True, byte_fallback=True))
    add_prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="▁", prepend_scheme="first" if add_prefix else "never", split=False)
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_prefix:
        steps.append(decoders.Strip(" ", 1, 0))
    tok.decoder = decoders.Sequence(steps)
    return tok


_BUILDERS = {"gpt2": _byte_level_model, "llama": _sentencepiece_model}


def _respell_space_runs(tokens: list[str]) -> tuple[list[str], set[int]]:
    """Write the spaces of whitespace-only SentencePiece tokens as ``▁``.

    Some converters store runs of spaces (Gemma's ``"  "`` … 31 spaces) as literal spaces. The
    pre-tokenizer turns every space of the text into ``▁``, so those tokens could never be produced;
    spelled with ``▁`` they are reached by merges, as in the model's own fast tokenizer. Returns the
    new token list and the ids that changed.
    """
    out = list(tokens)
    changed: set[int] = set()
    for i, tok in enumerate(tokens):
        if tok and " " in tok and not tok.strip():
            out[i] = tok.replace(" ", "▁")
            changed.add(i)
    return out, changed


def _token_text(tokens: list[str], metadata: dict[str, Any], key: str) -> str | None:
    token_id = metadata.get(f"tokenizer.ggml.{key}")
    if isinstance(token_id, int) and 0 <= token_id < len(tokens):
        return tokens[token_id]
    return None


def build_tokenizer(metadata: dict[str, Any]) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """``(tokenizers.Tokenizer, tokenizer_config, generation_config)`` from GGUF metadata.

    The tokenizer's post-processor adds BOS/EOS as ``tokenizer.ggml.add_bos_token`` /
    ``add_eos_token`` say (SentencePiece vocabularies add BOS unless told otherwise, as llama.cpp
    does). Raises :class:`TokenizerBuildError` naming the metadata key that is missing or wrong.
    """
    from tokenizers import AddedToken, processors

    model = metadata.get("tokenizer.ggml.model")
    builder = _BUILDERS.get(model)  # type: ignore[arg-type]
    if builder is None:
        raise TokenizerBuildError(
            f"GGUF metadata key 'tokenizer.ggml.model' is {model!r}; tallow builds tokenizers "
            f"for {', '.join(repr(k) for k in _BUILDERS)}")
    tokens = _token_list(metadata)
    types = _token_types(metadata, len(tokens))
    respelled: set[int] = set()
    if model == "llama":
        tokens, respelled = _respell_space_runs(tokens)
    tok = builder(tokens, types, metadata)

    # The unknown token is matched in text and skipped in output like a control token.
    special = [AddedToken(t, special=True, normalized=False)
               for t, kind in zip(tokens, types) if kind in (CONTROL, UNKNOWN)]
    if special:
        tok.add_special_tokens(special)
    user = [AddedToken(t, special=False, normalized=False)
            for i, (t, kind) in enumerate(zip(tokens, types))
            if kind == USER_DEFINED and i not in respelled]
    if user:
        tok.add_tokens(user)
    if tok.get_vocab_size(with_added_tokens=True) != len(tokens):
        raise TokenizerBuildError(
            f"the GGUF vocabulary has {len(tokens)} tokens but the built tokenizer has "
            f"{tok.get_vocab_size(with_added_tokens=True)}; 'tokenizer.ggml.tokens' may list a "
            "control token twice")

    default_bos = model == "llama"
    add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", default_bos))
    add_eos = bool(metadata.get("tokenizer.ggml.add_eos_token", False))
    bos = _token_text(tokens, metadata, "bos_token_id")
    eos = _token_text(tokens, metadata, "eos_token_id")
    add_bos = add_bos and bos is not None
    add_eos = add_eos and eos is not None
    single = " ".join([*([f"{bos}:0"] if add_bos else []), "$A:0",
                       *([f"{eos}:0"] if add_eos else [])])
    pair = single + " " + " ".join([*([f"{bos}:1"] if add_bos else []), "$B:1",
                                    *([f"{eos}:1"] if add_eos else [])])
    pairs = []
    if add_bos:
        pairs.append((bos, metadata["tokenizer.ggml.bos_token_id"]))
    if add_eos:
        pairs.append((eos, metadata["tokenizer.ggml.eos_token_id"]))
    tok.post_processor = processors.TemplateProcessing(single=single, pair=pair,
                                                       special_tokens=pairs)

    tokenizer_config: dict[str, Any] = {
        "bos_token": bos,
        "eos_token": eos,
        "unk_token": _token_text(tokens, metadata, "unknown_token_id"),
        "pad_token": _token_text(tokens, metadata, "padding_token_id"),
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "clean_up_tokenization_spaces": False,
    }
    template = metadata.get("tokenizer.chat_template")
    if isinstance(template, str) and template:
        tokenizer_config["chat_template"] = template
    # Extra templates are stored as tokenizer.chat_template.<name> (e.g. "tool_use").
    prefix = "tokenizer.chat_template."
    named = {key[len(prefix):]: value for key, value in metadata.items()
             if key.startswith(prefix) and isinstance(value, str) and value}
    if named:
        tokenizer_config["named_chat_templates"] = named

    stop_ids: list[int] = []
    for key in ("eos_token_id", "eot_token_id", "eom_token_id"):
        token_id = metadata.get(f"tokenizer.ggml.{key}")
        if isinstance(token_id, int) and 0 <= token_id < len(tokens):
            stop_ids.append(token_id)
    stop_ids += [i for i, (t, kind) in enumerate(zip(tokens, types))
                 if kind == CONTROL and t in END_OF_GENERATION_TEXTS]
    generation_config: dict[str, Any] = {}
    if stop_ids:
        generation_config["eos_token_id"] = sorted(set(stop_ids))
    if isinstance(metadata.get("tokenizer.ggml.bos_token_id"), int):
        generation_config["bos_token_id"] = metadata["tokenizer.ggml.bos_token_id"]
    return tok, tokenizer_config, generation_config
