"""How BPE vocabularies split text before merging, by ``tokenizer.ggml.pre``.

A byte-level BPE vocabulary's merges were learned on pieces of text cut by a family-specific
pre-tokenizer; cutting differently changes the tokens. llama.cpp names the family in
``tokenizer.ggml.pre`` and keeps, per family, a list of regular expressions applied one after the
other: each one cuts every piece left by the previous ones into its matches and the text between
them (``pre_tokenizers.Split(..., behavior="isolated")`` in ``tokenizers``). The lists here are
llama.cpp's (``llama-vocab.cpp``), written in the form of the family's own ``tokenizer.json``
where llama.cpp notes that it rewrote a pattern only because C++ ``std::regex`` lacks a feature
(``(?i:...)``, ``\\p{Lu}``, possessive quantifiers); ``tokenizers`` runs them with Oniguruma.

Families whose splitting llama.cpp does in hand-written code rather than with a pattern
(``kimi-k2``, ``afmoe``, ``superbpe``) are not listed, and neither are the vocabularies that are
not byte-level (``gemma4``: SentencePiece-style BPE, see :mod:`tallow_format_gguf.vocab_bpe`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: GPT-2's pattern, the base of many families.
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
LLAMA3 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_UPPER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"
_LOWER = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_CASED_WORDS = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}?"
    rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTIONS}?"
)
GPT4O = _CASED_WORDS + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_CJK_RUNS = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
_DEEPSEEK3_WORDS = (
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+"
    r"|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
)
_CJK_HANGUL_RUNS = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
_BLOOM = " ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"
NEWLINE_RUNS = r"[^\n]+|[\n]+"
# Letters of the scripts DeepSeek-LLM's tokenizer groups into words (its tokenizer.json's class).
_DEEPSEEK_LLM_LETTERS = (
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-"
    "\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1"
    "\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-"
    "\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15"
    "\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d"
    "\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb"
    "\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d"
    "\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183"
    "\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b"
    "\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-"
    "\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb"
    "\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943"
)


@dataclass(frozen=True)
class PreTokenizerSpec:
    """How one family splits text: ``splits`` applied in order, each isolating its matches in
    every piece. ``ignore_merges``: a piece that is itself a token is taken whole, without
    merging (Llama 3 and others trained that way)."""

    splits: tuple[str, ...]
    ignore_merges: bool = False
    add_bos: bool | None = None  # the family's default when the file does not say


_SPECS: dict[str, PreTokenizerSpec] = {
    "default": PreTokenizerSpec((r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]")),
    "gpt2": PreTokenizerSpec((GPT2,)),
    "llama3": PreTokenizerSpec((LLAMA3,), ignore_merges=True, add_bos=True),
    "llama3-merging": PreTokenizerSpec((LLAMA3,)),
    "jais2": PreTokenizerSpec(
        (
            _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
            r"|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)"
            r"|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}",
        )
    ),
    "deepseek-llm": PreTokenizerSpec(
        (
            r"[\r\n]",
            rf"\s?[{_DEEPSEEK_LLM_LETTERS}]+",
            "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
            r"\s+\z",  # '$' in llama.cpp; newlines are already cut out, so the end of the piece
            _CJK_HANGUL_RUNS,
            r"\p{N}+",
        )
    ),
    "deepseek3": PreTokenizerSpec(
        (
            r"\p{N}{1,3}",
            _CJK_RUNS,
            _DEEPSEEK3_WORDS + r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        )
    ),
    "spark2_5": PreTokenizerSpec(
        (
            r"\p{N}{1,3}",
            _CJK_RUNS,
            _DEEPSEEK3_WORDS + r"| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+",
            r"\p{N}",
        )
    ),
    "youtu": PreTokenizerSpec(
        (
            "[\uac00-\ud7a3\u3131-\u318e]+"
            "|[\uff01\u2026\u201c\u201d\u2018\u2019\u2014\uff1a\uff1b\uff0c\u3001-\u303f\ufe30-\ufe4f]+"
            "|[\u3105-\u312f]+|" + _CJK_RUNS,
            _CASED_WORDS + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ),
        ignore_merges=True,
    ),
    "deepseek-coder": PreTokenizerSpec(
        (
            r"[\r\n]",
            r"\s?\p{L}+",
            r"\s?\p{P}+",
            _CJK_HANGUL_RUNS,
            r"\p{N}",
        )
    ),
    "falcon": PreTokenizerSpec((r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]")),
    "starcoder": PreTokenizerSpec((r"\p{N}", GPT2)),
    "qwen2": PreTokenizerSpec((QWEN2,)),
    "qwen35": PreTokenizerSpec(
        (
            _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
            r"|\s*[\r\n]+|\s+(?!\S)|\s+",
        )
    ),
    "bloom": PreTokenizerSpec((_BLOOM,)),
    "chatglm4": PreTokenizerSpec((LLAMA3,)),
    "glm4": PreTokenizerSpec((LLAMA3,), ignore_merges=True),
    "viking": PreTokenizerSpec((_BLOOM, r"\p{N}")),
    "tekken": PreTokenizerSpec(
        (
            rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
            r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ),
        ignore_merges=True,
        add_bos=True,
    ),
    "chameleon": PreTokenizerSpec(
        (
            "<sentinel:[0-9]+>",
            "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
            "([\\t\\n]|    |  )",
            r"\p{N}",
            r"[\p{P}!-/:-@\[-`{-~]",
            GPT2,
        ),
        add_bos=True,
    ),
    "gpt-4o": PreTokenizerSpec((GPT4O,)),
    "tiny-aya": PreTokenizerSpec((r"\d{1,3}(?=(?:\d{3})*\b)", GPT4O)),
    "bailingmoe": PreTokenizerSpec(
        (
            r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*"
            r"|\s*[\r\n]|\s+(?!\S)|\s+",
        )
    ),
    "seed-coder": PreTokenizerSpec(
        (
            _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+"
            r"|\s*[\r\n]+|\s+(?!\S)|\s+",
        )
    ),
    "ufakzeka": PreTokenizerSpec(
        (r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",)
    ),
    "laguna": PreTokenizerSpec((NEWLINE_RUNS, QWEN2)),
    "exaone-moe": PreTokenizerSpec(
        (
            _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
            r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+",
        )
    ),
    "minicpm5": PreTokenizerSpec(
        (
            r"\p{N}{1,3}",
            _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*"
            r"|\s*[\r\n]+|\s+(?!\S)|\s+",
        ),
        ignore_merges=True,
    ),
}

#: ``tokenizer.ggml.pre`` value → family, as llama.cpp maps them.
_PRE_NAMES: dict[str, str] = {
    "default": "default",
    **dict.fromkeys(
        (
            "llama3",
            "llama-v3",
            "llama-bpe",
            "falcon3",
            "falcon-h1",
            "pixtral",
            "midm-2.0",
            "lfm2",
            "jina-v5-nano",
        ),
        "llama3",
    ),
    **dict.fromkeys(("dbrx", "smaug-bpe"), "llama3-merging"),
    "jais-2": "jais2",
    "deepseek-llm": "deepseek-llm",
    **dict.fromkeys(("deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"), "deepseek3"),
    "spark2_5": "spark2_5",
    "youtu": "youtu",
    "deepseek-coder": "deepseek-coder",
    "falcon": "falcon",
    **dict.fromkeys(
        (
            "starcoder",
            "refact",
            "command-r",
            "smollm",
            "codeshell",
            "exaone",
            "minerva-7b",
            "mellum2",
        ),
        "starcoder",
    ),
    **dict.fromkeys(
        (
            "gpt2",
            "gpt-2",
            "phi-2",
            "jina-es",
            "jina-de",
            "gigachat",
            "jina-v2-es",
            "jina-v2-de",
            "a.x-4.0",
            "mellum",
            "modern-bert",
            "jina-v1-en",
            "jina-v2-code",
            "roberta-bpe",
            "mpt",
            "olmo",
            "jais",
            "trillion",
            "granite-docling",
            "exaone4",
        ),
        "gpt2",
    ),
    **dict.fromkeys(
        (
            "qwen2",
            "deepseek-r1-qwen",
            "kormo",
            "f2llmv2",
            "megrez",
            "stablelm2",
            "hunyuan",
            "solar-open",
            "grok-2",
        ),
        "qwen2",
    ),
    "qwen35": "qwen35",
    **dict.fromkeys(("poro-chat", "bloom", "gpt3-finnish"), "bloom"),
    "chatglm-bpe": "chatglm4",
    **dict.fromkeys(("glm4", "glm5"), "glm4"),
    "viking": "viking",
    "tekken": "tekken",
    "chameleon": "chameleon",
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), "gpt-4o"),
    **dict.fromkeys(("tiny_aya", "cohere2moe"), "tiny-aya"),
    **dict.fromkeys(("bailingmoe", "bailingmoe2", "llada-moe"), "bailingmoe"),
    "seed-coder": "seed-coder",
    "ufakzeka": "ufakzeka",
    "laguna": "laguna",
    "exaone-moe": "exaone-moe",
    "minicpm5": "minicpm5",
}

KNOWN_PRE_NAMES = frozenset(_PRE_NAMES)


def spec_for(pre: str | None) -> PreTokenizerSpec | None:
    """The split of a ``tokenizer.ggml.pre`` value (absent or empty: llama.cpp's ``default``),
    or ``None`` for a name not listed here."""
    family = _PRE_NAMES.get(pre or "default")
    return _SPECS[family] if family is not None else None


def split_sequence(splits: tuple[str, ...]) -> list[Any]:
    """``tokenizers`` pre-tokenizers applying ``splits`` one after the other."""
    from tokenizers import Regex, pre_tokenizers

    return [pre_tokenizers.Split(Regex(pattern), behavior="isolated") for pattern in splits]
