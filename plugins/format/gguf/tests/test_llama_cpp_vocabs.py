"""Tokenizers built from llama.cpp's own vocabulary files give llama.cpp's tokens on its test
inputs, for every vocabulary family llama.cpp ships vectors for.

The vectors come from the llama-cpp-python sdist (downloaded once and cached, see
``llama_cpp_vectors``); without network and without a cached copy the tests error, saying how
to provide the sdist. llama.cpp produced them with ``add_special=false, parse_special=false``:
no BOS/EOS added, control tokens in the text not matched (``encode_special_tokens``), while
user-defined tokens still are.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from llama_cpp_vectors import Case, VectorsUnavailable, read_cases, vectors_dir, vocabularies
from tallow_format_gguf.format import GGUFFormat

#: Every vocabulary with vectors in llama-cpp-python 0.3.36's llama.cpp.
VOCABULARIES = (
    "bert-bge",
    "command-r",
    "deepseek-coder",
    "deepseek-llm",
    "falcon",
    "gemma-4",
    "gpt-2",
    "llama-bpe",
    "llama-spm",
    "mpt",
    "phi-3",
    "qwen2",
    "qwen35",
    "refact",
    "starcoder",
)
#: WordPiece normalizes text (lower case, accents stripped, whitespace dropped): its tokens do
#: not decode back to the input, in llama.cpp either.
NORMALIZING = frozenset({"bert-bge"})


@pytest.fixture(scope="session")
def vectors():
    try:
        return vectors_dir()
    except VectorsUnavailable as exc:
        reason = str(exc)
    pytest.fail(reason, pytrace=False)  # outside the except: the message alone, no chain


@dataclass
class Vocabulary:
    name: str
    tokenizer: object
    cases: list[Case]


def _tokenizer(vectors, name: str):
    checkpoint = GGUFFormat().load(str(vectors / f"ggml-vocab-{name}.gguf"))
    assert checkpoint.tokenizer is not None, checkpoint.extra.get("tokenizer_error")
    tokenizer = checkpoint.tokenizer
    tokenizer.encode_special_tokens = True  # llama.cpp's parse_special=false
    return tokenizer


@pytest.fixture(scope="module", params=VOCABULARIES)
def vocabulary(request, vectors) -> Vocabulary:
    return Vocabulary(
        request.param, _tokenizer(vectors, request.param), read_cases(vectors, request.param)
    )


def _show(tokenizer, ids: list[int]) -> str:
    return " ".join(f"{i}:{tokenizer.id_to_token(i)!r}" for i in ids)


def test_the_sdist_holds_every_vocabulary(vectors):
    assert vocabularies(vectors) == sorted(VOCABULARIES)


def test_ids_match_llama_cpp(vocabulary):
    tok = vocabulary.tokenizer
    failures = []
    for case in vocabulary.cases:
        got = tok.encode(case.text, add_special_tokens=False).ids
        if got != case.ids:
            failures.append(
                f"input {case.text!r}\n  expected {_show(tok, case.ids)}\n"
                f"  got      {_show(tok, got)}"
            )
    assert vocabulary.cases and not failures, (
        f"ggml-vocab-{vocabulary.name}: {len(failures)} of {len(vocabulary.cases)} cases differ "
        "from llama.cpp\n" + "\n".join(failures)
    )


def test_decoding_gives_the_text_back(vocabulary):
    tok = vocabulary.tokenizer
    if vocabulary.name in NORMALIZING:
        # The normalized text instead: decoding and encoding again gives the same pieces (for
        # inputs without unknown characters, which decode as [UNK]).
        unk = tok.token_to_id("[UNK]")
        cases = [case for case in vocabulary.cases if unk not in case.ids]
        assert len(cases) > len(vocabulary.cases) // 2
        wrong = [
            (case.text, tok.decode(case.ids))
            for case in cases
            if tok.encode(tok.decode(case.ids), add_special_tokens=False).ids != case.ids
        ]
        assert not wrong, (
            f"ggml-vocab-{vocabulary.name}: decoded text that encodes otherwise: "
            + "; ".join(f"{text!r} decodes to {back!r}" for text, back in wrong)
        )
        return
    wrong = [
        (case.text, tok.decode(case.ids, skip_special_tokens=False)) for case in vocabulary.cases
    ]
    wrong = [(text, back) for text, back in wrong if back != text]
    assert not wrong, f"ggml-vocab-{vocabulary.name}: " + "; ".join(
        f"{text!r} decodes to {back!r}" for text, back in wrong
    )


def test_phi3_user_tokens_swallow_the_spaces_after_them(vectors):
    # Phi-3's "</s>" is user-defined (matched whole even with parse_special=false) and, as in
    # llama.cpp, takes the whitespace after it; the text after it then gets its own "▁".
    tok = _tokenizer(vectors, "phi-3")
    end = tok.token_to_id("</s>")

    def encode(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False).ids

    assert encode("Hi</s>  \n there") == [*encode("Hi"), end, *encode("there")]
    assert encode("Hi </s>") == [*encode("Hi "), end]  # the space before it stays
