"""Whether xgrammar's calls release the GIL: a probe thread makes 300 tiny sleeps (each needs
the GIL to resume, little CPU) alone and while another thread loops on one call. A call that
holds the GIL while it works stretches the probe by about its own run time per wake-up; one
that releases it barely moves it. A pure-Python loop (holds the GIL) and ``time.sleep``
(releases it) are the two references. Rows are JSON-Schema-constrained (``order.json``) on
the bench's synthetic 151,936-token vocabulary (``bench/grammar_fill_micro.py``).

    .venv/bin/python bench/grammar_gil_probe.py
"""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).parent))
from grammar_fill_micro import (  # noqa: E402
    SCHEMA,
    _walked_matchers,
    synthetic_info,
    xgrammar_backend,
)

ROWS = 187


def _probe_ms() -> float:
    start = time.perf_counter()
    for _ in range(300):
        time.sleep(0.00001)
    return 1e3 * (time.perf_counter() - start)


def _beside(work: Callable[[], object]) -> tuple[float, float]:
    """The probe's median milliseconds alone and while another thread loops on ``work``."""
    alone = statistics.median(_probe_ms() for _ in range(5))
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            work()

    thread = threading.Thread(target=loop)
    thread.start()
    time.sleep(0.02)
    beside = statistics.median(_probe_ms() for _ in range(5))
    stop.set()
    thread.join()
    return alone, beside


def main() -> None:
    import xgrammar as xgr
    from tallow.plugin import GrammarSpec

    backend = xgrammar_backend(synthetic_info(), 1)
    info = backend.tokenizer
    compiled = backend.compile(GrammarSpec.json_schema(json.loads(SCHEMA.read_text())))
    matchers = _walked_matchers(backend, compiled, ROWS, 40, seed=0)
    inner = [m.inner for m in matchers]
    host = torch.empty(ROWS, info.bitmask_words, dtype=torch.int32)
    rows = list(range(ROWS))
    batch = xgr.BatchGrammarMatcher(1)
    fresh = xgr.GrammarMatcher(compiled.grammar)
    fresh.fill_next_token_bitmask(host, 0)
    bits = ((host[0].unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1).flatten()
    token = int(bits.nonzero()[0])  # a token the schema allows first

    def accept_and_undo() -> None:
        for _ in range(ROWS):
            fresh.accept_token(token)
            fresh.rollback(1)

    cases = {
        "pure-Python loop (holds the GIL)": lambda: sum(range(20000)),
        "time.sleep 5 ms (releases the GIL)": lambda: time.sleep(0.005),
        f"BatchGrammarMatcher.batch_fill_next_token_bitmask, {ROWS} rows": lambda: (
            batch.batch_fill_next_token_bitmask(inner, host, rows)
        ),
        f"XGrammarBackend.fill_bitmasks, {ROWS} rows": lambda: backend.fill_bitmasks(
            matchers, host, rows
        ),
        f"GrammarMatcher.accept_token + rollback, {ROWS} each": accept_and_undo,
    }
    for name, work in cases.items():
        alone, beside = _beside(work)
        print(f"{name}: probe {alone:.1f} ms alone, {beside:.1f} ms beside it")


if __name__ == "__main__":
    main()
