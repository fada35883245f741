"""The one base seed of seeded tests: fixed by default, replayable, explorable."""

from __future__ import annotations

import pytest

from tallow.plugin.testing import seeds


@pytest.fixture(autouse=True)
def _fresh_cache():
    seeds.base_seed.cache_clear()
    yield
    seeds.base_seed.cache_clear()


def test_unset_is_the_fixed_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TALLOW_TEST_SEED", raising=False)
    assert seeds.base_seed() == seeds.FIXED_SEED


def test_an_integer_replays_and_cases_differ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TALLOW_TEST_SEED", "12345")
    assert seeds.base_seed() == 12345
    assert seeds.seed_of("decode", 1) == seeds.seed_of("decode", 1)
    assert seeds.seed_of("decode", 1) != seeds.seed_of("decode", 2)


def test_random_draws_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TALLOW_TEST_SEED", "random")
    first = seeds.base_seed()
    assert seeds.base_seed() == first and 0 <= first < 2**31


def test_bad_value_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TALLOW_TEST_SEED", "twelve")
    with pytest.raises(ValueError, match="TALLOW_TEST_SEED must be an integer or 'random'"):
        seeds.base_seed()
