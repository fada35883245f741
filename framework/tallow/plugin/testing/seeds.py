"""One base seed for every test that draws random inputs.

``TALLOW_TEST_SEED`` chooses it: an integer replays a run, ``random`` draws a fresh one (to explore
inputs, e.g. before widening or trusting a tolerance). Unset, the seed is fixed, so that a test run
is reproducible: a tolerance that some inputs break is found by exploring on purpose, and a run of
the suite passes or fails on what changed in the code, not on which inputs it happened to draw.

Failures should name the seed (``seed_of`` values are printed by the helpers that use them) so that
``TALLOW_TEST_SEED=<seed>`` replays exactly the failing inputs.
"""

from __future__ import annotations

import functools
import os
import random
import zlib

#: the seed of a run without ``TALLOW_TEST_SEED``
FIXED_SEED = 1_207_2026


@functools.cache
def base_seed() -> int:
    """This process's base seed (see the module docstring); drawn once per process."""
    value = os.environ.get("TALLOW_TEST_SEED", "").strip()
    if not value:
        return FIXED_SEED
    if value.lower() == "random":
        return random.SystemRandom().randrange(2**31)
    try:
        return int(value)
    except ValueError:
        raise ValueError(
            f"TALLOW_TEST_SEED must be an integer or 'random', got {value!r}"
        ) from None


def seed_of(*parts: object) -> int:
    """A seed for one case, derived from the base seed and the case's identifying ``parts``
    (so that cases differ from each other but each replays with the base seed)."""
    return (zlib.crc32(repr(parts).encode()) ^ base_seed()) % (2**31)
