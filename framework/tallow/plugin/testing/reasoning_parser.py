"""The reasoning-parser suite: whole parse of sample responses, and streaming equal to the
whole parse when the text is split at every position (into two chunks and into single
characters) and under seeded random chunkings; text without tags stays one part, exactly.

::

    class TestMyParser(ReasoningParserConformance):
        distribution = "tallow-reasoning-mine"
        component = "mine"
        examples = [("<think>hmm</think>Paris.", "hmm", "Paris.")]

:attr:`ReasoningParserConformance.examples` are responses with the reasoning and the content
the parser must split them into; :attr:`ReasoningParserConformance.prompt_examples` add the
rendered prompt each response continues, read through ``parser.for_prompt(prompt)``.
"""

from __future__ import annotations

import random
import zlib
from typing import ClassVar

import pytest

from ..reasoning import ReasoningParser, ReasoningSplit
from .component import ComponentConformance

#: a model output, its reasoning and its content
Example = tuple[str, str, str]
#: a rendered prompt, the model output that continues it, its reasoning and its content
PromptExample = tuple[str, str, str, str]

#: responses without reasoning markup: one part, exactly (content, unless the parser's models
#: start inside the reasoning)
PLAIN_TEXTS = [
    "The weather in Paris is mild today.",
    "1 < 2 and 3 > 2; <b>bold</b>, </br>, <thinking> is not a tag here.",
    "Unicode: café, 東京, 😀",
    "  \n leading whitespace",
]


def stream_split(parser: ReasoningParser, chunks: list[str]) -> ReasoningSplit:
    """Feed ``chunks`` to a fresh stream of ``parser``; the concatenated parts it gave."""
    stream = parser.stream()
    parts = [stream.feed(chunk) for chunk in chunks] + [stream.finish()]
    for part in parts:
        assert isinstance(part, ReasoningSplit), f"expected a ReasoningSplit, got {part!r}"
    return ReasoningSplit("".join(p.reasoning for p in parts), "".join(p.content for p in parts))


class ReasoningParserConformance(ComponentConformance):
    registry_kind = "reasoning_parsers"
    base_class = ReasoningParser

    #: (response, reasoning, content) as the parser's models write them
    examples: ClassVar[list[Example]] = []
    #: True when the parser's models begin inside the reasoning block (the template opened it)
    untagged_is_reasoning: ClassVar[bool] = False
    #: seeded random chunkings per example
    chunkings: ClassVar[int] = 30
    #: (prompt, response, reasoning, content): responses read after the prompt they continue
    prompt_examples: ClassVar[list[PromptExample]] = []

    @pytest.fixture(scope="class")
    def parser(self, component_class: type[ReasoningParser]) -> ReasoningParser:
        return component_class()

    def test_has_examples(self) -> None:
        assert self.examples, "a reasoning-parser suite needs examples"

    def test_whole_parse(self, parser: ReasoningParser) -> None:
        for text, reasoning, content in self.examples:
            got = parser.parse(text)
            assert isinstance(got, ReasoningSplit)
            assert got == (reasoning, content), f"parse({text!r}) gave {got!r}"

    def test_every_split_position_streams_like_parse(self, parser: ReasoningParser) -> None:
        for text, reasoning, content in self.examples:
            for i in range(len(text) + 1):
                got = stream_split(parser, [text[:i], text[i:]])
                assert got == (reasoning, content), f"{text!r} split at {i}: {got!r}"
            got = stream_split(parser, list(text))
            assert got == (reasoning, content), f"{text!r} one character at a time: {got!r}"

    def test_random_chunkings_stream_like_parse(self, parser: ReasoningParser) -> None:
        for text, reasoning, content in self.examples:
            rng = random.Random(zlib.crc32(text.encode()))
            for _ in range(self.chunkings):
                cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, 4)))
                chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
                got = stream_split(parser, chunks)
                assert got == (reasoning, content), f"{chunks!r}: {got!r}"

    def test_for_prompt_gives_a_parser_and_leaves_this_one(self, parser: ReasoningParser) -> None:
        prompts = ["", "plain prompt\n", *(p for p, *_ in self.prompt_examples)]
        for prompt in prompts:
            reader = parser.for_prompt(prompt)
            assert isinstance(reader, ReasoningParser), f"for_prompt({prompt!r}) gave {reader!r}"
        with pytest.raises(TypeError):
            parser.for_prompt(None)  # type: ignore[arg-type]
        for text, reasoning, content in self.examples:  # the parser asked is unchanged
            assert parser.parse(text) == (reasoning, content), f"parse({text!r}) changed"

    def test_prompt_examples_whole_and_streamed(self, parser: ReasoningParser) -> None:
        for prompt, text, reasoning, content in self.prompt_examples:
            reader = parser.for_prompt(prompt)
            got = reader.parse(text)
            assert got == (reasoning, content), f"after {prompt[-40:]!r}: parse({text!r}) {got!r}"
            for i in range(len(text) + 1):
                got = stream_split(reader, [text[:i], text[i:]])
                assert got == (reasoning, content), f"{text!r} split at {i}: {got!r}"
            got = stream_split(reader, list(text))
            assert got == (reasoning, content), f"{text!r} one character at a time: {got!r}"

    def test_text_without_tags_is_one_part(self, parser: ReasoningParser) -> None:
        for text in PLAIN_TEXTS:
            want = (text, "") if self.untagged_is_reasoning else ("", text)
            assert parser.parse(text) == want, f"parse({text!r}) gave {parser.parse(text)!r}"
            assert stream_split(parser, list(text)) == want, f"streaming {text!r}"

    def test_stream_is_used_once(self, parser: ReasoningParser) -> None:
        stream = parser.stream()
        stream.feed("x")
        stream.finish()
        for again in ("feed", "finish"):
            try:
                stream.feed("y") if again == "feed" else stream.finish()
            except RuntimeError:
                continue
            raise AssertionError(f"a finished stream must refuse {again}()")
