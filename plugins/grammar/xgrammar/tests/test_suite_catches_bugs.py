"""The grammar-backend suite fails backends that break the contract: broken variants of this
backend run through it in a fresh pytest process, and the tests that must catch each bug
fail while the rest pass."""

from __future__ import annotations

from pathlib import Path

from tallow.plugin.testing import suite_failures

BROKEN = '''
import pytest
from tallow.plugin.testing import GrammarBackendConformance
from tallow_grammar_xgrammar.backend import XGrammarBackend, XGrammarMatcher


class LeakyMatcher(XGrammarMatcher):
    """Also allows the letter "z" everywhere."""

    def fill_bitmask(self, bitmask, row):
        super().fill_bitmask(bitmask, row)
        z = ord("z") - 0x20 + 2  # its id in tiny_tokenizer_info
        bitmask[row, z // 32] |= 1 << (z % 32)


class Leaky(XGrammarBackend):
    def matcher(self, compiled):
        return LeakyMatcher(self, compiled)


class NoRollback(XGrammarBackend):
    def matcher(self, compiled):
        matcher = super().matcher(compiled)
        matcher.rollback = lambda n: None
        return matcher


class EagerBatch(XGrammarBackend):
    """Its step-wide accept takes every token, even after termination."""

    def accept_tokens(self, matchers, tokens):
        return [m.inner.accept_token(t) or True for m, t in zip(matchers, tokens)]


class TestEagerBatch(GrammarBackendConformance):
    distribution = "tallow-grammar-xgrammar"
    component = "xgrammar"

    @pytest.fixture(scope="class")
    def component_class(self):
        return EagerBatch


class TestLeaky(GrammarBackendConformance):
    distribution = "tallow-grammar-xgrammar"
    component = "xgrammar"

    @pytest.fixture(scope="class")
    def component_class(self):
        return Leaky


class TestNoRollback(GrammarBackendConformance):
    distribution = "tallow-grammar-xgrammar"
    component = "xgrammar"

    @pytest.fixture(scope="class")
    def component_class(self):
        return NoRollback
'''


def test_the_suite_catches_broken_backends(tmp_path: Path) -> None:
    failed, stdout = suite_failures(BROKEN, tmp_path)
    report = stdout[-4000:]
    for test in (
        "TestLeaky::test_choice_masks_are_exact",
        "TestLeaky::test_regex_masks_are_exact",
        "TestLeaky::test_grammar_masks_are_exact",
        "TestNoRollback::test_rollback_restores_earlier_masks",
        "TestEagerBatch::test_accept_tokens_equals_each_matchers_accept",
    ):
        assert test in failed, f"{test} did not fail:\n{report}"
    # what the broken backends do right still passes
    for test in (
        "TestNoRollback::test_choice_masks_are_exact",
        "TestNoRollback::test_json_outputs_validate",
        "TestLeaky::test_refused_schemas_name_their_part",
        "TestEagerBatch::test_fill_bitmasks_equals_each_matchers_fill",
    ):
        assert test not in failed, report
